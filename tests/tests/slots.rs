//! Decode slots: K sequences stepped in one forward pass give, row for row, bitwise the
//! logits each sequence gives alone (and so the same greedy tokens), whatever else shares
//! the step: 1, 3 and 16 slots, different prompt lengths and positions, sequences joining
//! and leaving at different steps. Also mixed passes (joining sequences' prompts fed in
//! chunks of 1 to 6 tokens through the decode steps, two at a time, `Slots::step_mixed`)
//! and the matmul kernels' batch invariance on its own. The same with lanes (the
//! sequences of a pass in groups, each run by its own one-thread replica side by side).

use pn_engine::sampler::argmax;
use pn_engine::{Geometry, Runner, SeqState, SlotHandle, Slots};
use pn_tests::*;

/// Deterministic pseudo-random token ids below `vocab`.
pub fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// A sequence decoded alone: the prefill's last logits, then one row per decode step,
/// greedy.
struct Alone {
    rows: Vec<Vec<f32>>,
    toks: Vec<u32>,
}

fn alone(r: &Runner, prompt: &[u32], steps: usize) -> Alone {
    let mut st = r.new_state(256);
    let mut row = r.forward(&mut st, prompt, false).unwrap().last().to_vec();
    let (mut rows, mut toks) = (vec![row.clone()], vec![]);
    for _ in 0..steps {
        let t = argmax(&row) as u32;
        toks.push(t);
        row = r.forward(&mut st, &[t], false).unwrap().last().to_vec();
        rows.push(row.clone());
    }
    Alone { rows, toks }
}

/// Sequence i: a prompt of its own length, joining at step `join[i]` and decoding
/// `steps[i]` tokens; all go through one slot table of `n_slots`, stepped together.
/// `chunk`: a joining sequence's prompt is fed `chunk` tokens at a time inside the
/// decode steps (mixed passes, one filling sequence at a time), else prefilled alone.
fn check_slots(model: &str, n_slots: usize, n_seq: usize) {
    check_slots_chunked(model, n_slots, n_seq, None)
}

fn check_slots_chunked(model: &str, n_slots: usize, n_seq: usize, chunk: Option<usize>) {
    check_slots_on(&runner(model, 2), model, n_slots, n_seq, chunk)
}

