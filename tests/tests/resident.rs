//! The resident protocol (crate::backend, docs/cuda.md) with `ResidentMock`, a resident
//! backend over the CPU backend that keeps slots and layer states in its own storage,
//! counts every host ↔ device copy and poisons (NaN) the host copy of state it owns:
//! logits are bitwise the CPU's (prefill with ubatch splits, decode, all logits, two-die
//! splits in every combination), a decode step moves exactly the graph inputs up and the
//! logits down (the boundary hidden state across a split), backend errors are
//! `RunError`s naming the node or slot, and `PN_DEBUG=1` reports the copies per step.
//! Sequence-state paths (slots, snapshots, prefix cache, async): resident_state.rs.

use pn_engine::testing::{Fail, MockCounts, ResidentMock};
use pn_engine::planner::debug::Counters;
use pn_engine::{Geometry, RunError, Runner, SeqState};
use pn_ops::{KvCache, LayerState, Op, OpError, RecurrentState};
use pn_tests::resident::*;

const DECODE: Geometry = Geometry::one(1, false);

fn prompt(r: &Runner, seed: u32, n: usize) -> Vec<u32> {
    let v = r.model().n_vocab() as u32 - 1;
    (0..n as u32).map(|i| (seed * 131 + i * 17) % v + 1).collect()
}

/// Every prompt position's logits (in `ubatch` passes), then `n` greedy decode steps.
fn trace(r: &Runner, st: &mut SeqState, p: &[u32], n: usize) -> Vec<Vec<f32>> {
    let first = r.forward(st, p, true).unwrap();
    let mut next = pn_engine::sampler::argmax(first.last()) as u32;
    let mut out = vec![first.data];
    for _ in 0..n {
        let l = r.forward(st, &[next], false).unwrap();
        next = pn_engine::sampler::argmax(l.last()) as u32;
        out.push(l.data);
    }
    out
}

/// `b - a` of the runner's host ↔ device counters.
fn delta(a: Counters, b: Counters) -> [u64; 9] {
    [
        b.uploads - a.uploads,
        b.upload_bytes - a.upload_bytes,
        b.downloads - a.downloads,
        b.download_bytes - a.download_bytes,
        b.device_copies - a.device_copies,
        b.device_copy_bytes - a.device_copy_bytes,
        b.state_uploads - a.state_uploads,
        b.state_downloads - a.state_downloads,
        b.state_bytes - a.state_bytes,
    ]
}

/// The mock's counts over one call of `f`.
fn counted<T>(m: &ResidentMock, f: impl FnOnce() -> T) -> (T, MockCounts) {
    m.reset_counts();
    let t = f();
    (t, m.counts())
}

#[test]
fn logits_are_bitwise_the_cpu_ones() {
    for name in MODELS {
        // ubatch 7: the 20-token prompt runs as 7 + 7 + 6
        let (cpu, _) = single(name, false, 7);
        let (res, mock) = single(name, true, 7);
        let mock = mock.unwrap();
        let p = prompt(&cpu, 1, 20);
        let (mut a, mut b) = (cpu.new_state(64), res.new_state(64));
        let want = trace(&cpu, &mut a, &p, 4);
        let got = trace(&res, &mut b, &p, 4);
        assert!(got == want, "{name}: all logits + decode differ from the CPU");
        let last = |r: &Runner| r.forward(&mut r.new_state(64), &p, false).unwrap();
        assert!(last(&res) == last(&cpu), "{name}: last-token logits differ");
        // the mock owns the layer states; its copies equal the CPU's, and they come home
        assert!(b.is_resident() && b.owner(0).is_some_and(|o| o.starts_with("mock")));
        assert!(a == b, "{name}: the mock's layer states differ from the CPU's");
        assert!(b.layers().unwrap() == a.layers().unwrap());
        assert!(!b.is_resident());
        let k = mock.counts();
        assert_eq!(k.moved_buffers, 0, "{name}: slot buffers moved: {k:?}");
        assert!(k.executes > 0 && k.segments > 0 && k.replays > 0, "{k:?}");
        drop((a, b));
        assert_eq!(mock.held_states(), 0, "{name}: dropped states released their copies");
    }
}

