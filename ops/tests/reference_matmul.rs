//! Reference MatMul / GetRows / MoeExperts with F32, F16 and Q8_0 weights made by hand.

use pn_ops::quant::{dequantize_row, quantize_row, vec_dot_type};
use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;

fn run(op: &Op, ins: &[Value<'_>]) -> Result<Tensor, OpError> {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas)?;
    execute(op, ins, &out, None)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 777)
}

/// Encode rows of `k` floats as `ty` weight blocks.
fn encode(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let rb = ty.row_bytes(k).unwrap();
    let mut out = vec![0u8; x.len() / k * rb];
    for (r, o) in out.chunks_mut(rb).enumerate() {
        let row = &x[r * k..(r + 1) * k];
        match ty {
            GgmlType::F32 => {
                o.copy_from_slice(&row.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
            }
            GgmlType::F16 => o.copy_from_slice(
                &row.iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
            _ => quantize_row(ty, row, o),
        }
    }
    out
}

fn decode(ty: GgmlType, bytes: &[u8], k: usize) -> Vec<f32> {
    let rb = ty.row_bytes(k).unwrap();
    let mut out = vec![0.0f32; bytes.len() / rb * k];
    for (r, o) in out.chunks_mut(k).enumerate() {
        dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], o).unwrap();
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

/// What the activation looks like after the conversion to the vec-dot type.
fn act_round(wty: GgmlType, x: &[f32], k: usize) -> Vec<f32> {
    let at = vec_dot_type(wty);
    decode(at, &encode(at, x, k), k)
}

#[test]
fn matmul_against_naive_per_type() {
    for (ty, k, tol) in [
        (GgmlType::F32, 37, 1e-5),
        (GgmlType::F16, 64, 1e-4),
        (GgmlType::Q8_0, 96, 1e-4),
    ] {
        let (n, t) = (7, 3);
        let w = data(k * n, 1);
        let wb = encode(ty, &w, k);
        let wd = decode(ty, &wb, k);
        let x = data(k * t, 2);
        let xt = Tensor::f32(Shape::d2(k, t), x.clone());
        let y = run(
            &Op::MatMul,
            &[
                Value::Weight(view(ty, Shape::d2(k, n), &wb)),
                Value::Act(&xt),
            ],
        )
        .unwrap();
        assert_eq!(y.shape, Shape::d2(n, t));
        let xr = act_round(ty, &x, k);
        for ti in 0..t {
            for r in 0..n {
                let want: f64 = (0..k)
                    .map(|i| wd[r * k + i] as f64 * xr[ti * k + i] as f64)
                    .sum();
                let got = y.as_f32()[ti * n + r] as f64;
                assert!(
                    (got - want).abs() <= tol * (1.0 + want.abs()),
                    "{ty} t {ti} r {r}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn matmul_batch_equals_single_tokens() {
    let (k, n, t) = (64, 5, 4);
    let wb = encode(GgmlType::Q8_0, &data(k * n, 3), k);
    let w = view(GgmlType::Q8_0, Shape::d2(k, n), &wb);
    let x = data(k * t, 4);
    let all = run(
        &Op::MatMul,
        &[
            Value::Weight(w),
            Value::Act(&Tensor::f32(Shape::d2(k, t), x.clone())),
        ],
    )
    .unwrap()
    .into_f32();
    for ti in 0..t {
        let xt = Tensor::f32(Shape::d2(k, 1), x[ti * k..(ti + 1) * k].to_vec());
        let one = run(&Op::MatMul, &[Value::Weight(w), Value::Act(&xt)])
            .unwrap()
            .into_f32();
        assert_eq!(&all[ti * n..(ti + 1) * n], &one[..]);
    }
}

#[test]
fn get_rows_dequantizes() {
    let (k, v) = (64, 6);
    for ty in [GgmlType::F16, GgmlType::Q8_0] {
        let wb = encode(ty, &data(k * v, 5), k);
        let wd = decode(ty, &wb, k);
        let ids = Tensor::i32(Shape::d1(3), vec![5, 0, 3]);
        let y = run(
            &Op::GetRows,
            &[
                Value::Weight(view(ty, Shape::d2(k, v), &wb)),
                Value::Act(&ids),
            ],
        )
        .unwrap()
        .into_f32();
        for (t, &id) in [5usize, 0, 3].iter().enumerate() {
            assert_eq!(&y[t * k..(t + 1) * k], &wd[id * k..(id + 1) * k]);
        }
    }
}

struct Experts {
    k: usize,
    f: usize,
    e: usize,
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
    gate_up: Vec<u8>,
    gty: GgmlType,
    uty: GgmlType,
    dty: GgmlType,
}

fn experts(gty: GgmlType, uty: GgmlType, dty: GgmlType) -> Experts {
    let (k, f, e) = (64, 32, 5);
    let g = data(k * f * e, 6);
    let u = data(k * f * e, 7);
    let d = data(f * k * e, 8);
    let mut gu = Vec::new();
    for x in 0..e {
        gu.extend_from_slice(&g[x * k * f..(x + 1) * k * f]);
        gu.extend_from_slice(&u[x * k * f..(x + 1) * k * f]);
    }
    Experts {
        k,
        f,
        e,
        gate: encode(gty, &g, k),
        up: encode(uty, &u, k),
        down: encode(dty, &d, f),
        gate_up: encode(gty, &gu, k),
        gty,
        uty,
        dty,
    }
}

fn moe(
    ex: &Experts,
    merged: bool,
    x: &Tensor,
    ids: &Tensor,
    w: &Tensor,
) -> Result<Vec<f32>, OpError> {
    let (k, f, e) = (ex.k, ex.f, ex.e);
    let down = view(ex.dty, Shape::d3(f, k, e), &ex.down);
    let r = if merged {
        let gu = view(ex.gty, Shape::d3(k, 2 * f, e), &ex.gate_up);
        run(
            &Op::MoeExperts {
                merged_gate_up: true,
            },
            &[
                Value::Act(x),
                Value::Act(ids),
                Value::Act(w),
                Value::Weight(gu),
                Value::Weight(down),
            ],
        )
    } else {
        let g = view(ex.gty, Shape::d3(k, f, e), &ex.gate);
        let u = view(ex.uty, Shape::d3(k, f, e), &ex.up);
        run(
            &Op::MoeExperts {
                merged_gate_up: false,
            },
            &[
                Value::Act(x),
                Value::Act(ids),
                Value::Act(w),
                Value::Weight(g),
                Value::Weight(u),
                Value::Weight(down),
            ],
        )
    };
    r.map(|t| t.into_f32())
}

#[test]
fn moe_experts_equals_composed_ops() {
    let ex = experts(GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0);
    let (k, f, e, t, top) = (ex.k, ex.f, ex.e, 3, 2);
    let x = data(k * t, 9);
    let xt = Tensor::f32(Shape::d2(k, t), x.clone());
    let ids = Tensor::i32(Shape::d2(top, t), vec![4, 1, 0, 4, 2, 3]);
    let w = Tensor::f32(Shape::d2(top, t), vec![0.7, 0.3, 0.55, 0.45, 0.9, 0.1]);
    let y = moe(&ex, false, &xt, &ids, &w).unwrap();
    let g3 = view(ex.gty, Shape::d3(k, f, e), &ex.gate);
    let u3 = view(ex.uty, Shape::d3(k, f, e), &ex.up);
    let d3 = view(ex.dty, Shape::d3(f, k, e), &ex.down);
    for ti in 0..t {
        let xi = Tensor::f32(Shape::d2(k, 1), x[ti * k..(ti + 1) * k].to_vec());
        let mut acc = vec![0.0f32; k];
        for r in 0..top {
            let id = ids.as_i32()[ti * top + r] as usize;
            let g = run(
                &Op::MatMul,
                &[Value::Weight(g3.expert(id)), Value::Act(&xi)],
            )
            .unwrap();
            let u = run(
                &Op::MatMul,
                &[Value::Weight(u3.expert(id)), Value::Act(&xi)],
            )
            .unwrap();
            let h = run(
                &Op::Binary(BinaryOp::SwiGlu),
                &[Value::Act(&g), Value::Act(&u)],
            )
            .unwrap();
            let o = run(&Op::MatMul, &[Value::Weight(d3.expert(id)), Value::Act(&h)]).unwrap();
            let wr = w.as_f32()[ti * top + r];
            for (a, &v) in acc.iter_mut().zip(o.as_f32()) {
                *a += v * wr;
            }
        }
        assert_eq!(&y[ti * k..(ti + 1) * k], &acc[..], "token {ti}");
    }
}

#[test]
fn moe_merged_equals_split() {
    let ex = experts(GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::F16);
    let t = 4;
    let xt = Tensor::f32(Shape::d2(ex.k, t), data(ex.k * t, 10));
    let ids = Tensor::i32(Shape::d2(3, t), vec![0, 1, 2, 4, 3, 2, 2, 0, 1, 1, 4, 3]);
    let w = Tensor::f32(Shape::d2(3, t), data(3 * t, 11));
    assert_eq!(
        moe(&ex, true, &xt, &ids, &w).unwrap(),
        moe(&ex, false, &xt, &ids, &w).unwrap()
    );
}

#[test]
fn moe_bad_expert_id_is_error() {
    let ex = experts(GgmlType::F32, GgmlType::F32, GgmlType::F32);
    let xt = Tensor::f32(Shape::d2(ex.k, 1), data(ex.k, 12));
    let w = Tensor::f32(Shape::d2(2, 1), vec![0.5, 0.5]);
    for bad in [5, -1] {
        let ids = Tensor::i32(Shape::d2(2, 1), vec![0, bad]);
        match moe(&ex, false, &xt, &ids, &w) {
            Err(OpError::Invalid { msg, .. }) => assert!(msg.contains(&bad.to_string()), "{msg}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }
}