fn check_slots_on(r: &Runner, model: &str, n_slots: usize, n_seq: usize, chunk: Option<usize>) {
    let vocab = r.model().n_vocab();
    let prompts: Vec<Vec<u32>> = (0..n_seq).map(|i| tokens(i as u64 + 7, 1 + (i * 5) % 13, vocab)).collect();
    let steps: Vec<usize> = (0..n_seq).map(|i| 3 + (i * 3) % 7).collect();
    let join: Vec<usize> = (0..n_seq).map(|i| if n_seq > 1 { i % 3 } else { 0 }).collect();
    let want: Vec<Alone> = prompts.iter().zip(&steps).map(|(p, &s)| alone(r, p, s)).collect();

    let mut slots = Slots::new(n_slots);
    // per sequence: handle, next token, rows seen, greedy tokens
    let mut live: Vec<Option<(SlotHandle, u32, usize)>> = vec![None; n_seq];
    let mut got_toks: Vec<Vec<u32>> = vec![vec![]; n_seq];
    let mut done = vec![false; n_seq];
    // sequences being prefilled in chunks inside the steps: (index, state, tokens fed)
    let mut filling: Vec<(usize, SeqState, usize)> = Vec::new();
    let mut filled = vec![false; n_seq];
    let mut step = 0;
    while done.iter().any(|d| !d) {
        for i in 0..n_seq {
            let room = slots.n_bound() + filling.len() < n_slots;
            let joining = live[i].is_none() && !done[i] && join[i] <= step && room;
            // up to two sequences fill at once, in chunks of c and c + 1 tokens
            if joining && chunk.is_some() && filling.len() < 2 && !filled[i] {
                filled[i] = true;
                filling.push((i, r.new_state(256), 0));
            } else if joining && chunk.is_none() {
                let mut st = r.new_state(256);
                let row = r.forward(&mut st, &prompts[i], false).unwrap().last().to_vec();
                assert_eq!(row, want[i].rows[0], "seq {i}: prefill");
                let t = argmax(&row) as u32;
                got_toks[i].push(t);
                live[i] = Some((slots.bind(st).unwrap(), t, 1));
            }
        }
        let batch: Vec<(usize, SlotHandle, u32)> = (0..n_seq).filter_map(|i| live[i].map(|(h, t, _)| (i, h, t))).collect();
        let pairs: Vec<(SlotHandle, u32)> = batch.iter().map(|&(_, h, t)| (h, t)).collect();
        let mut logits = None;
        if let (false, Some(c)) = (filling.is_empty(), chunk) {
            let ends: Vec<usize> = filling.iter().enumerate().map(|(j, &(i, _, p))| (p + c + j).min(prompts[i].len())).collect();
            let mut chunks: Vec<(&mut SeqState, &[u32])> =
                filling.iter_mut().zip(&ends).map(|((i, st, p), &e)| (st, &prompts[*i][*p..e])).collect();
            let l = slots.step_mixed(r, &pairs, &mut chunks).unwrap();
            assert_eq!(l.rows(), batch.len() + filling.len(), "a row per decode token and per chunk");
            let mut row_end = batch.len();
            for (f, &e) in filling.iter_mut().zip(&ends) {
                row_end += 1;
                f.2 = e;
                if e == prompts[f.0].len() {
                    let row = l.row(row_end - 1);
                    assert!(row == &want[f.0].rows[0][..], "{model}: seq {}: prefill in chunks of {c}.. inside {} decode steps differs", f.0, batch.len());
                }
            }
            assert_eq!(l.rows(), row_end);
            for (i, st, p) in std::mem::take(&mut filling) {
                if p < prompts[i].len() {
                    filling.push((i, st, p));
                    continue;
                }
                let t = argmax(&want[i].rows[0]) as u32;
                got_toks[i].push(t);
                live[i] = Some((slots.bind(st).unwrap(), t, 1));
            }
            logits = Some(l);
        } else if !batch.is_empty() {
            logits = Some(slots.step(r, &pairs).unwrap());
        }
        if let Some(logits) = logits {
            for (row_i, &(i, h, _)) in batch.iter().enumerate() {
                let (_, _, seen) = live[i].unwrap();
                let row = logits.row(row_i);
                assert!(row == &want[i].rows[seen][..], "{model}, {n_slots} slots: seq {i} step {seen} differs from running alone (batch of {})", batch.len());
                if seen == steps[i] {
                    let st = slots.unbind(h).unwrap();
                    assert_eq!(st.pos, prompts[i].len() + steps[i]);
                    live[i] = None;
                    done[i] = true;
                } else {
                    let t = argmax(row) as u32;
                    got_toks[i].push(t);
                    live[i] = Some((h, t, seen + 1));
                }
            }
        }
        step += 1;
        assert!(step < 200, "scheduling did not finish");
    }
    for i in 0..n_seq {
        assert_eq!(got_toks[i], want[i].toks, "seq {i}: greedy tokens");
    }
}

#[test]
fn one_slot_equals_alone() {
    check_slots("tiny-f16.gguf", 1, 3);
}

#[test]
fn three_slots_equal_alone() {
    check_slots("tiny-f16.gguf", 3, 7);
    check_slots("ktiny-q4_k_m.gguf", 3, 5);
}

#[test]
fn sixteen_slots_equal_alone() {
    check_slots("ktiny-q4_k_m.gguf", 16, 20);
}

#[test]
fn mixed_passes_equal_alone() {
    for c in [1, 3, 5] {
        check_slots_chunked("ktiny-q4_k_m.gguf", 4, 7, Some(c));
    }
    check_slots_chunked("tiny-f16.gguf", 3, 5, Some(2));
}

/// Lanes: 2 and 3 replicas stepping groups of the slots side by side (decode steps and
/// mixed passes) give every row bitwise as alone; so do lanes of a single-sequence
/// runner (one thread: the caller's).
#[test]
fn lanes_equal_alone() {
    for (threads, lanes) in [(2, 2), (2, 3), (1, 2)] {
        let r = runner_with_lanes("ktiny-q4_k_m.gguf", threads, lanes);
        assert_eq!(r.lanes(), lanes);
        check_slots_on(&r, "ktiny-q4_k_m.gguf", 16, 20, None);
        check_slots_on(&r, "ktiny-q4_k_m.gguf", 4, 7, Some(3));
    }
    check_slots_on(&runner_with_lanes("tiny-f16.gguf", 2, 2), "tiny-f16.gguf", 3, 5, Some(2));
}

