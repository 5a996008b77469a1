//! CPU backend vs the pn-ops reference kernels: every op of the enum on random inputs with
//! odd shapes, one token and many, several weight types. Results (outputs and updated
//! state) must be bitwise equal to the reference, for 1, 2 and 3 threads (the delta rule:
//! 1e-4 relative to the reference, bitwise across thread counts).

use pn_cpu::CpuBackend;
use pn_engine::{Backend, HostKernels};
use pn_ops::quant::quantize_row;
use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;
use std::sync::{Arc, OnceLock};

fn backends() -> &'static [Arc<CpuBackend>] {
    static B: OnceLock<Vec<Arc<CpuBackend>>> = OnceLock::new();
    B.get_or_init(|| [1, 2, 3].map(|n| Arc::new(CpuBackend::new(n))).to_vec())
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2246822519).wrapping_add(3);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 24) as u8
        })
        .collect()
}

/// Weight blocks of type `ty` for `rows` rows of `k` elements.
fn weight_bytes(ty: GgmlType, k: usize, rows: usize, seed: u32) -> Vec<u8> {
    let rb = ty.row_bytes(k).unwrap();
    let x = data(k * rows, seed);
    let mut out = vec![0u8; rb * rows];
    match ty {
        GgmlType::F32 => {
            out.copy_from_slice(&x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
        }
        GgmlType::F16 => out.copy_from_slice(
            &x.iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect::<Vec<_>>(),
        ),
        GgmlType::BF16 => out.copy_from_slice(
            &x.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect::<Vec<_>>(),
        ),
        GgmlType::Q8_0 => {
            for (r, o) in out.chunks_mut(rb).enumerate() {
                quantize_row(GgmlType::Q8_0, &x[r * k..(r + 1) * k], o);
            }
        }
        GgmlType::Q4K | GgmlType::Q6K => {
            // Random quants and scales with sane f16 super-block scales.
            out = bytes(rb * rows, seed);
            let d = half::f16::from_f32(0.01).to_le_bytes();
            let dmin = half::f16::from_f32(0.002).to_le_bytes();
            for blk in out.chunks_mut(ty.type_size()) {
                if ty == GgmlType::Q4K {
                    blk[0..2].copy_from_slice(&d);
                    blk[2..4].copy_from_slice(&dmin);
                } else {
                    let n = blk.len();
                    blk[n - 2..].copy_from_slice(&d);
                }
            }
        }
        _ => panic!("no test encoder for {ty}"),
    }
    out
}

fn view<'a>(ty: GgmlType, shape: Shape, bytes: &'a [u8]) -> WeightView<'a> {
    WeightView {
        name: "w",
        ty,
        shape,
        bytes,
        rows16: None,
    }
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.shape == b.shape
        && match (&a.data, &b.data) {
            (TensorData::F32(x), TensorData::F32(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            (TensorData::I32(x), TensorData::I32(y)) => x == y,
            _ => false,
        }
}

fn same_state(a: &Option<LayerState>, b: &Option<LayerState>) -> bool {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    match (a, b) {
        (Some(LayerState::Kv(x)), Some(LayerState::Kv(y))) => {
            bits(&x.k) == bits(&y.k) && bits(&x.v) == bits(&y.v)
        }
        (Some(LayerState::Recurrent(x)), Some(LayerState::Recurrent(y))) => {
            bits(&x.conv) == bits(&y.conv) && bits(&x.ssm) == bits(&y.ssm)
        }
        (None, None) => true,
        (Some(LayerState::None), Some(LayerState::None)) => true,
        _ => false,
    }
}

/// Run `op` on the reference and on every CPU backend; outputs and states must be
/// bitwise equal (errors must agree too). Returns the reference result.
fn check(op: &Op, ins: &[Value<'_>], state: Option<&LayerState>) -> Result<Tensor, OpError> {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas)?;
    let mut rs = state.cloned();
    let want = execute(op, ins, &out, rs.as_mut());
    if let Ok(Tensor {
        data: TensorData::F32(v),
        ..
    }) = &want
    {
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{op:?}: non-finite reference output"
        );
        assert!(
            v.is_empty() || v.iter().any(|&x| x != 0.0),
            "{op:?}: all-zero reference output"
        );
    }
    for be in backends() {
        // through the backend protocol (slots, a compiled one-op segment), as every backend
        let mut cs = state.cloned();
        let got = pn_engine::execute_op(&(be.clone() as Arc<dyn Backend>), op, ins, &out, cs.as_mut());
        match (&want, &got) {
            (Ok(w), Ok(g)) => assert!(
                same(w, g),
                "{op:?}: {} threads differ from the reference",
                be.threads()
            ),
            (Err(w), Err(g)) => assert_eq!(w, g, "{op:?}: errors differ"),
            _ => panic!(
                "{op:?}: reference {want:?} vs cpu({}) {got:?}",
                be.threads()
            ),
        }
        assert!(
            same_state(&rs, &cs),
            "{op:?}: {} threads left a different state",
            be.threads()
        );
    }
    want
}

fn act(shape: Shape, seed: u32) -> Tensor {
    Tensor::f32(shape, data(shape.numel(), seed))
}

const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
];

