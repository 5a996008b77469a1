//! Op parity, CUDA vs the CPU backend (llama.cpp's test-backend-ops idea): every op on
//! random inputs, every native weight format, 1 token and many; compared by normalized
//! mean squared error (exact equality for ids and for quantized activation bytes).
//! Without a device the CUDA side is replaced by the reference backend (so the harness
//! itself is exercised in CI) and the device-only test prints why it skipped.

use pn_cpu::CpuBackend;
use pn_cuda::CudaBackend;
use pn_engine::{Backend, HostKernels};
use pn_ops::{
    BinaryOp, GgmlType, LayerState, Op, RecurrentState, RopeMode, Shape, Tensor, TensorMeta,
    UnaryOp, Value, WeightView,
};
use std::sync::{Arc, OnceLock};

/// Attention over every KV-cache format, the delta rule's two forms, graphs and events.
#[path = "gpu_parity/state.rs"]
mod state;

/// The resident protocol through the runner on a `cuda:0` die (device only).
#[path = "gpu_parity/resident.rs"]
mod resident;

/// The device backend, started once. Without a device: None, after one skip line; with
/// `PN_REQUIRE_CUDA=1` a failed start fails every test that asks, with the error.
fn cuda() -> Option<&'static Arc<CudaBackend>> {
    use pn_cuda::start::{decide, required, Outcome};
    static B: OnceLock<Result<Arc<CudaBackend>, pn_cuda::CudaError>> = OnceLock::new();
    static SAID: std::sync::Once = std::sync::Once::new();
    let started = B.get_or_init(|| CudaBackend::new(0).map(Arc::new)).as_ref().map_err(Clone::clone);
    match decide(started, |b| b.describe(), required(), "gpu_parity") {
        Outcome::Present(b, line) => {
            SAID.call_once(|| println!("{line}"));
            Some(b)
        }
        Outcome::Skip(line) => {
            SAID.call_once(|| println!("{line}: the harness runs against the reference backend"));
            None
        }
        Outcome::Fail(msg) => panic!("{msg}"),
    }
}

/// The backend under test: CUDA when a device is present; otherwise the reference
/// backend, so that CI without a GPU still runs every case of the harness (inputs,
/// shapes, states, tolerances) and a GPU session only meets device problems.
/// Both run ops through the one backend protocol (`pn_engine::execute_op`).
fn under_test() -> Arc<dyn Backend> {
    match cuda() {
        Some(b) => b.clone(),
        None => Arc::new(pn_engine::ReferenceBackend),
    }
}