#[test]
fn a_decode_step_uploads_the_inputs_and_downloads_the_logits() {
    for name in MODELS {
        let (r, mock) = single(name, true, 512);
        let mock = mock.unwrap();
        let n_vocab = r.model().n_vocab() as u64;
        let n_states = r.plan(DECODE).unwrap().state_die.iter().flatten().count() as u64;
        let mut st = r.new_state(64);
        let p = prompt(&r, 2, 9);
        // prefill, all logits: tokens + positions up, logits down, every state up once
        let c0 = r.counters();
        let (_, k) = counted(&mock, || r.forward(&mut st, &p, true).unwrap());
        assert_eq!((k.uploads, k.upload_bytes), (2, 2 * 4 * 9), "{name}: {k:?}");
        assert_eq!((k.downloads, k.download_bytes), (1, 9 * 4 * n_vocab), "{name}: {k:?}");
        assert_eq!((k.state_uploads, k.state_downloads), (n_states, 0), "{name}: {k:?}");
        let d = delta(c0, r.counters());
        assert_eq!(d[..4], [2, 72, 1, 36 * n_vocab], "{name}: runner counters {d:?}");
        assert_eq!((d[6], d[7]), (n_states, 0));
        for t in 0..4 {
            let c0 = r.counters();
            let (_, k) = counted(&mock, || r.forward(&mut st, &[t + 3], false).unwrap());
            let want = MockCounts {
                uploads: 2,
                upload_bytes: 8,
                downloads: 1,
                download_bytes: 4 * n_vocab,
                executes: k.executes,
                segments: 1,
                replays: u64::from(t > 0),
                ..MockCounts::default()
            };
            assert_eq!(k, want, "{name}: decode step {t}");
            assert_eq!(delta(c0, r.counters()), [2, 8, 1, 4 * n_vocab, 0, 0, 0, 0, 0], "{name}: step {t}");
            if t == 0 {
                eprintln!(
                    "{name}: decode step: {} uploads ({} B), {} download ({} B), {} ops on the mock",
                    k.uploads, k.upload_bytes, k.downloads, k.download_bytes, k.executes
                );
            }
        }
    }
}

#[test]
fn a_split_moves_only_the_boundary_hidden_state() {
    for name in MODELS {
        let (cpu, _) = single(name, false, 512);
        let n_vocab = cpu.model().n_vocab() as u64;
        let split_at = cpu.model().n_layer() / 2;
        let p = prompt(&cpu, 3, 12);
        let want = trace(&cpu, &mut cpu.new_state(64), &p, 3);
        for mocks in [[true, false], [false, true], [true, true]] {
            let (r, m) = split(name, split_at, mocks);
            let mut st = r.new_state(64);
            assert!(trace(&r, &mut st, &p, 3) == want, "{name} {mocks:?}: logits differ from one CPU die");
            let plan = r.plan(DECODE).unwrap();
            let g = r.graph(DECODE).unwrap();
            assert_eq!(plan.transfers.len(), 1);
            let hidden = 4 * g.node(plan.transfers[0].value).out.shape.numel() as u64;
            m.iter().flatten().for_each(|m| m.reset_counts());
            let c0 = r.counters();
            r.forward(&mut st, &[5], false).unwrap();
            let d = delta(c0, r.counters());
            let k: Vec<MockCounts> = m.iter().map(|m| m.as_ref().map(|m| m.counts()).unwrap_or_default()).collect();
            let ud = |k: &MockCounts| [k.uploads, k.upload_bytes, k.downloads, k.download_bytes, k.device_copies, k.device_copy_bytes];
            // graph inputs each die fills (tokens on A; positions where attention layers are)
            let n_in = |d: usize| plan.segments.iter().filter(|s| s.die == d).map(|s| s.inputs.len() as u64).sum::<u64>();
            let (ia, ib) = (n_in(0), n_in(1));
            let (runner_want, a_want, b_want) = match mocks {
                // A: its inputs up, the hidden state down; B (CPU) computes the logits
                [true, false] => ([ia, 4 * ia, 1, hidden, 0, 0], [ia, 4 * ia, 1, hidden, 0, 0], [0; 6]),
                // A (CPU); B: its inputs and the hidden state up, the logits down
                [false, true] => {
                    let b = [ib + 1, 4 * ib + hidden, 1, 4 * n_vocab, 0, 0];
                    (b, [0; 6], b)
                }
                // A: its inputs up; B: its inputs up, the hidden state die-to-die, logits down
                _ => (
                    [ia + ib, 4 * (ia + ib), 1, 4 * n_vocab, 1, hidden],
                    [ia, 4 * ia, 0, 0, 0, 0],
                    [ib, 4 * ib, 1, 4 * n_vocab, 1, hidden],
                ),
            };
            let names: Vec<Vec<&str>> = plan.segments.iter().map(|s| s.inputs.iter().map(|&i| g.node(i).name.as_str()).collect()).collect();
            // tokens on A, positions on each die with attention layers
            assert!((1..=2).contains(&ia) && ib <= 1, "{name}: inputs per die {names:?}");
            assert_eq!(d[..6], runner_want, "{name} {mocks:?}: runner counters; inputs {names:?}");
            assert_eq!(d[6..], [0, 0, 0], "{name} {mocks:?}: no state moves in a decode step");
            assert_eq!(ud(&k[0]), a_want, "{name} {mocks:?}: die A");
            assert_eq!(ud(&k[1]), b_want, "{name} {mocks:?}: die B");
            if mocks == [true, false] {
                // die A's layers live on the mock, die B's on the host
                assert!(st.owner(0).is_some() && st.owner(st.n_layers() - 1).is_none());
            }
        }
    }
}

