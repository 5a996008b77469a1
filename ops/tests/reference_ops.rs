//! Reference kernels, hand-checkable cases: norms, softmax, TopK, MoE weights,
//! element-wise ops, data movement, leaves and input validation.

use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;

fn run(op: &Op, ins: &[Value<'_>]) -> Result<Tensor, OpError> {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas)?;
    execute(op, ins, &out, None)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn wf32<'a>(shape: Shape, bytes: &'a [u8]) -> WeightView<'a> {
    WeightView {
        name: "w",
        ty: GgmlType::F32,
        shape,
        bytes,
        rows16: None,
    }
}

#[test]
fn leaves_are_invalid() {
    for op in [Op::Tokens, Op::Positions, Op::Weight { name: "x".into() }] {
        let out = TensorMeta::i32(Shape::d1(1));
        assert!(matches!(
            execute(&op, &[], &out, None),
            Err(OpError::Invalid { .. })
        ));
    }
}

#[test]
fn rms_norm_constant_row() {
    let x = Tensor::f32(Shape::d2(8, 2), vec![3.0; 16]);
    let y = run(&Op::RmsNorm { eps: 0.0 }, &[Value::Act(&x)]).unwrap();
    assert!(y.as_f32().iter().all(|&v| v == 1.0), "{:?}", y.as_f32());
    // With a weight (as a weight view and as an activation): y = w.
    let w: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 1.0).collect();
    let wb = f32_bytes(&w);
    let wt = Tensor::f32(Shape::d1(8), w.clone());
    for wv in [Value::Weight(wf32(Shape::d1(8), &wb)), Value::Act(&wt)] {
        let y = run(&Op::RmsNorm { eps: 0.0 }, &[Value::Act(&x), wv]).unwrap();
        assert_eq!(&y.as_f32()[..8], &w[..]);
        assert_eq!(&y.as_f32()[8..], &w[..]);
    }
    // eps: x = 1 → 1/sqrt(1 + eps)
    let x = Tensor::f32(Shape::d1(4), vec![1.0; 4]);
    let y = run(&Op::RmsNorm { eps: 3.0 }, &[Value::Act(&x)]).unwrap();
    assert!(y.as_f32().iter().all(|&v| v == 0.5));
}

#[test]
fn rms_norm_formula() {
    let xs = vec![1.0f32, -2.0, 0.5, 4.0, 3.0];
    let x = Tensor::f32(Shape::d1(5), xs.clone());
    let y = run(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&x)]).unwrap();
    let ss: f64 = xs.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = 1.0f32 / (((ss / 5.0) as f32) + 1e-6).sqrt();
    for (a, b) in y.as_f32().iter().zip(&xs) {
        assert_eq!(*a, b * scale);
    }
}

#[test]
fn l2_norm_unit_rows() {
    let x = Tensor::f32(Shape::d2(2, 2), vec![3.0, 4.0, 0.0, -2.0]);
    let y = run(&Op::L2Norm { eps: 0.0 }, &[Value::Act(&x)]).unwrap();
    let want = [0.6f32, 0.8, 0.0, -1.0];
    for (a, b) in y.as_f32().iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    // x / sqrt(Σx² + eps)
    let x = Tensor::f32(Shape::d1(4), vec![1.0, 1.0, 1.0, 1.0]);
    let y = run(&Op::L2Norm { eps: 5.0 }, &[Value::Act(&x)]).unwrap();
    assert!(y.as_f32().iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-6));
}

#[test]
fn softmax_rows() {
    let x = Tensor::f32(
        Shape::d2(5, 3),
        vec![
            0.1, -2.0, 3.0, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1000.0, 1000.0, -1000.0, 999.0, 0.0,
        ],
    );
    let y = run(&Op::Softmax, &[Value::Act(&x)]).unwrap();
    let y = y.as_f32();
    for r in 0..3 {
        let s: f32 = y[r * 5..(r + 1) * 5].iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "row {r} sums to {s}");
    }
    assert!(y[5..10].iter().all(|&v| (v - 0.2).abs() < 1e-7));
    assert!(y[10..].iter().all(|v| v.is_finite()));
    assert!(y[12] == 0.0 && y[10] == y[11]);
    // Order preserved.
    assert!(y[2] > y[3] && y[3] > y[0] && y[0] > y[4] && y[4] > y[1]);
}

#[test]
fn topk_ties_lower_index_first() {
    let x = Tensor::f32(
        Shape::d2(5, 2),
        vec![1.0, 3.0, 3.0, 2.0, 3.0, 0.0, -0.0, 5.0, -1.0, 0.0],
    );
    let y = run(&Op::TopK { k: 3 }, &[Value::Act(&x)]).unwrap();
    assert_eq!(y.as_i32(), &[1, 2, 4, 2, 0, 1]);
    let y = run(&Op::TopK { k: 5 }, &[Value::Act(&x)]).unwrap();
    assert_eq!(y.as_i32(), &[1, 2, 4, 3, 0, 2, 0, 1, 4, 3]);
    assert!(run(&Op::TopK { k: 6 }, &[Value::Act(&x)]).is_err());
}