/// Compiled geometries bounded to two (engine/src/runner/bounded.rs; with two lanes, one
/// on each lane): passes recompile
/// what was dropped, the rows stay bitwise as alone and as a runner that keeps every
/// geometry computes them, and the cache never holds more than its cap.
#[test]
fn bounded_geometry_cache_gives_the_same_rows() {
    const M: &str = "ktiny-q4_k_m.gguf";
    let full = runner(M, 2);
    let vocab = full.model().n_vocab();
    for r in [runner(M, 2), runner_with_lanes(M, 2, 2)] {
        r.set_max_geometries(2);
        check_slots_on(&r, M, 4, 7, Some(3));
        for n in 1..=9 {
            let p = tokens(n as u64 + 40, n, vocab);
            assert!(alone(&r, &p, 2).rows == alone(&full, &p, 2).rows, "{n}-token prompt, {} lanes", r.lanes());
        }
        let (cap, evicted) = r.geometry_cache();
        assert!(cap == 2 && r.geometries().len() <= cap, "cap {cap}, held {:?}", r.geometries());
        assert!(evicted >= 10, "only {evicted} geometries dropped");
    }
}

#[test]
fn slots_equal_alone_for_llama_qwen3_qwen2() {
    for m in ["llama-tiny-f32.gguf", "llama-spm-tiny-f16.gguf", "qwen3-ktiny-q4_k_m.gguf", "qwen2-tiny-f32.gguf"] {
        check_slots(m, 4, 6);
    }
}

/// The built-in model, 16 slots, one pass and two lanes: every row as alone.
#[test]
fn sixteen_slots_default_model() {
    const DEFAULT: &str = "../../models/default/pn-default-code-q4_k_m.gguf";
    let r = runner(DEFAULT, 2);
    let vocab = r.model().n_vocab();
    let prompts: Vec<Vec<u32>> = (0..16).map(|i| tokens(100 + i, 2 + i as usize % 6, vocab)).collect();
    let want: Vec<Alone> = prompts.iter().map(|p| alone(&r, p, 3)).collect();
    for r in [r, runner_with_lanes(DEFAULT, 2, 2)] {
        let mut slots = Slots::new(16);
        let mut cur: Vec<(SlotHandle, u32)> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut st = r.new_state(64);
                r.forward(&mut st, p, false).unwrap();
                (slots.bind(st).unwrap(), want[i].toks[0])
            })
            .collect();
        for s in 1..=3 {
            let l = slots.step(&r, &cur).unwrap();
            for (i, c) in cur.iter_mut().enumerate() {
                assert!(l.row(i) == &want[i].rows[s][..], "default model, {} lanes: seq {i} step {s}", r.lanes());
                c.1 = argmax(l.row(i)) as u32;
            }
        }
    }
}

/// A multi-token batch of several sequences (forward_multi) equals each alone, too.
#[test]
fn forward_multi_rows_equal_alone() {
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let v = r.model().n_vocab();
    let (a, b) = (tokens(1, 9, v), tokens(2, 4, v));
    let mut s1 = r.new_state(64);
    let mut s2 = r.new_state(64);
    let l = r.forward_multi(&mut [(&mut s1, &a[..]), (&mut s2, &b[..])]).unwrap();
    let ra = r.forward(&mut r.new_state(64), &a, true).unwrap();
    let rb = r.forward(&mut r.new_state(64), &b, true).unwrap();
    assert_eq!(l.rows(), 13);
    assert_eq!(&l.data[..ra.data.len()], &ra.data[..]);
    assert_eq!(&l.data[ra.data.len()..], &rb.data[..]);
    assert_eq!((s1.pos, s2.pos), (9, 4));
}