#[test]
fn leaves_rejected() {
    let out = TensorMeta::i32(Shape::d1(2));
    for op in [Op::Tokens, Op::Positions, Op::Weight { name: "w".into() }] {
        for be in backends() {
            assert!(matches!(
                be.execute(&op, &[], &out, None),
                Err(OpError::Invalid { .. })
            ));
        }
    }
    assert_eq!(backends()[0].name(), "cpu");
}

#[test]
fn get_rows() {
    for ty in TYPES {
        let (k, v) = (256, 11);
        let wb = weight_bytes(ty, k, v, 1);
        let w = view(ty, Shape::d2(k, v), &wb);
        for ids in [vec![3], vec![10, 0, 3, 3, 7, 1, 2, 9, 8, 5, 4, 6, 0]] {
            let ids = Tensor::i32(Shape::d1(ids.len()), ids);
            check(&Op::GetRows, &[Value::Weight(w), Value::Act(&ids)], None).unwrap();
        }
        let bad = Tensor::i32(Shape::d1(2), vec![1, 11]);
        assert!(check(&Op::GetRows, &[Value::Weight(w), Value::Act(&bad)], None).is_err());
    }
}

#[test]
fn matmul() {
    for ty in TYPES {
        for (k, n) in [(256, 67), (512, 5)] {
            let wb = weight_bytes(ty, k, n, 2);
            let w = view(ty, Shape::d2(k, n), &wb);
            for t in [1, 2, 37, 70] {
                let x = act(Shape::d2(k, t), 3 + t as u32);
                check(&Op::MatMul, &[Value::Weight(w), Value::Act(&x)], None).unwrap();
            }
        }
    }
    // A large single-token matmul (parallel path over row blocks).
    let wb = weight_bytes(GgmlType::Q8_0, 256, 1001, 4);
    let w = view(GgmlType::Q8_0, Shape::d2(256, 1001), &wb);
    check(
        &Op::MatMul,
        &[Value::Weight(w), Value::Act(&act(Shape::d2(256, 1), 5))],
        None,
    )
    .unwrap();
}

#[test]
fn norms_and_softmax() {
    for (n, rows) in [(7, 1), (129, 3), (2048, 1), (256, 77)] {
        let x = act(Shape::d2(n, rows), 6);
        check(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&x)], None).unwrap();
        let wv = data(n, 7);
        let wt = Tensor::f32(Shape::d1(n), wv.clone());
        let wb: Vec<u8> = wv.iter().flat_map(|v| v.to_le_bytes()).collect();
        check(
            &Op::RmsNorm { eps: 1e-6 },
            &[Value::Act(&x), Value::Act(&wt)],
            None,
        )
        .unwrap();
        check(
            &Op::RmsNorm { eps: 1e-6 },
            &[
                Value::Act(&x),
                Value::Weight(view(GgmlType::F32, Shape::d1(n), &wb)),
            ],
            None,
        )
        .unwrap();
        check(&Op::L2Norm { eps: 1e-6 }, &[Value::Act(&x)], None).unwrap();
        check(&Op::Softmax, &[Value::Act(&x)], None).unwrap();
    }
    // Per-head norm over [D, H, T].
    let x = act(Shape::d3(64, 5, 9), 8);
    check(&Op::RmsNorm { eps: 1e-5 }, &[Value::Act(&x)], None).unwrap();
    check(&Op::L2Norm { eps: 1e-5 }, &[Value::Act(&x)], None).unwrap();
}

