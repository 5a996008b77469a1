//! The planner and runner on a toy model (embedding, N layers of RMSNorm + RoPE'd
//! attention with a KV cache + residual, output norm, head) written to an in-memory
//! GGUF, run on two reference-backend dies.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::graph::{GraphBuilder, GraphError};
use pn_engine::planner::{BufKind, Cause, Device, Placement};
use pn_engine::runner::Die;
use pn_engine::{Geometry, Gguf, LayerInfo, Model, ReferenceBackend, Runner};
use pn_ops::{BinaryOp, GgmlType, KvCache, LayerState, Op, RopeMode, Shape};
use std::sync::Arc;

const E: usize = 8;
const V: usize = 16;
const L: usize = 4;

struct Toy;

impl Model for Toy {
    fn arch(&self) -> &str {
        "toy"
    }
    fn n_vocab(&self) -> usize {
        V
    }
    fn n_layer(&self) -> usize {
        L
    }
    fn layers(&self) -> Vec<LayerInfo> {
        (0..L)
            .map(|index| LayerInfo {
                index,
                kind: "attention".into(),
            })
            .collect()
    }
    fn context_length(&self) -> usize {
        64
    }
    fn build(&self, geom: Geometry, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let t = geom.n_tokens;
        let tok = b.input(Op::Tokens, t, "inp_tokens")?;
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let embd = b.weight("token_embd.weight", GgmlType::F32, Shape::d2(E, V))?;
        let mut h = b.op(Op::GetRows, &[embd, tok], "inp_embd")?;
        for il in 0..L {
            b.set_layer(Some(il));
            let w = |n: &str| format!("blk.{il}.{n}.weight");
            let nw = b.weight(&w("attn_norm"), GgmlType::F32, Shape::d1(E))?;
            let x = b.op(Op::RmsNorm { eps: 1e-6 }, &[h, nw], "attn_norm")?;
            let mut qkv = Vec::new();
            for (n, heads) in [("attn_q", 2), ("attn_k", 1), ("attn_v", 1)] {
                let wt = b.weight(&w(n), GgmlType::F32, Shape::d2(E, 4 * heads))?;
                let y = b.op(Op::MatMul, &[wt, x], n)?;
                qkv.push(b.op(
                    Op::Reshape(Shape::d3(4, heads, t)),
                    &[y],
                    &format!("{n}_heads"),
                )?);
            }
            let rope = Op::Rope {
                n_rot: 4,
                mode: RopeMode::Neox,
                freq_base: 10000.0,
                freq_scale: 1.0,
            };
            let q = b.op(rope.clone(), &[qkv[0], pos], "Qcur")?;
            let k = b.op(rope, &[qkv[1], pos], "Kcur")?;
            let att = Op::Attention {
                n_head: 2,
                n_head_kv: 1,
                head_dim: 4,
                scale: 0.5,
                state: il,
            };
            let o = b.op(att, &[q, k, qkv[2], pos], "attn_out")?;
            let wo = b.weight(&w("attn_output"), GgmlType::F32, Shape::d2(E, E))?;
            let o = b.op(Op::MatMul, &[wo, o], "attn_output")?;
            h = b.op(Op::Binary(BinaryOp::Add), &[o, h], "l_out")?;
        }
        b.set_layer(None);
        let nw = b.weight("output_norm.weight", GgmlType::F32, Shape::d1(E))?;
        let mut h = b.op(Op::RmsNorm { eps: 1e-6 }, &[h, nw], "result_norm")?;
        if !geom.all_logits && t > 1 {
            h = b.op(
                Op::SliceRows {
                    start: t - 1,
                    len: 1,
                },
                &[h],
                "result_norm_last",
            )?;
        }
        let head = b.weight("output.weight", GgmlType::F32, Shape::d2(E, V))?;
        let logits = b.op(Op::MatMul, &[head, h], "result_output")?;
        b.output(logits);
        Ok(())
    }
    fn new_state(&self, max_seq: usize) -> Vec<LayerState> {
        (0..L)
            .map(|_| LayerState::Kv(KvCache::new(1, 4, max_seq)))
            .collect()
    }
    fn describe(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

fn toy_gguf() -> Arc<Gguf> {
    let mut seed = 12345u64;
    let mut rnd = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5).to_le_bytes()
            })
            .collect()
    };
    let mut w = GgufWriter::new().tensor(
        "token_embd.weight",
        &[E as u64, V as u64],
        GgmlType::F32,
        rnd(E * V),
    );
    for il in 0..L {
        w = w.tensor(
            format!("blk.{il}.attn_norm.weight"),
            &[E as u64],
            GgmlType::F32,
            rnd(E),
        );
        for (n, rows) in [
            ("attn_q", 8u64),
            ("attn_k", 4),
            ("attn_v", 4),
            ("attn_output", 8),
        ] {
            w = w.tensor(
                format!("blk.{il}.{n}.weight"),
                &[E as u64, rows],
                GgmlType::F32,
                rnd(E * rows as usize),
            );
        }
    }
    w = w.tensor("output_norm.weight", &[E as u64], GgmlType::F32, rnd(E));
    w = w.tensor(
        "output.weight",
        &[E as u64, V as u64],
        GgmlType::F32,
        rnd(E * V),
    );
    Arc::new(Gguf::from_bytes(w.to_bytes()).expect("toy gguf parses"))
}