/// `forward_multi_last`: one row per sequence, bitwise the last row of each in
/// `forward_multi` (the head runs for those rows only: `LastRows`), for mixes of
/// lengths including one-token sequences beside prompts, on 1 and 2 threads.
#[test]
fn forward_multi_last_rows_are_the_last_rows() {
    for (threads, lanes) in [(1, 0), (2, 0), (2, 2)] {
        let r = if lanes > 0 { runner_with_lanes("ktiny-q4_k_m.gguf", threads, lanes) } else { runner("ktiny-q4_k_m.gguf", threads) };
        let v = r.model().n_vocab();
        for lens in [&[9, 4][..], &[1, 7, 1, 3], &[5, 1], &[2, 2, 2]] {
            let toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| tokens(10 + i as u64, n, v)).collect();
            let run = |last: bool| {
                let mut sts: Vec<SeqState> = lens.iter().map(|_| r.new_state(64)).collect();
                let mut pass: Vec<(&mut SeqState, &[u32])> = sts.iter_mut().zip(&toks).map(|(s, t)| (s, &t[..])).collect();
                let l = if last { r.forward_multi_last(&mut pass) } else { r.forward_multi(&mut pass) }.unwrap();
                drop(pass);
                (l, sts.iter().map(|s| s.pos).collect::<Vec<_>>())
            };
            let (all, pos_all) = run(false);
            let (last, pos_last) = run(true);
            assert_eq!(last.rows(), lens.len(), "{lens:?}");
            assert_eq!(pos_all, pos_last);
            let mut end = 0;
            for (i, &n) in lens.iter().enumerate() {
                end += n;
                assert!(last.row(i) == all.row(end - 1), "{lens:?}, {threads} threads, {lanes} lanes: sequence {i}'s last row differs");
            }
        }
    }
}

fn view<'a>(g: &'a pn_engine::Gguf, name: &str) -> pn_ops::WeightView<'a> {
    let info = g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name}"));
    pn_ops::WeightView {
        name: &info.name,
        ty: info.ty,
        shape: pn_ops::Shape([info.ne[0] as usize, info.ne[1] as usize, info.ne[2] as usize, info.ne[3] as usize]),
        bytes: g.tensor_bytes(info),
        rows16: None,
    }
}

fn act(seed: u64, k: usize, t: usize) -> pn_ops::Tensor {
    let x: Vec<f32> = tokens(seed, k * t, 2001).into_iter().map(|v| v as f32 / 1000.0 - 1.0).collect();
    pn_ops::Tensor::f32(pn_ops::Shape::d2(k, t), x)
}