#[test]
fn rope() {
    for (d, h, t, n_rot) in [(80, 3, 1, 64), (256, 4, 13, 64), (16, 2, 300, 16)] {
        let x = act(Shape::d3(d, h, t), 9);
        let pos: Vec<i32> = (0..t as i32).map(|i| i * 37 + 5).collect();
        let p = Tensor::i32(Shape::d1(t), pos);
        for mode in [
            RopeMode::Normal,
            RopeMode::Neox,
            RopeMode::IMRope {
                sections: [11, 11, 10, 0],
            },
            RopeMode::IMRope {
                sections: [1, 1, 1, 1],
            },
        ] {
            for (base, scale) in [(1e7, 1.0), (1e4, 0.25)] {
                let op = Op::Rope {
                    n_rot,
                    mode,
                    freq_base: base,
                    freq_scale: scale,
                };
                check(&op, &[Value::Act(&x), Value::Act(&p)], None).unwrap();
                // llama3-style per-pair freq factors (third input)
                let ff = act(Shape::d1(n_rot / 2), 11).into_f32().iter().map(|v| 1.0 + v.abs() * 8.0).collect();
                let ff = Tensor::f32(Shape::d1(n_rot / 2), ff);
                check(&op, &[Value::Act(&x), Value::Act(&p), Value::Act(&ff)], None).unwrap();
            }
        }
    }
}

fn attention_case(
    h: usize,
    hkv: usize,
    d: usize,
    pos: &[i32],
    st: &LayerState,
    seed: u32,
) -> (Result<Tensor, OpError>, LayerState) {
    let t = pos.len();
    let q = act(Shape::d3(d, h, t), seed);
    let k = act(Shape::d3(d, hkv, t), seed + 1);
    let v = act(Shape::d3(d, hkv, t), seed + 2);
    let p = Tensor::i32(Shape::d1(t), pos.to_vec());
    let op = Op::Attention {
        n_head: h,
        n_head_kv: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        state: 3,
    };
    let ins = [
        Value::Act(&q),
        Value::Act(&k),
        Value::Act(&v),
        Value::Act(&p),
    ];
    let r = check(&op, &ins, Some(st));
    let mut next = st.clone();
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let _ = execute(&op, &ins, &op.infer(&metas).unwrap(), Some(&mut next));
    (r, next)
}

#[test]
fn attention() {
    for (h, hkv, d) in [(4, 2, 32), (6, 1, 24), (3, 3, 8)] {
        let st = LayerState::Kv(KvCache::new(hkv, d, 64));
        // Prefill of 9 tokens, then a decode step, then a batch at other positions.
        let pre: Vec<i32> = (0..9).collect();
        let (r, st) = attention_case(h, hkv, d, &pre, &st, 10);
        r.unwrap();
        let (r, st) = attention_case(h, hkv, d, &[9], &st, 20);
        r.unwrap();
        let (r, st) = attention_case(h, hkv, d, &[10, 11, 12, 40, 41], &st, 30);
        r.unwrap();
        // Context full: reported, state untouched on every backend.
        let (r, _) = attention_case(h, hkv, d, &[63, 64], &st, 40);
        assert!(matches!(r, Err(OpError::ContextFull { pos: 64, .. })));
    }
}

#[test]
fn conv1d_causal() {
    for (c, d_conv, t) in [(9, 4, 1), (300, 4, 37), (8192, 4, 1), (64, 2, 5)] {
        let x = act(Shape::d2(c, t), 50);
        let wb: Vec<u8> = data(c * d_conv, 51)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = view(GgmlType::F32, Shape::d2(d_conv, c), &wb);
        let mut r = RecurrentState::new(d_conv, c, 1, 1, 1);
        r.conv = data(r.conv.len(), 52);
        let st = LayerState::Recurrent(r);
        check(
            &Op::Conv1dCausal { d_conv, state: 0 },
            &[Value::Act(&x), Value::Weight(w)],
            Some(&st),
        )
        .unwrap();
        let bad = LayerState::Recurrent(RecurrentState::new(d_conv, c + 1, 1, 1, 1));
        assert!(check(
            &Op::Conv1dCausal { d_conv, state: 0 },
            &[Value::Act(&x), Value::Weight(w)],
            Some(&bad)
        )
        .is_err());
    }
}