fn runner(p: Placement) -> Runner {
    let dies = p
        .named_dies()
        .into_iter()
        .map(|device| Die {
            device,
            backend: Arc::new(ReferenceBackend) as _,
        })
        .collect();
    Runner::with_dies(Arc::new(Toy), toy_gguf(), dies, p).expect("toy runner")
}

/// Prompt logits (every position) then three greedy-free decode steps.
fn run(r: &Runner) -> Vec<Vec<f32>> {
    let mut st = r.new_state(32);
    let prompt = [3u32, 1, 4, 1, 5, 9, 2];
    let mut out = vec![r.forward(&mut st, &prompt, true).unwrap().data];
    for t in [6u32, 5, 3] {
        out.push(r.forward(&mut st, &[t], false).unwrap().data);
    }
    out
}

fn two(split: usize) -> Placement {
    Placement::split(Device::cpu(0), Device::cpu(1), split)
}

#[test]
fn every_split_matches_one_die_bit_for_bit() {
    let one = run(&runner(Placement::single(Device::cpu(0))));
    for split in 1..=L {
        let r = runner(two(split));
        assert_eq!(run(&r), one, "split {split}");
        let k = r.counters();
        let expect_bytes = if split < L {
            (4 * E * 7 + 3 * 4 * E) as u64
        } else {
            0
        };
        assert_eq!(
            k.transfer_bytes, expect_bytes,
            "split {split}: only the boundary hidden state crosses"
        );
    }
}

#[test]
fn split_plan_places_layers_head_and_leaves() {
    let r = runner(two(1));
    let geom = Geometry::one(5, false);
    let (g, p) = (r.graph(geom).unwrap(), r.plan(geom).unwrap());
    p.validate(&g).unwrap();
    assert_eq!(p.dies, vec![Device::cpu(0), Device::cpu(1)]);
    assert_eq!(p.segments.len(), 2);
    assert_eq!(p.transfers.len(), 1);
    assert_eq!(g.node(p.transfers[0].value).name, "l_out-0");
    assert_eq!(p.transfers[0].bytes, 4 * E * 5);
    let at = |name: &str| p.annotation(g.find(name).unwrap());
    assert_eq!(at("inp_embd"), "@cpu:0 seg=0 cause=weights");
    assert_eq!(at("attn_norm-0"), "@cpu:0 seg=0 cause=explicit");
    assert_eq!(at("attn_norm-1"), "@cpu:1 seg=1 cause=explicit");
    assert_eq!(at("result_norm"), "@cpu:1 seg=1 cause=weights");
    assert_eq!(at("result_norm_last"), "@cpu:1 seg=1 cause=follows-input");
    assert_eq!(at("inp_pos"), "@cpu:0+cpu:1 seg=0 cause=follows-consumer");
    assert_eq!(at("inp_tokens"), "@cpu:0 seg=0 cause=follows-consumer");
    assert_eq!(
        at("blk.2.attn_q.weight"),
        "@cpu:1 seg=1 cause=follows-consumer"
    );
    assert_eq!(p.state_die, vec![Some(0), Some(1), Some(1), Some(1)]);
    // positions are materialized per die; the only transfer destination is the hidden state
    let pos = g.find("inp_pos").unwrap();
    assert!((0..2).all(|d| p.mem.buffers.iter().any(|b| b.value == pos && b.die == d)));
    let tin: Vec<_> = p
        .mem
        .buffers
        .iter()
        .filter(|b| b.kind == BufKind::TransferIn)
        .collect();
    assert_eq!(tin.len(), 1);
    assert!(p.summary(&g).contains("transfer l_out-0"));
}

#[test]
fn one_die_plan_and_default_causes() {
    let r = runner(Placement::default());
    let geom = Geometry::one(1, false);
    let (g, p) = (r.graph(geom).unwrap(), r.plan(geom).unwrap());
    assert_eq!((p.segments.len(), p.transfers.len()), (1, 0));
    assert_eq!(
        p.annotation(g.find("attn_norm-3").unwrap()),
        "@cpu:0 seg=0 cause=default"
    );
    assert!(
        p.capture.iter().all(|c| c.stable),
        "decode segments are capturable"
    );
    let prefill = r
        .plan(Geometry::one(4, false))
        .unwrap();
    assert!(prefill.capture.iter().all(|c| !c.stable));
}

#[test]
fn env_cause_is_recorded() {
    let p = Placement::resolve_with(None, None, &|k| {
        (k == "PN_SPLIT_LAYER").then(|| "2".to_string())
    })
    .unwrap();
    let r = runner(p);
    let geom = Geometry::one(1, false);
    let (g, p) = (r.graph(geom).unwrap(), r.plan(geom).unwrap());
    assert_eq!(
        p.annotation(g.find("attn_norm-1").unwrap()),
        "@cpu:0 seg=0 cause=env"
    );
    assert_eq!(
        p.annotation(g.find("attn_norm-2").unwrap()),
        "@cpu:1 seg=1 cause=env"
    );
}