#[test]
#[allow(clippy::excessive_precision)]
fn moe_weights_gather_normalize_clamp() {
    let p = Tensor::f32(
        Shape::d2(4, 2),
        vec![0.1, 0.2, 0.3, 0.4, 1e-6, 2e-6, 0.0, 0.0],
    );
    let ids = Tensor::i32(Shape::d2(2, 2), vec![3, 1, 1, 0]);
    let y = run(
        &Op::MoeWeights { normalize: false },
        &[Value::Act(&p), Value::Act(&ids)],
    )
    .unwrap();
    assert_eq!(y.as_f32(), &[0.4, 0.2, 2e-6, 1e-6]);
    let y = run(
        &Op::MoeWeights { normalize: true },
        &[Value::Act(&p), Value::Act(&ids)],
    )
    .unwrap();
    let y = y.as_f32();
    let s = 0.4f32 + 0.2;
    assert_eq!(&y[..2], &[0.4 / s, 0.2 / s]);
    // Σ = 3e-6 < clamp: divided by 6.103515625e-5.
    assert_eq!(&y[2..], &[2e-6 / 6.103515625e-5, 1e-6 / 6.103515625e-5]);
    let bad = Tensor::i32(Shape::d2(2, 2), vec![3, 4, 0, 0]);
    let e = run(
        &Op::MoeWeights { normalize: true },
        &[Value::Act(&p), Value::Act(&bad)],
    )
    .unwrap_err();
    assert!(matches!(e, OpError::Invalid { .. }));
    let neg = Tensor::i32(Shape::d2(2, 2), vec![3, -1, 0, 0]);
    assert!(run(
        &Op::MoeWeights { normalize: true },
        &[Value::Act(&p), Value::Act(&neg)]
    )
    .is_err());
}

#[test]
fn unary_values() {
    let x = Tensor::f32(Shape::d1(4), vec![0.0, 1.0, -3.0, 25.0]);
    let get = |u: UnaryOp| run(&Op::Unary(u), &[Value::Act(&x)]).unwrap().into_f32();
    let silu = get(UnaryOp::Silu);
    assert_eq!(silu[0], 0.0);
    assert_eq!(silu[1], 1.0 / (1.0 + (-1.0f32).exp()));
    assert_eq!(silu[2], -3.0 / (1.0 + 3.0f32.exp()));
    let sig = get(UnaryOp::Sigmoid);
    assert_eq!(sig[0], 0.5);
    assert_eq!(sig[2], 1.0 / (1.0 + 3.0f32.exp()));
    let sp = get(UnaryOp::Softplus);
    assert_eq!(sp[0], 2.0f32.ln());
    assert_eq!(sp[3], 25.0);
    assert_eq!(sp[2], (1.0 + (-3.0f32).exp()).ln());
    let ex = get(UnaryOp::Exp);
    assert_eq!(ex[1], 1.0f32.exp());
    assert_eq!(get(UnaryOp::Scale(-2.0)), vec![-0.0, -2.0, 6.0, -50.0]);
}

#[test]
fn binary_tiles_b_by_modulo() {
    let (a0, a1, a2) = (4, 3, 2);
    let a: Vec<f32> = (0..a0 * a1 * a2).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..4).map(|i| 100.0 * (i + 1) as f32).collect(); // [2, 1, 2]
    let at = Tensor::f32(Shape::d3(a0, a1, a2), a.clone());
    let bt = Tensor::f32(Shape::d3(2, 1, 2), b.clone());
    for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::SwiGlu] {
        let y = run(&Op::Binary(op), &[Value::Act(&at), Value::Act(&bt)])
            .unwrap()
            .into_f32();
        for i2 in 0..a2 {
            for i1 in 0..a1 {
                for i0 in 0..a0 {
                    let ia = (i2 * a1 + i1) * a0 + i0;
                    let bv = b[(i2 % 2) * 2 + i0 % 2];
                    let av = a[ia];
                    let want = match op {
                        BinaryOp::Add => av + bv,
                        BinaryOp::Mul => av * bv,
                        BinaryOp::SwiGlu => av / (1.0 + (-av).exp()) * bv,
                    };
                    assert_eq!(y[ia], want, "{op:?} at {i0},{i1},{i2}");
                }
            }
        }
    }
    // A bias weight [3] added to [3, 2] (e.g. ssm_dt.bias).
    let bias = [0.5f32, -1.0, 2.0];
    let bb = f32_bytes(&bias);
    let x = Tensor::f32(Shape::d2(3, 2), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run(
        &Op::Binary(BinaryOp::Add),
        &[Value::Act(&x), Value::Weight(wf32(Shape::d1(3), &bb))],
    )
    .unwrap();
    assert_eq!(y.as_f32(), &[1.5, 1.0, 5.0, 4.5, 4.0, 8.0]);
    // Non-tiling b is rejected.
    let bad = Tensor::f32(Shape::d1(2), vec![1.0, 2.0]);
    assert!(run(
        &Op::Binary(BinaryOp::Add),
        &[Value::Act(&x), Value::Act(&bad)]
    )
    .is_err());
}