/// The delta rule is the one op that is not bitwise equal to the reference: the CPU
/// sums its dot products in 16 lanes (and uses the chunked form from
/// `delta::CHUNKED_FROM_T` tokens), so it is checked to 1e-4 relative, while the thread
/// counts must still agree bit for bit (more cases in tests/delta_chunk.rs).
#[test]
fn delta_rule() {
    for (dk, hk, dv, hv, t) in [
        (8, 2, 8, 4, 70),
        (16, 2, 16, 4, 70),
        (64, 2, 64, 8, 1),
        (16, 1, 12, 3, 5),
        (128, 2, 128, 4, 3),
    ] {
        let q = act(Shape::d3(dk, hk, t), 60);
        let k = act(Shape::d3(dk, hk, t), 61);
        let v = act(Shape::d3(dv, hv, t), 62);
        let g = Tensor::f32(
            Shape::d2(hv, t),
            data(hv * t, 63).iter().map(|x| -0.5 * (x + 1.0)).collect(),
        );
        let b = Tensor::f32(
            Shape::d2(hv, t),
            data(hv * t, 64).iter().map(|x| 0.5 * (x + 1.0)).collect(),
        );
        let mut r = RecurrentState::new(4, 1, hv, dk, dv);
        r.ssm = data(r.ssm.len(), 65);
        let st = LayerState::Recurrent(r);
        let ins = [
            Value::Act(&q),
            Value::Act(&k),
            Value::Act(&v),
            Value::Act(&g),
            Value::Act(&b),
        ];
        let op = Op::DeltaRule { state: 0 };
        let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
        let out = op.infer(&metas).unwrap();
        let mut rs = Some(st.clone());
        let want = execute(&op, &ins, &out, rs.as_mut()).unwrap();
        let mut first: Option<(Tensor, Option<LayerState>)> = None;
        for be in backends() {
            let mut cs = Some(st.clone());
            let got = be.execute(&op, &ins, &out, cs.as_mut()).unwrap();
            let close = |a: &[f32], b: &[f32]| {
                let m = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4 * m)
            };
            let ssm = |s: &Option<LayerState>| match s {
                Some(LayerState::Recurrent(r)) => r.ssm.clone(),
                _ => panic!("recurrent state"),
            };
            assert!(close(got.as_f32(), want.as_f32()), "t={t}: output");
            assert!(close(&ssm(&cs), &ssm(&rs)), "t={t}: state");
            if let Some((o, s)) = &first {
                assert!(same(o, &got) && same_state(s, &cs), "t={t}: thread counts differ");
            } else {
                first = Some((got, cs));
            }
        }
    }
}

#[test]
fn routing_ops() {
    for (e, t, k) in [(256, 1, 8), (17, 23, 3), (8, 5, 8)] {
        let x = act(Shape::d2(e, t), 70);
        let p = check(&Op::Softmax, &[Value::Act(&x)], None).unwrap();
        let ids = check(&Op::TopK { k }, &[Value::Act(&p)], None).unwrap();
        for normalize in [false, true] {
            check(
                &Op::MoeWeights { normalize },
                &[Value::Act(&p), Value::Act(&ids)],
                None,
            )
            .unwrap();
        }
    }
    // Ties and signed zeros.
    let x = Tensor::f32(
        Shape::d2(6, 2),
        vec![
            1.0, 2.0, 2.0, 0.0, -0.0, 2.0, 0.0, -0.0, 0.0, -1.0, -1.0, 0.0,
        ],
    );
    let y = check(&Op::TopK { k: 4 }, &[Value::Act(&x)], None).unwrap();
    assert_eq!(y.as_i32(), &[1, 2, 5, 0, 0, 1, 2, 5]);
}

struct Moe {
    gate: Vec<u8>,
    up: Vec<u8>,
    gate_up: Vec<u8>,
    down: Vec<u8>,
}