/// The kernels in isolation (CPU backend): the result for one token is bitwise the same
/// alone and at every place in batches of 2..=20 — MatMul for every weight type of the
/// fixtures, and MoeExperts (tokens grouped by expert across the batch).
#[test]
fn kernels_are_batch_invariant() {
    use pn_engine::HostKernels;
    use pn_ops::{Op, TensorMeta, Value};
    let be = pn_cpu::CpuBackend::new(2);
    for model in ["ktiny-q4_k_m.gguf", "tiny-f16.gguf", "tiny-q8_0.gguf"] {
        let g = pn_engine::Gguf::open(&fixture(model)).unwrap();
        let mats: Vec<String> = g.tensors.iter().filter(|t| t.ne[1] > 1 && t.ne[2] == 1 && t.name.starts_with("blk.0.")).map(|t| t.name.clone()).collect();
        for name in &mats {
            let w = view(&g, name);
            let (k, n) = (w.shape.0[0], w.shape.0[1]);
            let mm = |x: &pn_ops::Tensor| {
                let t = x.shape.0[1];
                be.execute(&Op::MatMul, &[Value::Weight(w), Value::Act(x)], &TensorMeta::f32(pn_ops::Shape::d2(n, t)), None).unwrap()
            };
            for t in [2, 5, 16, 20] {
                let x = act(t as u64, k, t);
                let y = mm(&x);
                for j in [0, t / 2, t - 1] {
                    let xj = pn_ops::Tensor::f32(pn_ops::Shape::d2(k, 1), x.as_f32()[j * k..(j + 1) * k].to_vec());
                    assert!(mm(&xj).as_f32() == &y.as_f32()[j * n..(j + 1) * n], "{model} {name}: token {j} of {t}");
                }
            }
        }
        let Some(gate) = g.tensors.iter().find(|t| t.name == "blk.0.ffn_gate_exps.weight") else { continue };
        let (kd, e) = (gate.ne[0] as usize, gate.ne[2] as usize);
        let ws = [view(&g, "blk.0.ffn_gate_exps.weight"), view(&g, "blk.0.ffn_up_exps.weight"), view(&g, "blk.0.ffn_down_exps.weight")];
        let top = 2.min(e);
        let moe = |x: &pn_ops::Tensor, ids: &pn_ops::Tensor, wt: &pn_ops::Tensor| {
            let ins = [Value::Act(x), Value::Act(ids), Value::Act(wt), Value::Weight(ws[0]), Value::Weight(ws[1]), Value::Weight(ws[2])];
            be.execute(&Op::MoeExperts { merged_gate_up: false }, &ins, &TensorMeta::f32(x.shape), None).unwrap()
        };
        for t in [2, 7, 20] {
            let x = act(50 + t as u64, kd, t);
            let ids: Vec<i32> = (0..t).flat_map(|j| [(j % e) as i32, ((j * 7 + 1) % e) as i32]).take(top * t).collect();
            let ids: Vec<i32> = ids.chunks(top).flat_map(|c| if top == 2 && c[0] == c[1] { vec![c[0], (c[0] + 1) % e as i32] } else { c.to_vec() }).collect();
            let wt: Vec<f32> = (0..top * t).map(|i| 0.25 + (i % 3) as f32 * 0.2).collect();
            let y = moe(&x, &pn_ops::Tensor::i32(pn_ops::Shape::d2(top, t), ids.clone()), &pn_ops::Tensor::f32(pn_ops::Shape::d2(top, t), wt.clone()));
            for j in 0..t {
                let xj = pn_ops::Tensor::f32(pn_ops::Shape::d2(kd, 1), x.as_f32()[j * kd..(j + 1) * kd].to_vec());
                let idj = pn_ops::Tensor::i32(pn_ops::Shape::d2(top, 1), ids[j * top..(j + 1) * top].to_vec());
                let wj = pn_ops::Tensor::f32(pn_ops::Shape::d2(top, 1), wt[j * top..(j + 1) * top].to_vec());
                assert!(moe(&xj, &idj, &wj).as_f32() == &y.as_f32()[j * kd..(j + 1) * kd], "{model} MoE: token {j} of {t}");
            }
        }
    }
}

/// A pass is compiled for its token count and its number of sequences (the shape of its
/// sequence table), not for how the tokens split among them: 2 + 4 and 4 + 2 tokens share
/// one geometry, a decode step of 3 slots is {3 tokens, 3 sequences}.
#[test]
fn geometry_is_keyed_by_the_sequence_table_shape() {
    let r = runner("ktiny-q4_k_m.gguf", 1);
    let v = r.model().n_vocab();
    let before = r.geometries();
    for lens in [&[2, 4][..], &[4, 2], &[1, 1, 1], &[6]] {
        let toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| tokens(i as u64, n, v)).collect();
        let mut sts: Vec<SeqState> = lens.iter().map(|_| r.new_state(32)).collect();
        let mut pass: Vec<(&mut SeqState, &[u32])> = sts.iter_mut().zip(&toks).map(|(s, t)| (s, &t[..])).collect();
        assert_eq!(r.forward_multi(&mut pass).unwrap().rows(), 6.min(lens.iter().sum()));
    }
    let mut want = vec![Geometry::of(&[1, 1, 1], true), Geometry::one(6, true), Geometry::of(&[2, 4], true), Geometry::one(r.ubatch, true)];
    want.sort();
    let new: Vec<Geometry> = r.geometries().into_iter().filter(|g| !before.contains(g)).collect();
    assert_eq!(new, want);
    assert_eq!(Geometry::of(&[4, 2], true), Geometry { n_tokens: 6, seqs: 2, all_logits: true });
    assert!(Geometry::of(&[1, 1, 1], true).is_decode() && !Geometry::of(&[1, 2], true).is_decode());
}

#[test]
fn states_round_trip_through_slots() {
    let r = runner("tiny-f16.gguf", 2);
    let mut slots = Slots::new(2);
    let mut st: SeqState = r.new_state(32);
    r.forward(&mut st, &[1, 2, 3], false).unwrap();
    let copy = st.clone();
    let h = slots.bind(st).unwrap();
    assert_eq!(slots.state(h).unwrap(), &copy);
    assert_eq!(slots.unbind(h).unwrap(), copy);
}