#[test]
fn slices_and_reshape() {
    let x = Tensor::f32(Shape::d2(12, 2), (0..24).map(|i| i as f32).collect());
    let y = run(
        &Op::SliceCols {
            group: 6,
            offset: 2,
            len: 3,
        },
        &[Value::Act(&x)],
    )
    .unwrap();
    assert_eq!(y.shape, Shape::d2(6, 2));
    assert_eq!(
        y.as_f32(),
        &[2., 3., 4., 8., 9., 10., 14., 15., 16., 20., 21., 22.]
    );
    let x = Tensor::f32(Shape::d2(3, 4), (0..12).map(|i| i as f32).collect());
    let y = run(&Op::SliceRows { start: 1, len: 2 }, &[Value::Act(&x)]).unwrap();
    assert_eq!(y.shape, Shape::d2(3, 2));
    assert_eq!(y.as_f32(), &[3., 4., 5., 6., 7., 8.]);
    let y = run(&Op::Reshape(Shape::d3(2, 3, 2)), &[Value::Act(&x)]).unwrap();
    assert_eq!(y.shape, Shape::d3(2, 3, 2));
    assert_eq!(y.as_f32(), x.as_f32());
    let ids = Tensor::i32(Shape::d2(2, 2), vec![1, 2, 3, 4]);
    let y = run(&Op::Reshape(Shape::d1(4)), &[Value::Act(&ids)]).unwrap();
    assert_eq!(y.as_i32(), &[1, 2, 3, 4]);
}

#[test]
fn get_rows_f32_and_bad_ids() {
    let table: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    let tb = f32_bytes(&table);
    let w = wf32(Shape::d2(4, 3), &tb);
    let ids = Tensor::i32(Shape::d1(3), vec![2, 0, 2]);
    let y = run(&Op::GetRows, &[Value::Weight(w), Value::Act(&ids)]).unwrap();
    assert_eq!(y.shape, Shape::d2(4, 3));
    let y = y.as_f32();
    assert_eq!(&y[..4], &table[8..12]);
    assert_eq!(&y[4..8], &table[0..4]);
    for bad in [3, -1, i32::MAX] {
        let ids = Tensor::i32(Shape::d1(2), vec![0, bad]);
        match run(&Op::GetRows, &[Value::Weight(w), Value::Act(&ids)]) {
            Err(OpError::Invalid { msg, .. }) => {
                assert!(msg.contains(&bad.to_string()) && msg.contains('3'), "{msg}")
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }
}

#[test]
fn malformed_calls_are_errors() {
    let x = Tensor::f32(Shape::d2(4, 2), vec![1.0; 8]);
    // Output meta that does not match inference.
    let bad_out = TensorMeta::f32(Shape::d2(4, 3));
    assert!(execute(&Op::Softmax, &[Value::Act(&x)], &bad_out, None).is_err());
    // Wrong arity and wrong dtype.
    let out = TensorMeta::f32(Shape::d2(4, 2));
    assert!(execute(&Op::Softmax, &[], &out, None).is_err());
    let ids = Tensor::i32(Shape::d2(4, 2), vec![0; 8]);
    assert!(execute(&Op::Softmax, &[Value::Act(&ids)], &out, None).is_err());
    // A tensor whose data does not match its shape.
    let broken = Tensor {
        shape: Shape::d2(4, 2),
        data: TensorData::F32(vec![0.0; 3]),
    };
    assert!(execute(&Op::Softmax, &[Value::Act(&broken)], &out, None).is_err());
    // A weight with too few bytes.
    let short = [0u8; 8];
    let w = wf32(Shape::d2(4, 2), &short);
    let ids1 = Tensor::i32(Shape::d1(1), vec![0]);
    let out = TensorMeta::f32(Shape::d2(4, 1));
    assert!(execute(
        &Op::GetRows,
        &[Value::Weight(w), Value::Act(&ids1)],
        &out,
        None
    )
    .is_err());
    // Stateful op without state.
    let q = Tensor::f32(Shape::d3(4, 1, 1), vec![0.0; 4]);
    let pos = Tensor::i32(Shape::d1(1), vec![0]);
    let op = Op::Attention {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 4,
        scale: 0.5,
        state: 0,
    };
    let out = TensorMeta::f32(Shape::d2(4, 1));
    let ins = [
        Value::Act(&q),
        Value::Act(&q),
        Value::Act(&q),
        Value::Act(&pos),
    ];
    assert!(matches!(
        execute(&op, &ins, &out, None),
        Err(OpError::Invalid { .. })
    ));
    let mut wrong = LayerState::Recurrent(RecurrentState::new(4, 4, 1, 4, 4));
    assert!(matches!(
        execute(&op, &ins, &out, Some(&mut wrong)),
        Err(OpError::Invalid { .. })
    ));
}