#[test]
fn moe_experts() {
    let (kd, f, e) = (256, 256, 9);
    for (gty, dty) in [
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q4K, GgmlType::Q6K),
        (GgmlType::F16, GgmlType::F32),
    ] {
        let m = Moe {
            gate: weight_bytes(gty, kd, f * e, 80),
            up: weight_bytes(gty, kd, f * e, 81),
            gate_up: weight_bytes(gty, kd, 2 * f * e, 82),
            down: weight_bytes(dty, f, kd * e, 83),
        };
        let gate = view(gty, Shape::d3(kd, f, e), &m.gate);
        let up = view(gty, Shape::d3(kd, f, e), &m.up);
        let gu = view(gty, Shape::d3(kd, 2 * f, e), &m.gate_up);
        let down = view(dty, Shape::d3(f, kd, e), &m.down);
        // 600 tokens: more than one block of tokens (512) per pass over the experts
        for (t, top) in [(1, 4), (20, 3), (600, 2)] {
            if t == 600 && gty != GgmlType::Q4K {
                continue;
            }
            let x = act(Shape::d2(kd, t), 84);
            let logits = act(Shape::d2(e, t), 85);
            let p = check(&Op::Softmax, &[Value::Act(&logits)], None).unwrap();
            let ids = check(&Op::TopK { k: top }, &[Value::Act(&p)], None).unwrap();
            let w = check(
                &Op::MoeWeights { normalize: true },
                &[Value::Act(&p), Value::Act(&ids)],
                None,
            )
            .unwrap();
            let split = [
                Value::Act(&x),
                Value::Act(&ids),
                Value::Act(&w),
                Value::Weight(gate),
                Value::Weight(up),
                Value::Weight(down),
            ];
            let all = check(
                &Op::MoeExperts {
                    merged_gate_up: false,
                },
                &split,
                None,
            )
            .unwrap();
            let merged = [
                Value::Act(&x),
                Value::Act(&ids),
                Value::Act(&w),
                Value::Weight(gu),
                Value::Weight(down),
            ];
            check(
                &Op::MoeExperts {
                    merged_gate_up: true,
                },
                &merged,
                None,
            )
            .unwrap();
            // Batch composition does not matter: each token alone gives the same row.
            if t > 1 {
                for ti in [0, t / 2, t - 1] {
                    let xi = Tensor::f32(
                        Shape::d2(kd, 1),
                        x.as_f32()[ti * kd..(ti + 1) * kd].to_vec(),
                    );
                    let ii = Tensor::i32(
                        Shape::d2(top, 1),
                        ids.as_i32()[ti * top..(ti + 1) * top].to_vec(),
                    );
                    let wi = Tensor::f32(
                        Shape::d2(top, 1),
                        w.as_f32()[ti * top..(ti + 1) * top].to_vec(),
                    );
                    let ins = [
                        Value::Act(&xi),
                        Value::Act(&ii),
                        Value::Act(&wi),
                        Value::Weight(gate),
                        Value::Weight(up),
                        Value::Weight(down),
                    ];
                    let one = backends()[1]
                        .execute(
                            &Op::MoeExperts {
                                merged_gate_up: false,
                            },
                            &ins,
                            &TensorMeta::f32(Shape::d2(kd, 1)),
                            None,
                        )
                        .unwrap();
                    let row = &all.as_f32()[ti * kd..(ti + 1) * kd];
                    assert!(
                        row.iter()
                            .zip(one.as_f32())
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "token {ti}"
                    );
                }
            }
            // An out-of-range expert id is an error on every backend.
            let mut bad = ids.clone();
            if let TensorData::I32(v) = &mut bad.data {
                v[0] = e as i32;
            }
            let ins = [
                Value::Act(&x),
                Value::Act(&bad),
                Value::Act(&w),
                Value::Weight(gate),
                Value::Weight(up),
                Value::Weight(down),
            ];
            assert!(check(
                &Op::MoeExperts {
                    merged_gate_up: false
                },
                &ins,
                None
            )
            .is_err());
        }
    }
}

