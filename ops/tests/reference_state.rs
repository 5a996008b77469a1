//! Reference stateful kernels: attention over the KV cache, the causal conv with its
//! state, the gated delta rule (closed form, naive unrolled recurrence, batch splits).

use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;

fn run(op: &Op, ins: &[Value<'_>], st: Option<&mut LayerState>) -> Result<Tensor, OpError> {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas)?;
    execute(op, ins, &out, st)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 12345)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ---------------------------------------------------------------- attention

#[allow(clippy::too_many_arguments)]
fn attn(
    h: usize,
    hkv: usize,
    d: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[i32],
    st: &mut LayerState,
) -> Result<Vec<f32>, OpError> {
    let t = pos.len();
    let qt = Tensor::f32(Shape::d3(d, h, t), q.to_vec());
    let kt = Tensor::f32(Shape::d3(d, hkv, t), k.to_vec());
    let vt = Tensor::f32(Shape::d3(d, hkv, t), v.to_vec());
    let pt = Tensor::i32(Shape::d1(t), pos.to_vec());
    let op = Op::Attention {
        n_head: h,
        n_head_kv: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        state: 0,
    };
    run(
        &op,
        &[
            Value::Act(&qt),
            Value::Act(&kt),
            Value::Act(&vt),
            Value::Act(&pt),
        ],
        Some(st),
    )
    .map(|t| t.into_f32())
}

#[test]
fn attention_one_cell_is_v() {
    let (h, hkv, d) = (4, 2, 8);
    let mut st = LayerState::Kv(KvCache::new(hkv, d, 16));
    let q = data(h * d, 1);
    let k = data(hkv * d, 2);
    let v = data(hkv * d, 3);
    let o = attn(h, hkv, d, &q, &k, &v, &[0], &mut st).unwrap();
    for hh in 0..h {
        let g = hh / 2; // grouped
        assert_eq!(
            &o[hh * d..(hh + 1) * d],
            &v[g * d..(g + 1) * d],
            "head {hh}"
        );
    }
    let LayerState::Kv(kv) = &st else {
        unreachable!()
    };
    assert_eq!(&kv.k[kv.cell(1, 0)..kv.cell(1, 0) + d], &k[d..2 * d]);
}

#[test]
fn attention_matches_manual_softmax_gqa() {
    let (h, hkv, d, t) = (6, 2, 4, 3);
    let mut st = LayerState::Kv(KvCache::new(hkv, d, 8));
    let q = data(h * d * t, 4);
    let k = data(hkv * d * t, 5);
    let v = data(hkv * d * t, 6);
    let pos = [0, 1, 2];
    let o = attn(h, hkv, d, &q, &k, &v, &pos, &mut st).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    for ti in 0..t {
        for hh in 0..h {
            let g = hh / (h / hkv);
            let qh = &q[(ti * h + hh) * d..][..d];
            let s: Vec<f64> = (0..=ti)
                .map(|j| {
                    scale
                        * (0..d)
                            .map(|i| qh[i] as f64 * k[(j * hkv + g) * d + i] as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..d {
                let want: f64 = (0..=ti)
                    .map(|j| e[j] / z * v[(j * hkv + g) * d + i] as f64)
                    .sum();
                let got = o[(ti * h + hh) * d + i] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "t {ti} h {hh} i {i}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn attention_batch_equals_one_at_a_time() {
    let (h, hkv, d, t) = (4, 1, 16, 5);
    let q = data(h * d * t, 7);
    let k = data(hkv * d * t, 8);
    let v = data(hkv * d * t, 9);
    let pos: Vec<i32> = (0..t as i32).collect();
    let mut a = LayerState::Kv(KvCache::new(hkv, d, 8));
    let all = attn(h, hkv, d, &q, &k, &v, &pos, &mut a).unwrap();
    let mut b = LayerState::Kv(KvCache::new(hkv, d, 8));
    let mut one = Vec::new();
    for ti in 0..t {
        let r = |x: &[f32], n: usize| x[ti * n..(ti + 1) * n].to_vec();
        one.extend(
            attn(
                h,
                hkv,
                d,
                &r(&q, h * d),
                &r(&k, hkv * d),
                &r(&v, hkv * d),
                &[ti as i32],
                &mut b,
            )
            .unwrap(),
        );
    }
    assert_eq!(all, one);
    assert_eq!(a, b);
}

#[test]
fn attention_context_full_leaves_cache_untouched() {
    let (h, hkv, d) = (2, 2, 4);
    let mut st = LayerState::Kv(KvCache::new(hkv, d, 4));
    let q = data(h * d * 2, 1);
    let k = data(hkv * d * 2, 2);
    let before = st.clone();
    match attn(h, hkv, d, &q, &k, &k, &[3, 4], &mut st) {
        Err(OpError::ContextFull {
            pos: 4,
            need: 5,
            capacity: 4,
        }) => {}
        other => panic!("expected ContextFull, got {other:?}"),
    }
    assert_eq!(st, before);
    assert!(matches!(
        attn(h, hkv, d, &q, &k, &k, &[0, -1], &mut st),
        Err(OpError::Invalid { .. })
    ));
    // Geometry mismatch.
    let mut small = LayerState::Kv(KvCache::new(1, d, 4));
    assert!(attn(h, hkv, d, &q, &k, &k, &[0, 1], &mut small).is_err());
}

// ---------------------------------------------------------------- conv

fn conv(x: &[f32], c: usize, w: &[f32], d_conv: usize, st: &mut LayerState) -> Vec<f32> {
    let t = x.len() / c;
    let xt = Tensor::f32(Shape::d2(c, t), x.to_vec());
    let wb = f32_bytes(w);
    let wv = WeightView {
        name: "conv",
        ty: GgmlType::F32,
        shape: Shape::d2(d_conv, c),
        bytes: &wb,
        rows16: None,
    };
    run(
        &Op::Conv1dCausal { d_conv, state: 0 },
        &[Value::Act(&xt), Value::Weight(wv)],
        Some(st),
    )
    .unwrap()
    .into_f32()
}

#[test]
fn conv_hand_checked() {
    // One channel, taps [1, 10, 100, 1000] (tap 3 = current token), state [1, 2, 3].
    let mut st = LayerState::Recurrent(RecurrentState::new(4, 1, 1, 1, 1));
    if let LayerState::Recurrent(r) = &mut st {
        r.conv.copy_from_slice(&[1.0, 2.0, 3.0]);
    }
    let y = conv(&[4.0, 5.0], 1, &[1.0, 10.0, 100.0, 1000.0], 4, &mut st);
    assert_eq!(
        y,
        vec![1.0 + 20.0 + 300.0 + 4000.0, 2.0 + 30.0 + 400.0 + 5000.0]
    );
    let LayerState::Recurrent(r) = &st else {
        unreachable!()
    };
    assert_eq!(r.conv, vec![3.0, 4.0, 5.0]);
}

#[test]
fn conv_state_carry_batch_equals_one_at_a_time() {
    let (c, d_conv, t) = (5, 4, 7);
    let w = data(c * d_conv, 1);
    let x = data(c * t, 2);
    let mut a = LayerState::Recurrent(RecurrentState::new(d_conv, c, 1, 1, 1));
    if let LayerState::Recurrent(r) = &mut a {
        r.conv = data(3 * c, 3);
    }
    let mut b = a.clone();
    let mut split = a.clone();
    let all = conv(&x, c, &w, d_conv, &mut a);
    let mut one = Vec::new();
    for ti in 0..t {
        one.extend(conv(&x[ti * c..(ti + 1) * c], c, &w, d_conv, &mut b));
    }
    assert_eq!(all, one);
    assert_eq!(a, b);
    let mut two = conv(&x[..2 * c], c, &w, d_conv, &mut split);
    two.extend(conv(&x[2 * c..], c, &w, d_conv, &mut split));
    assert_eq!(all, two);
    assert_eq!(a, split);
}

// ---------------------------------------------------------------- delta rule

struct DeltaCase {
    dk: usize,
    hk: usize,
    dv: usize,
    hv: usize,
    t: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl DeltaCase {
    fn new(dk: usize, hk: usize, dv: usize, hv: usize, t: usize, seed: u32) -> DeltaCase {
        let norm = |x: Vec<f32>| -> Vec<f32> {
            x.chunks(dk)
                .flat_map(|c| {
                    let n = c.iter().map(|v| v * v).sum::<f32>().sqrt();
                    c.iter().map(move |v| v / n).collect::<Vec<_>>()
                })
                .collect()
        };
        DeltaCase {
            dk,
            hk,
            dv,
            hv,
            t,
            q: norm(data(dk * hk * t, seed)),
            k: norm(data(dk * hk * t, seed + 1)),
            v: data(dv * hv * t, seed + 2),
            g: data(hv * t, seed + 3)
                .iter()
                .map(|x| -0.5 * (x + 1.0))
                .collect(),
            beta: data(hv * t, seed + 4)
                .iter()
                .map(|x| 0.5 * (x + 1.0))
                .collect(),
        }
    }
    fn tokens(&self, a: usize, b: usize) -> DeltaCase {
        let s = |x: &[f32], n: usize| x[a * n..b * n].to_vec();
        DeltaCase {
            t: b - a,
            q: s(&self.q, self.dk * self.hk),
            k: s(&self.k, self.dk * self.hk),
            v: s(&self.v, self.dv * self.hv),
            g: s(&self.g, self.hv),
            beta: s(&self.beta, self.hv),
            ..*self
        }
    }
    fn run(&self, st: &mut LayerState) -> Vec<f32> {
        let q = Tensor::f32(Shape::d3(self.dk, self.hk, self.t), self.q.clone());
        let k = Tensor::f32(Shape::d3(self.dk, self.hk, self.t), self.k.clone());
        let v = Tensor::f32(Shape::d3(self.dv, self.hv, self.t), self.v.clone());
        let g = Tensor::f32(Shape::d2(self.hv, self.t), self.g.clone());
        let b = Tensor::f32(Shape::d2(self.hv, self.t), self.beta.clone());
        let ins = [
            Value::Act(&q),
            Value::Act(&k),
            Value::Act(&v),
            Value::Act(&g),
            Value::Act(&b),
        ];
        run(&Op::DeltaRule { state: 0 }, &ins, Some(st))
            .unwrap()
            .into_f32()
    }
    fn state(&self, seed: u32) -> LayerState {
        let mut r = RecurrentState::new(4, 1, self.hv, self.dk, self.dv);
        r.ssm = data(r.ssm.len(), seed);
        LayerState::Recurrent(r)
    }
}

fn ssm(st: &LayerState) -> &[f32] {
    match st {
        LayerState::Recurrent(r) => &r.ssm,
        _ => unreachable!(),
    }
}

#[test]
fn delta_rule_one_token_closed_form() {
    let c = DeltaCase::new(8, 2, 6, 4, 1, 10);
    let mut st = c.state(11);
    let s0 = ssm(&st).to_vec();
    let o = c.run(&mut st);
    let (dk, dv) = (c.dk, c.dv);
    for h in 0..c.hv {
        let kh = h % c.hk;
        let q = &c.q[kh * dk..][..dk];
        let k = &c.k[kh * dk..][..dk];
        let eg = (c.g[h] as f64).exp();
        let s = |i: usize, j: usize| s0[(h * dv + j) * dk + i] as f64; // S_h[i][j]
                                                                       // S1 = e^g S0 + k ⊗ β (v − e^g S0ᵀ k); o = S1ᵀ q / √dk
        for j in 0..dv {
            let kv: f64 = (0..dk).map(|i| eg * s(i, j) * k[i] as f64).sum();
            let delta = c.beta[h] as f64 * (c.v[h * dv + j] as f64 - kv);
            let s1 = |i: usize| eg * s(i, j) + k[i] as f64 * delta;
            let want: f64 = (0..dk).map(|i| s1(i) * q[i] as f64).sum::<f64>() / (dk as f64).sqrt();
            let got = o[h * dv + j] as f64;
            assert!((got - want).abs() < 1e-5, "h {h} j {j}: {got} vs {want}");
            for i in 0..dk {
                let new = ssm(&st)[(h * dv + j) * dk + i] as f64;
                assert!((new - s1(i)).abs() < 1e-5);
            }
        }
    }
}

/// HF-style naive recurrence in f64 with S[h][i][j].
fn naive(c: &DeltaCase, s0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (dk, dv, hv, hk) = (c.dk, c.dv, c.hv, c.hk);
    let mut s = vec![vec![vec![0.0f64; dv]; dk]; hv];
    for h in 0..hv {
        for j in 0..dv {
            for i in 0..dk {
                s[h][i][j] = s0[(h * dv + j) * dk + i] as f64;
            }
        }
    }
    let mut out = vec![0.0f64; dv * hv * c.t];
    for t in 0..c.t {
        for h in 0..hv {
            let kh = h % hk;
            let q: Vec<f64> = c.q[(t * hk + kh) * dk..][..dk]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let k: Vec<f64> = c.k[(t * hk + kh) * dk..][..dk]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let v: Vec<f64> = c.v[(t * hv + h) * dv..][..dv]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let decay = (c.g[t * hv + h] as f64).exp();
            let beta = c.beta[t * hv + h] as f64;
            let sh = &mut s[h];
            for row in sh.iter_mut() {
                for x in row.iter_mut() {
                    *x *= decay;
                }
            }
            let kv: Vec<f64> = (0..dv)
                .map(|j| (0..dk).map(|i| sh[i][j] * k[i]).sum())
                .collect();
            for i in 0..dk {
                for j in 0..dv {
                    sh[i][j] += k[i] * (v[j] - kv[j]) * beta;
                }
            }
            for j in 0..dv {
                out[(t * hv + h) * dv + j] =
                    (0..dk).map(|i| sh[i][j] * q[i]).sum::<f64>() / (dk as f64).sqrt();
            }
        }
    }
    let mut fin = vec![0.0f64; hv * dv * dk];
    for h in 0..hv {
        for j in 0..dv {
            for i in 0..dk {
                fin[(h * dv + j) * dk + i] = s[h][i][j];
            }
        }
    }
    (out, fin)
}

#[test]
fn delta_rule_70_tokens_vs_naive() {
    for (dk, dv) in [(8, 8), (4, 6)] {
        let c = DeltaCase::new(dk, 2, dv, 4, 70, 20);
        let mut st = c.state(21);
        let s0 = ssm(&st).to_vec();
        let o = c.run(&mut st);
        let (want_o, want_s) = naive(&c, &s0);
        for (i, (a, b)) in o.iter().zip(&want_o).enumerate() {
            assert!(
                (*a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "out {i}: {a} vs {b}"
            );
        }
        for (i, (a, b)) in ssm(&st).iter().zip(&want_s).enumerate() {
            assert!(
                (*a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "state {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn delta_rule_batch_split_is_bitwise() {
    let c = DeltaCase::new(8, 2, 8, 4, 70, 30);
    let mut a = c.state(31);
    let mut b = a.clone();
    let all = c.run(&mut a);
    let mut parts = c.tokens(0, 33).run(&mut b);
    parts.extend(c.tokens(33, 34).run(&mut b));
    parts.extend(c.tokens(34, 70).run(&mut b));
    assert_eq!(all, parts);
    assert_eq!(a, b);
}

#[test]
fn delta_rule_bad_state_is_error() {
    let c = DeltaCase::new(8, 2, 8, 4, 1, 40);
    let q = Tensor::f32(Shape::d3(8, 2, 1), c.q.clone());
    let v = Tensor::f32(Shape::d3(8, 4, 1), c.v.clone());
    let g = Tensor::f32(Shape::d2(4, 1), c.g.clone());
    let ins = [
        Value::Act(&q),
        Value::Act(&q),
        Value::Act(&v),
        Value::Act(&g),
        Value::Act(&g),
    ];
    let mut wrong = LayerState::Recurrent(RecurrentState::new(4, 1, 2, 8, 8));
    assert!(run(&Op::DeltaRule { state: 0 }, &ins, Some(&mut wrong)).is_err());
    let mut kv = LayerState::Kv(KvCache::new(1, 8, 4));
    assert!(run(&Op::DeltaRule { state: 0 }, &ins, Some(&mut kv)).is_err());
    assert!(run(&Op::DeltaRule { state: 0 }, &ins, None).is_err());
}

// ---------------------------------------------------------------- state shapes

/// The one state check ([`Op::state_shape`] inferred from the inputs, then
/// [`StateShape::check`]): each stateful op's expected state, and an error that says
/// what was expected and what was found for a state of another shape or kind, a KV cache
/// with buffers of other lengths, or none at all.
#[test]
fn state_shapes_are_inferred_and_checked_with_expected_and_found() {
    let (h, hkv, d, t) = (4, 2, 8, 3);
    let attn_call = attn;
    let attn = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 1.0, state: 0 };
    let a_ins = [
        TensorMeta::f32(Shape::d3(d, h, t)),
        TensorMeta::f32(Shape::d3(d, hkv, t)),
        TensorMeta::f32(Shape::d3(d, hkv, t)),
        TensorMeta::i32(Shape::d1(t)),
    ];
    assert_eq!(attn.state_shape(&a_ins), Some(StateShape::Kv { n_head_kv: hkv, head_dim: d }));
    let conv = Op::Conv1dCausal { d_conv: 4, state: 0 };
    let c_ins = [TensorMeta::f32(Shape::d2(6, t)), TensorMeta { shape: Shape::d2(4, 6), dtype: DType::Weight(GgmlType::F32) }];
    assert_eq!(conv.state_shape(&c_ins), Some(StateShape::Conv { d_conv: 4, channels: 6 }));
    let delta = Op::DeltaRule { state: 0 };
    let (dk, hk, dv, hv) = (4, 1, 5, 2);
    let qk = TensorMeta::f32(Shape::d3(dk, hk, t));
    let gb = TensorMeta::f32(Shape::d2(hv, t));
    let d_ins = [qk, qk, TensorMeta::f32(Shape::d3(dv, hv, t)), gb, gb];
    assert_eq!(delta.state_shape(&d_ins), Some(StateShape::Delta { hv, dk, dv }));
    assert_eq!(Op::Softmax.state_shape(&a_ins[..1]), None);

    // right shapes pass, in every KV format
    for ty in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        let kv = LayerState::Kv(KvCache::with_type(hkv, 32, 8, ty));
        attn_32(hkv).check_state(&a_ins_32(hkv), Some(&kv)).unwrap();
    }
    let rec = LayerState::Recurrent(RecurrentState::new(4, 6, hv, dk, dv));
    conv.check_state(&c_ins, Some(&rec)).unwrap();
    let rec_d = LayerState::Recurrent(RecurrentState::new(4, 6, hv, dk, dv));
    delta.check_state(&d_ins, Some(&rec_d)).unwrap();

    let msg = |r: Result<(), OpError>| match r {
        Err(OpError::Shape { expected, found, .. }) => format!("expected {expected}, found {found}"),
        other => panic!("expected a shape error, got {other:?}"),
    };
    let wrong_heads = LayerState::Kv(KvCache::new(1, d, 8));
    assert_eq!(msg(attn.check_state(&a_ins, Some(&wrong_heads))), "expected a KV cache of 2 heads × 8 dims, found a KV cache of 1 heads × 8 dims (8 cells, f32)");
    let mut short = KvCache::new(hkv, d, 8);
    short.k.pop();
    assert!(msg(attn.check_state(&a_ins, Some(&LayerState::Kv(short)))).ends_with("(8 cells, f32, buffers of other lengths)"));
    let kind = attn.check_state(&a_ins, Some(&rec)).unwrap_err().to_string();
    assert!(kind.starts_with("Attention: needs a KV cache of 2 heads × 8 dims, found a recurrent state"), "{kind}");
    let none = attn.check_state(&a_ins, None).unwrap_err();
    assert_eq!(none.to_string(), "Attention: needs a layer state: a KV cache of 2 heads × 8 dims");
    let other_channels = LayerState::Recurrent(RecurrentState::new(4, 7, hv, dk, dv));
    assert!(msg(conv.check_state(&c_ins, Some(&other_channels))).starts_with("expected a conv window of 3 × 6 channels, found a recurrent state: conv window of 21 values over 7 channels"));
    let other_heads = LayerState::Recurrent(RecurrentState::new(4, 6, hv + 1, dk, dv));
    assert!(msg(delta.check_state(&d_ins, Some(&other_heads))).contains("expected a delta-rule state of 2 V heads, Dk 4, Dv 5, found"));
    let none = delta.check_state(&d_ins, Some(&LayerState::None)).unwrap_err().to_string();
    assert!(none.ends_with("Dk 4, Dv 5, found no layer state"), "{none}");
    // the reference kernel (an op-level entry point) gives the same error, state untouched
    let mut st = wrong_heads.clone();
    let (q, k) = (data(h * d * t, 1), data(hkv * d * t, 2));
    match attn_call(h, hkv, d, &q, &k, &k, &[0, 1, 2], &mut st) {
        Err(OpError::Shape { op: "Attention", expected, found }) => assert_eq!((expected.as_str(), &found[..18]), ("a KV cache of 2 heads × 8 dims", "a KV cache of 1 he")),
        other => panic!("expected the state shape error, got {other:?}"),
    }
    assert_eq!(st, wrong_heads);
}

fn attn_32(hkv: usize) -> Op {
    Op::Attention { n_head: 2 * hkv, n_head_kv: hkv, head_dim: 32, scale: 1.0, state: 0 }
}

fn a_ins_32(hkv: usize) -> [TensorMeta; 4] {
    [
        TensorMeta::f32(Shape::d3(32, 2 * hkv, 1)),
        TensorMeta::f32(Shape::d3(32, hkv, 1)),
        TensorMeta::f32(Shape::d3(32, hkv, 1)),
        TensorMeta::i32(Shape::d1(1)),
    ]
}