fn cpu() -> &'static CpuBackend {
    static C: OnceLock<CpuBackend> = OnceLock::new();
    C.get_or_init(|| CpuBackend::new(2))
}

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn u(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f(&mut self) -> f32 {
        (self.u() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

fn f16b(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random but well-formed weight bytes: random blocks with their scale fields set to
/// small positive f16 values (and a moderate E8M0 exponent for MXFP4).
fn weight_bytes(rng: &mut Rng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    use GgmlType::*;
    let n = k * rows;
    match ty {
        F32 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        F16 => return rng.vec(n, 1.0).iter().flat_map(|v| f16b(*v)).collect(),
        BF16 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let (bs, bb) = (ty.block_size(), ty.row_bytes(ty.block_size()).unwrap());
    let mut out: Vec<u8> = (0..n / bs * bb).map(|_| rng.u() as u8).collect();
    let scales: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    };
    for b in out.chunks_mut(bb) {
        for &o in scales {
            let v = 0.002 + 0.01 * (rng.f().abs());
            b[o..o + 2].copy_from_slice(&f16b(v));
        }
        if ty == MXFP4 {
            b[0] = 120 + (rng.u() % 8) as u8;
        }
    }
    out
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

fn check(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    match (got.dtype(), want.dtype()) {
        (pn_ops::DType::I32, _) => assert_eq!(got.as_i32(), want.as_i32(), "{what}: ids"),
        _ => {
            let e = nmse(got.as_f32(), want.as_f32());
            println!("{what:<40} nmse {e:.3e}");
            assert!(e <= tol && e.is_finite(), "{what}: nmse {e:e} > {tol:e}");
        }
    }
}

/// Run `op` on both backends (with clones of `state`) and compare outputs and states.
fn both(what: &str, op: &Op, ins: &[Value<'_>], state: Option<LayerState>, tol: f64) {
    let gpu = under_test();
    let metas: Vec<TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let out = op.infer(&metas).expect("valid op");
    let (mut s_cpu, mut s_gpu) = (state.clone(), state);
    let want = cpu().execute(op, ins, &out, s_cpu.as_mut()).expect("cpu");
    let got = pn_engine::execute_op(&gpu, op, ins, &out, s_gpu.as_mut())
        .unwrap_or_else(|e| panic!("{what}: {}: {e}", gpu.name()));
    check(what, &got, &want, tol);
    match (s_gpu, s_cpu) {
        (Some(LayerState::Kv(g)), Some(LayerState::Kv(c))) => {
            // the device stores k/v byte for byte as KvCache::write: cells and shadows equal
            assert!(g.k == c.k && g.v == c.v, "{what}: f32 KV cells differ");
            assert!(
                g.kq == c.kq && g.vq == c.vq,
                "{what}: encoded KV cells differ"
            );
            assert!(g.shadow == c.shadow, "{what}: KV shadows differ");
            assert_eq!(g, c, "{what}: KV cache");
        }
        (Some(LayerState::Recurrent(g)), Some(LayerState::Recurrent(c))) => {
            let (ec, es) = (nmse(&g.conv, &c.conv), nmse(&g.ssm, &c.ssm));
            assert!(
                ec <= tol && es <= tol,
                "{what}: state nmse conv {ec:e} ssm {es:e}"
            );
        }
        _ => {}
    }
}

fn t32(shape: Shape, rng: &mut Rng, scale: f32) -> Tensor {
    Tensor::f32(shape, rng.vec(shape.numel(), scale))
}

fn wv<'a>(name: &'a str, ty: GgmlType, shape: Shape, bytes: &'a [u8]) -> Value<'a> {
    Value::Weight(WeightView {
        name,
        ty,
        shape,
        bytes,
        rows16: None,
    })
}

const NATIVE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
];

#[test]
fn activation_quantizers_match_bytes() {
    let Some(gpu) = cuda() else {
        println!("SKIPPED activation_quantizers_match_bytes: no GPU");
        return;
    };
    let mut rng = Rng(7);
    let k = 512;
    for &ty in NATIVE {
        for rows in [1, 5] {
            let x = rng.vec(k * rows, 3.0);
            let got = gpu.quantize_rows(ty, &x, k).expect("quantize");
            let at = pn_ops::quant::vec_dot_type(ty);
            let rb = at.row_bytes(k).unwrap();
            let mut want = vec![0u8; rb * rows];
            for r in 0..rows {
                pn_ops::quant::quantize_row(
                    at,
                    &x[r * k..(r + 1) * k],
                    &mut want[r * rb..(r + 1) * rb],
                );
            }
            assert_eq!(
                got,
                want,
                "{} activations ({}) for {rows} rows",
                at.name(),
                ty.name()
            );
        }
    }
}

#[test]
fn matmul_every_format() {
    let mut rng = Rng(1);
    let (k, n) = (512, 67);
    for &ty in NATIVE {
        let bytes = weight_bytes(&mut rng, ty, k, n);
        for t in [1, 9] {
            let x = t32(Shape::d2(k, t), &mut rng, 1.0);
            let ins = [wv("w", ty, Shape::d2(k, n), &bytes), Value::Act(&x)];
            both(
                &format!("MatMul {} T={t}", ty.name()),
                &Op::MatMul,
                &ins,
                None,
                1e-10,
            );
        }
    }
}

#[test]
fn get_rows_every_format() {
    let mut rng = Rng(2);
    let (k, vocab) = (256, 40);
    for &ty in NATIVE {
        let bytes = weight_bytes(&mut rng, ty, k, vocab);
        let ids = Tensor::i32(Shape::d1(5), vec![0, 39, 7, 7, 12]);
        let ins = [wv("tok", ty, Shape::d2(k, vocab), &bytes), Value::Act(&ids)];
        both(
            &format!("GetRows {}", ty.name()),
            &Op::GetRows,
            &ins,
            None,
            0.0,
        );
    }
}

#[test]
fn norms_softmax_elementwise() {
    let mut rng = Rng(3);
    for t in [1, 6] {
        let x = t32(Shape::d2(300, t), &mut rng, 2.0);
        let wb: Vec<u8> = rng
            .vec(300, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = wv("norm", GgmlType::F32, Shape::d1(300), &wb);
        both(
            "RmsNorm w",
            &Op::RmsNorm { eps: 1e-6 },
            &[Value::Act(&x), w],
            None,
            1e-12,
        );
        both(
            "RmsNorm",
            &Op::RmsNorm { eps: 1e-6 },
            &[Value::Act(&x)],
            None,
            1e-12,
        );
        both(
            "L2Norm",
            &Op::L2Norm { eps: 1e-6 },
            &[Value::Act(&x)],
            None,
            1e-12,
        );
        both("Softmax", &Op::Softmax, &[Value::Act(&x)], None, 1e-12);
        for u in [
            UnaryOp::Silu,
            UnaryOp::Sigmoid,
            UnaryOp::Softplus,
            UnaryOp::Exp,
            UnaryOp::Scale(0.37),
        ] {
            both(
                &format!("Unary {u:?}"),
                &Op::Unary(u),
                &[Value::Act(&x)],
                None,
                1e-12,
            );
        }
        let b_row = t32(Shape::d2(300, 1), &mut rng, 1.0);
        for b in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::SwiGlu] {
            let y = t32(Shape::d2(300, t), &mut rng, 1.0);
            both(
                &format!("Binary {b:?}"),
                &Op::Binary(b),
                &[Value::Act(&x), Value::Act(&y)],
                None,
                1e-12,
            );
            both(
                &format!("Binary {b:?} bcast"),
                &Op::Binary(b),
                &[Value::Act(&x), Value::Act(&b_row)],
                None,
                1e-12,
            );
            both(
                &format!("Binary {b:?} weight"),
                &Op::Binary(b),
                &[Value::Act(&x), w],
                None,
                1e-12,
            );
        }
        both(
            "SliceCols",
            &Op::SliceCols {
                group: 60,
                offset: 10,
                len: 25,
            },
            &[Value::Act(&x)],
            None,
            0.0,
        );
        both(
            "SliceRows",
            &Op::SliceRows {
                start: t / 2,
                len: t - t / 2,
            },
            &[Value::Act(&x)],
            None,
            0.0,
        );
        both(
            "Reshape",
            &Op::Reshape(Shape::d3(100, 3, t)),
            &[Value::Act(&x)],
            None,
            0.0,
        );
    }
}

#[test]
fn rope_neox_and_imrope() {
    let mut rng = Rng(4);
    for t in [1, 7] {
        let x = t32(Shape::d3(128, 4, t), &mut rng, 1.0);
        let pos = Tensor::i32(Shape::d1(t), (0..t as i32).map(|p| 3 + 50 * p).collect());
        let ff = Tensor::f32(Shape::d1(32), (0..32).map(|i| 1.0 + (i % 7) as f32).collect());
        for mode in [
            RopeMode::Normal,
            RopeMode::Neox,
            RopeMode::IMRope {
                sections: [11, 11, 10, 0],
            },
        ] {
            let op = Op::Rope {
                n_rot: 64,
                mode,
                freq_base: 10_000_000.0,
                freq_scale: 1.0,
            };
            both(
                &format!("Rope {mode:?} T={t}"),
                &op,
                &[Value::Act(&x), Value::Act(&pos)],
                None,
                1e-10,
            );
            both(
                &format!("Rope {mode:?} T={t} freq factors"),
                &op,
                &[Value::Act(&x), Value::Act(&pos), Value::Act(&ff)],
                None,
                1e-10,
            );
        }
    }
}

#[test]
fn conv_and_delta_rule() {
    let mut rng = Rng(6);
    let (c, d_conv, dk, dv, hk, hv) = (96, 4, 32, 48, 2, 4);
    for t in [1, 6] {
        let mut st = RecurrentState::new(d_conv, c, hv, dk, dv);
        st.conv = rng.vec(st.conv.len(), 1.0);
        st.ssm = rng.vec(st.ssm.len(), 0.5);
        let x = t32(Shape::d2(c, t), &mut rng, 1.0);
        let wb: Vec<u8> = rng
            .vec(c * d_conv, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = wv("conv", GgmlType::F32, Shape::d2(d_conv, c), &wb);
        let op = Op::Conv1dCausal { d_conv, state: 0 };
        both(
            &format!("Conv1dCausal T={t}"),
            &op,
            &[Value::Act(&x), w],
            Some(LayerState::Recurrent(st.clone())),
            1e-12,
        );
        let q = t32(Shape::d3(dk, hk, t), &mut rng, 0.3);
        let k = t32(Shape::d3(dk, hk, t), &mut rng, 0.3);
        let v = t32(Shape::d3(dv, hv, t), &mut rng, 1.0);
        let g = t32(Shape::d2(hv, t), &mut rng, 0.5);
        let beta = t32(Shape::d2(hv, t), &mut rng, 0.5);
        let ins = [
            Value::Act(&q),
            Value::Act(&k),
            Value::Act(&v),
            Value::Act(&g),
            Value::Act(&beta),
        ];
        both(
            &format!("DeltaRule T={t}"),
            &Op::DeltaRule { state: 0 },
            &ins,
            Some(LayerState::Recurrent(st)),
            1e-10,
        );
    }
}

#[test]
fn moe_routing_and_experts() {
    let mut rng = Rng(8);
    let (kd, f, e, top) = (256, 256, 8, 3);
    for t in [1, 5] {
        let logits = t32(Shape::d2(e, t), &mut rng, 2.0);
        both(
            &format!("TopK T={t}"),
            &Op::TopK { k: top },
            &[Value::Act(&logits)],
            None,
            0.0,
        );
        let probs = t32(Shape::d2(e, t), &mut rng, 1.0);
        let ids = Tensor::i32(
            Shape::d2(top, t),
            (0..top * t).map(|i| ((i * 5 + 3) % e) as i32).collect(),
        );
        for normalize in [false, true] {
            let op = Op::MoeWeights { normalize };
            both(
                &format!("MoeWeights {normalize} T={t}"),
                &op,
                &[Value::Act(&probs), Value::Act(&ids)],
                None,
                1e-12,
            );
        }
        let x = t32(Shape::d2(kd, t), &mut rng, 1.0);
        let wts = t32(Shape::d2(top, t), &mut rng, 1.0);
        for (gt, dt) in [
            (GgmlType::Q4K, GgmlType::Q6K),
            (GgmlType::MXFP4, GgmlType::Q8_0),
            (GgmlType::IQ4XS, GgmlType::Q5K),
        ] {
            let gate = weight_bytes(&mut rng, gt, kd, f * e);
            let up = weight_bytes(&mut rng, gt, kd, f * e);
            let gate_up = weight_bytes(&mut rng, gt, kd, 2 * f * e);
            let down = weight_bytes(&mut rng, dt, f, kd * e);
            let acts = [Value::Act(&x), Value::Act(&ids), Value::Act(&wts)];
            let split = [
                acts[0],
                acts[1],
                acts[2],
                wv("gate", gt, Shape::d3(kd, f, e), &gate),
                wv("up", gt, Shape::d3(kd, f, e), &up),
                wv("down", dt, Shape::d3(f, kd, e), &down),
            ];
            let what = format!("MoeExperts {}/{} T={t}", gt.name(), dt.name());
            both(
                &what,
                &Op::MoeExperts {
                    merged_gate_up: false,
                },
                &split,
                None,
                1e-10,
            );
            let merged = [
                acts[0],
                acts[1],
                acts[2],
                wv("gate_up", gt, Shape::d3(kd, 2 * f, e), &gate_up),
                wv("down", dt, Shape::d3(f, kd, e), &down),
            ];
            both(
                &format!("{what} merged"),
                &Op::MoeExperts {
                    merged_gate_up: true,
                },
                &merged,
                None,
                1e-10,
            );
        }
    }
}