/// Many experts, few tokens each (72 experts, top-2, 128 tokens: ~3.6 per expert, most
/// experts active): the MoE's long row blocks (past the gate/up boundary) and the packed
/// kernels from 4 tokens agree with the reference, and a token alone gives its row bit
/// for bit.
#[test]
fn moe_experts_many_experts_few_tokens() {
    let (kd, f, e, t, top) = (256, 256, 72, 128, 2);
    let (gty, dty) = (GgmlType::Q4K, GgmlType::Q6K);
    let (g, u, d) = (weight_bytes(gty, kd, f * e, 90), weight_bytes(gty, kd, f * e, 91), weight_bytes(dty, f, kd * e, 92));
    let (gate, up, down) = (view(gty, Shape::d3(kd, f, e), &g), view(gty, Shape::d3(kd, f, e), &u), view(dty, Shape::d3(f, kd, e), &d));
    let x = act(Shape::d2(kd, t), 93);
    let p = check(&Op::Softmax, &[Value::Act(&act(Shape::d2(e, t), 94))], None).unwrap();
    let ids = check(&Op::TopK { k: top }, &[Value::Act(&p)], None).unwrap();
    let w = check(&Op::MoeWeights { normalize: true }, &[Value::Act(&p), Value::Act(&ids)], None).unwrap();
    let used = (0..e as i32).filter(|id| ids.as_i32().contains(id)).count();
    assert!(used >= 64, "only {used} experts used: the long-block path needs 64");
    let op = Op::MoeExperts { merged_gate_up: false };
    let all = check(&op, &[Value::Act(&x), Value::Act(&ids), Value::Act(&w), Value::Weight(gate), Value::Weight(up), Value::Weight(down)], None).unwrap();
    for ti in [0, 77, t - 1] {
        let xi = Tensor::f32(Shape::d2(kd, 1), x.as_f32()[ti * kd..(ti + 1) * kd].to_vec());
        let ii = Tensor::i32(Shape::d2(top, 1), ids.as_i32()[ti * top..(ti + 1) * top].to_vec());
        let wi = Tensor::f32(Shape::d2(top, 1), w.as_f32()[ti * top..(ti + 1) * top].to_vec());
        let ins = [Value::Act(&xi), Value::Act(&ii), Value::Act(&wi), Value::Weight(gate), Value::Weight(up), Value::Weight(down)];
        let one = backends()[1].execute(&op, &ins, &TensorMeta::f32(Shape::d2(kd, 1)), None).unwrap();
        let row = &all.as_f32()[ti * kd..(ti + 1) * kd];
        assert!(row.iter().zip(one.as_f32()).all(|(a, b)| a.to_bits() == b.to_bits()), "token {ti}");
    }
}

#[test]
fn elementwise_and_movement() {
    for shape in [
        Shape::d1(5),
        Shape::d2(4096, 3),
        Shape::d3(33, 7, 5),
        Shape([6, 5, 4, 3]),
    ] {
        let x = act(shape, 90);
        for u in [
            UnaryOp::Silu,
            UnaryOp::Sigmoid,
            UnaryOp::Softplus,
            UnaryOp::Exp,
            UnaryOp::Scale(-0.37),
        ] {
            check(&Op::Unary(u), &[Value::Act(&x)], None).unwrap();
        }
        // Every divisor shape of b tiles a.
        let [a0, a1, a2, a3] = shape.0;
        let divs = |n: usize| -> Vec<usize> { (1..=n).filter(|d| n.is_multiple_of(*d)).collect() };
        for b0 in [1, a0] {
            for b1 in divs(a1).into_iter().take(2) {
                for b2 in [1, a2] {
                    for b3 in [1, a3] {
                        let bs = Shape([b0, b1, b2, b3]);
                        let b = act(bs, 91);
                        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::SwiGlu] {
                            check(&Op::Binary(op), &[Value::Act(&x), Value::Act(&b)], None)
                                .unwrap();
                        }
                        let bb: Vec<u8> = b.as_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
                        check(
                            &Op::Binary(BinaryOp::Mul),
                            &[Value::Act(&x), Value::Weight(view(GgmlType::F32, bs, &bb))],
                            None,
                        )
                        .unwrap();
                    }
                }
            }
        }
        check(
            &Op::Reshape(Shape::d1(shape.numel())),
            &[Value::Act(&x)],
            None,
        )
        .unwrap();
    }
    let x = act(Shape::d2(8192 + 4096, 3), 92);
    for (group, offset, len) in [(256, 0, 128), (256, 128, 128), (12288, 0, 8192), (3, 1, 2)] {
        check(
            &Op::SliceCols { group, offset, len },
            &[Value::Act(&x)],
            None,
        )
        .unwrap();
    }
    for (start, len) in [(0, 1), (2, 1), (1, 2), (0, 3)] {
        check(&Op::SliceRows { start, len }, &[Value::Act(&x)], None).unwrap();
    }
    let ids = Tensor::i32(Shape::d2(2, 3), vec![1, 2, 3, 4, 5, 6]);
    check(&Op::Reshape(Shape::d1(6)), &[Value::Act(&ids)], None).unwrap();
}