#[test]
fn a_state_follows_its_runner() {
    // prefill on a resident runner, decode on a CPU runner (the state comes home), then
    // on another resident runner: the logits are those of the CPU alone
    let name = "ktiny-q4_k_m.gguf";
    let (cpu, _) = single(name, false, 512);
    let (r1, m1) = single(name, true, 512);
    let (r2, m2) = single(name, true, 512);
    let (m1, m2) = (m1.unwrap(), m2.unwrap());
    let p = prompt(&cpu, 4, 10);
    let mut a = cpu.new_state(64);
    let mut want = vec![cpu.forward(&mut a, &p, false).unwrap()];
    for t in 1..5 {
        want.push(cpu.forward(&mut a, &[t], false).unwrap());
    }
    let mut st = r1.new_state(64);
    let mut got = vec![r1.forward(&mut st, &p, false).unwrap()];
    got.push(r1.forward(&mut st, &[1], false).unwrap());
    got.push(cpu.forward(&mut st, &[2], false).unwrap());
    assert!(!st.is_resident() && m1.held_states() == 0, "brought home by the CPU runner");
    got.push(r2.forward(&mut st, &[3], false).unwrap());
    got.push(r1.forward(&mut st, &[4], false).unwrap());
    assert_eq!((m1.held_states(), m2.held_states()), (st.n_layers(), 0), "moved from r2 to r1");
    assert!(got == want);
}

#[test]
fn backend_errors_are_run_errors_naming_the_node_or_slot() {
    let name = "ktiny-q4_k_m.gguf";
    let (cpu, _) = single(name, false, 512);
    let (r, mock) = single(name, true, 512);
    let mock = mock.unwrap();
    let g = r.graph(Geometry::one(2, false)).unwrap();
    let names_of = |f: &dyn Fn(&Op) -> bool| -> Vec<String> {
        g.order().filter(|&i| f(&g.node(i).op)).map(|i| g.node(i).name.clone()).collect()
    };
    let inputs = names_of(&|o| matches!(o, Op::Tokens | Op::Positions));
    let matmuls = names_of(&|o| matches!(o, Op::MatMul));
    let output = g.node(g.outputs[0]).name.clone();
    let p = [1, 2];
    let want = cpu.forward(&mut cpu.new_state(32), &p, false).unwrap();
    let check = |f: Fail, ok: &dyn Fn(&RunError) -> bool| {
        mock.fail_next(f.clone());
        let e = r.forward(&mut r.new_state(32), &p, false).expect_err("injected failure");
        assert!(ok(&e), "{f:?}: {e}");
        assert!(e.to_string().contains("injected failure"), "{e}");
        // the runner (and the mock's segment state) recover
        let mut st = r.new_state(32);
        assert!(r.forward(&mut st, &p, false).unwrap() == want, "after {f:?}");
    };
    check(Fail::Reserve, &|e| matches!(e, RunError::Slot { action: "reservation", .. }));
    check(Fail::Upload, &|e| matches!(e, RunError::Slot { action: "upload", node, slot, .. } if inputs.contains(node) && slot.starts_with("slot ")));
    check(Fail::Download, &|e| matches!(e, RunError::Slot { action: "download", node, .. } if *node == output));
    check(Fail::Execute("MatMul"), &|e| matches!(e, RunError::Op { node, .. } if matmuls.contains(node)));
    check(Fail::StateUpload, &|e| matches!(e, RunError::StateMove(m) if m.action == "upload" && m.layer == 0));
    // bringing a state home
    let mut st = r.new_state(32);
    r.forward(&mut st, &p, false).unwrap();
    mock.fail_next(Fail::StateDownload);
    let e = r.sync_state(&mut st).unwrap_err();
    assert!(matches!(&e, RunError::StateMove(m) if m.action == "download"), "{e}");
    mock.fail_next(Fail::StateSnapshot);
    assert!(st.snapshot().is_err());
    mock.fail_next(Fail::StateReset);
    st.reset();
    assert!(st.owner(0).is_none() && st.owner(1).is_some(), "a failed in-place reset releases that layer's device copy only");
    assert!(r.forward(&mut st, &p, false).unwrap() == want, "after a failed in-place reset");
    assert!(st.snapshot().is_ok() && r.sync_state(&mut st).is_ok());
}