#[test]
fn overrides_make_more_segments_and_still_match() {
    let one = run(&runner(Placement::single(Device::cpu(0))));
    // layer 1's attention output projection on die B, everything else of [0,3) on A
    let p = two(3)
        .with_override("attn_output-1", 1)
        .with_override("Qcur-*", 1);
    let r = runner(p);
    assert_eq!(run(&r), one);
    let geom = Geometry::one(1, false);
    let (g, plan) = (r.graph(geom).unwrap(), r.plan(geom).unwrap());
    assert_eq!(
        plan.nodes[g.find("attn_output-1").unwrap().index()].cause,
        Cause::Explicit
    );
    assert!(plan.segments.len() > 2, "{}", plan.summary(&g));
    plan.validate(&g).unwrap();
}

#[test]
fn decode_units_are_captured_once_then_replayed() {
    let r = runner(two(2));
    let mut st = r.new_state(16);
    r.forward(&mut st, &[1, 2, 3], false).unwrap();
    let k0 = r.counters();
    assert_eq!(
        (k0.captures, k0.replays),
        (0, 0),
        "prefill is not capturable"
    );
    for t in 0..4 {
        r.forward(&mut st, &[t], false).unwrap();
    }
    let k = r.counters();
    assert_eq!(
        (k.captures, k.replays),
        (2, 6),
        "two segments captured once, replayed 3 times each"
    );
}

#[test]
fn memory_plan_reuses_and_covers_every_value() {
    let r = runner(two(2));
    for n_tokens in [1, 2, 7, 32] {
        for all_logits in [false, true] {
            let geom = Geometry::one(n_tokens, all_logits);
            let (g, p) = (r.graph(geom).unwrap(), r.plan(geom).unwrap());
            let slots = p.mem.slots(&|_| 0);
            for d in 0..2 {
                let total = slots.die_bytes(d);
                assert!(total < p.mem.naive[d], "{n_tokens}: die {d} reuses memory");
                assert!(total >= p.mem.peak_live(d));
            }
            // every computed node has a buffer on its die, and no two live buffers of a
            // die share a slot
            let b = &p.mem.buffers;
            for id in g.order().filter(|id| !g.node(*id).op.is_leaf()) {
                assert!(b.iter().any(|x| x.value == id && x.die == p.nodes[id.index()].die));
            }
            for i in 0..b.len() {
                for j in i + 1..b.len() {
                    let live = b[i].die == b[j].die && b[i].start <= b[j].end && b[j].start <= b[i].end;
                    assert!(!live || slots.of[i] != slots.of[j], "{n_tokens}: buffers {i} and {j}");
                }
            }
        }
    }
    let res = r.memory_reservation().unwrap();
    assert_eq!(res.len(), 2);
    assert!(res.iter().all(|(_, b)| *b > 0));
}

#[test]
fn wrong_backend_count_is_an_error() {
    let p = two(2);
    let dies = vec![Die {
        device: Device::cpu(0),
        backend: Arc::new(ReferenceBackend) as _,
    }];
    let e = Runner::with_dies(Arc::new(Toy), toy_gguf(), dies, p)
        .err()
        .expect("one backend for two dies");
    assert!(
        e.to_string()
            .contains("expected backends for cpu:0,cpu:1, found cpu:0"),
        "{e}"
    );
}

/// The toy on dies whose backends are `ResidentMock`s over the reference backend where
/// `mocks[d]` (the resident protocol; tests/tests/resident*.rs covers the real models).
fn resident_runner(p: Placement, mocks: [bool; 2]) -> Runner {
    use pn_engine::testing::ResidentMock;
    let dies = p
        .named_dies()
        .into_iter()
        .enumerate()
        .map(|(i, device)| {
            let host = Arc::new(ReferenceBackend);
            let backend: Arc<dyn pn_engine::Backend> = if mocks[i] {
                Arc::new(ResidentMock::new(host))
            } else {
                host
            };
            Die { device, backend }
        })
        .collect();
    Runner::with_dies(Arc::new(Toy), toy_gguf(), dies, p).expect("toy runner")
}

#[test]
fn resident_dies_match_host_dies_bit_for_bit() {
    let one = run(&runner(Placement::single(Device::cpu(0))));
    assert_eq!(run(&resident_runner(Placement::single(Device::cuda(0)), [true, false])), one);
    for mocks in [[true, false], [false, true], [true, true]] {
        for split in 1..L {
            let r = resident_runner(two(split), mocks);
            assert_eq!(run(&r), one, "{mocks:?} split {split}");
            let k = r.counters();
            assert!(k.uploads > 0 && k.downloads > 0 && k.state_uploads > 0, "{k:?}");
        }
        // several segments per die: values cross back and forth
        let p = two(2).with_override("attn_output-1", 1);
        assert_eq!(run(&resident_runner(p, mocks)), one, "{mocks:?} with an override");
    }
}