/// The child of `pn_debug_reports_the_copies_per_step` (does nothing unless asked).
#[test]
fn debug_child() {
    if std::env::var("PN_RESIDENT_CHILD").is_err() {
        return;
    }
    let (r, _) = single("tiny-f16.gguf", true, 512);
    let mut st = r.new_state(32);
    r.forward(&mut st, &[1, 2, 3], false).unwrap();
    r.forward(&mut st, &[4], false).unwrap();
}

#[test]
fn pn_debug_reports_the_copies_per_step() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "debug_child", "--nocapture", "--test-threads=1"])
        .env("PN_DEBUG", "1")
        .env("PN_RESIDENT_CHILD", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let steps: Vec<&str> = err.lines().filter(|l| l.starts_with("[pn] step ") && l.contains("tokens,")).collect();
    assert_eq!(steps.len(), 2, "{err}");
    let n_vocab = load("tiny-f16.gguf").1.n_vocab();
    let l0 = format!("host->device 2 (24 B), device->host 1 ({} B), die-to-die 0 (0 B), state up", 4 * n_vocab);
    let l1 = format!("host->device 2 (8 B), device->host 1 ({} B), die-to-die 0 (0 B), state up 0 down 0 (0 B)", 4 * n_vocab);
    assert!(steps[0].contains(&l0), "{}", steps[0]);
    assert!(steps[1].contains(&l1), "{}", steps[1]);
}

/// A layer state of another shape than its op's (inferred with the graph's shapes) is
/// one clear error naming the node, what was expected and what was found, raised before
/// any state moves or any position advances: a KV cache of other dims, a conv window of
/// other channels, a delta-rule state of other heads, on the CPU and on the mock.
#[test]
fn a_misshaped_layer_state_is_one_clear_error() {
    for mock in [false, true] {
        let (r, m) = single("ktiny-q4_k_m.gguf", mock, 7);
        let fresh = r.model().new_state(16);
        let kv = fresh.iter().position(|s| matches!(s, LayerState::Kv(_))).expect("an attention layer");
        let rec = fresh.iter().position(|s| matches!(s, LayerState::Recurrent(_))).expect("a DeltaNet layer");
        let (LayerState::Kv(k), LayerState::Recurrent(c)) = (&fresh[kv], &fresh[rec]) else { unreachable!() };
        let d_conv = c.conv.len() / c.conv_channels + 1;
        let cases = [
            (kv, LayerState::Kv(KvCache::new(k.n_head_kv, k.head_dim + 1, 16)), "Attention", format!("expected a KV cache of {} heads × {} dims, found a KV cache of {} heads × {} dims", k.n_head_kv, k.head_dim, k.n_head_kv, k.head_dim + 1)),
            (rec, LayerState::Recurrent(RecurrentState::new(d_conv, c.conv_channels + 2, c.n_v_heads, c.head_k_dim, c.head_v_dim)), "Conv1dCausal", format!("expected a conv window of {} × {} channels", d_conv - 1, c.conv_channels)),
            (rec, LayerState::Recurrent(RecurrentState { n_v_heads: c.n_v_heads * 2, ..c.clone() }), "DeltaRule", format!("expected a delta-rule state of {} V heads", c.n_v_heads)),
        ];
        for (layer, bad, op, want) in cases {
            let mut layers = fresh.clone();
            layers[layer] = bad;
            let mut st = SeqState::new(layers, 16);
            if let Some(m) = &m {
                m.reset_counts();
            }
            let e = r.forward(&mut st, &[1, 2, 3], false).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(&e, RunError::Op { source: OpError::Shape { op: o, .. }, .. } if *o == op), "mock {mock}: {msg}");
            assert!(msg.contains(&want) && msg.contains(&format!("layer state {layer}")), "mock {mock}: {msg}");
            assert_eq!(st.pos, 0);
            if let Some(m) = &m {
                assert_eq!((m.counts().state_uploads, m.counts().executes), (0, 0), "mock: moved or ran before the check");
            }
            // the same state, right shaped, runs
            let mut ok = SeqState::new(fresh.clone(), 16);
            r.forward(&mut ok, &[1, 2, 3], false).unwrap();
        }
    }
}
