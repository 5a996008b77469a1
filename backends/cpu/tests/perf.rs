//! Rough timings of the hot kernels at qwen35moe-35B-A3B shapes (ignored by default):
//! `cargo test -p pn-cpu --release --test perf -- --ignored --nocapture`.

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::reference::common::meta_of;
use pn_ops::*;
use std::time::Instant;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

fn q4k(k: usize, rows: usize) -> Vec<u8> {
    let rb = GgmlType::Q4K.row_bytes(k).unwrap();
    let mut s = 12345u32;
    let mut out: Vec<u8> = (0..rb * rows)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 24) as u8
        })
        .collect();
    for blk in out.chunks_mut(144) {
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(0.002).to_le_bytes());
    }
    out
}

fn time(
    name: &str,
    be: &CpuBackend,
    op: &Op,
    ins: &[Value<'_>],
    st: Option<&LayerState>,
    reps: usize,
) {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas).unwrap();
    let mut s = st.cloned();
    be.execute(op, ins, &out, s.as_mut()).unwrap();
    let t0 = Instant::now();
    for _ in 0..reps {
        let mut s = st.cloned();
        be.execute(op, ins, &out, s.as_mut()).unwrap();
    }
    eprintln!(
        "{name:40} {:9.3} ms",
        t0.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
}

#[test]
#[ignore]
fn perf() {
    let be = CpuBackend::new(0);
    eprintln!("threads: {}", be.threads());
    let (k, n) = (2048, 8192);
    let wb = q4k(k, n);
    let w = WeightView {
        name: "w",
        ty: GgmlType::Q4K,
        shape: Shape::d2(k, n),
        bytes: &wb,
        rows16: None,
    };
    for t in [1, 64] {
        let x = Tensor::f32(Shape::d2(k, t), data(k * t, 1));
        time(
            &format!("matmul q4k 2048x8192 T={t}"),
            &be,
            &Op::MatMul,
            &[Value::Weight(w), Value::Act(&x)],
            None,
            5,
        );
    }
    let (dk, hk, hv) = (128, 16, 32);
    let mut r = RecurrentState::new(4, 1, hv, dk, dk);
    r.ssm = data(r.ssm.len(), 2);
    let st = LayerState::Recurrent(r);
    for t in [1, 64] {
        let q = Tensor::f32(Shape::d3(dk, hk, t), data(dk * hk * t, 3));
        let v = Tensor::f32(Shape::d3(dk, hv, t), data(dk * hv * t, 4));
        let g = Tensor::f32(Shape::d2(hv, t), vec![-0.1; hv * t]);
        let b = Tensor::f32(Shape::d2(hv, t), vec![0.5; hv * t]);
        let ins = [
            Value::Act(&q),
            Value::Act(&q),
            Value::Act(&v),
            Value::Act(&g),
            Value::Act(&b),
        ];
        time(
            &format!("delta rule 32x128x128 T={t}"),
            &be,
            &Op::DeltaRule { state: 0 },
            &ins,
            Some(&st),
            5,
        );
    }
    let (h, hkv, d, ctx) = (16, 2, 256, 4096);
    let mut kv = KvCache::new(hkv, d, ctx);
    kv.k = data(kv.k.len(), 5);
    kv.v = data(kv.v.len(), 6);
    let st = LayerState::Kv(kv);
    for (t, p0) in [(1, 4000), (64, 1000)] {
        let q = Tensor::f32(Shape::d3(d, h, t), data(d * h * t, 7));
        let kk = Tensor::f32(Shape::d3(d, hkv, t), data(d * hkv * t, 8));
        let pos = Tensor::i32(Shape::d1(t), (p0..p0 + t as i32).collect());
        let op = Op::Attention {
            n_head: h,
            n_head_kv: hkv,
            head_dim: d,
            scale: 0.0625,
            state: 0,
        };
        let ins = [
            Value::Act(&q),
            Value::Act(&kk),
            Value::Act(&kk),
            Value::Act(&pos),
        ];
        time(
            &format!("attention 16/2x256 at {p0} T={t}"),
            &be,
            &op,
            &ins,
            Some(&st),
            5,
        );
    }
    let (kd, f, e, top) = (2048, 512, 32, 8);
    let gu = q4k(kd, 2 * f * e);
    let dn = {
        let rb = GgmlType::Q4K.row_bytes(f).unwrap();
        let mut v = q4k(f * 4, kd * e / 4);
        v.truncate(rb * kd * e);
        v
    };
    let gu = WeightView {
        name: "gu",
        ty: GgmlType::Q4K,
        shape: Shape::d3(kd, 2 * f, e),
        bytes: &gu,
        rows16: None,
    };
    let dn = WeightView {
        name: "d",
        ty: GgmlType::Q4K,
        shape: Shape::d3(f, kd, e),
        bytes: &dn,
        rows16: None,
    };
    for t in [1, 64] {
        let x = Tensor::f32(Shape::d2(kd, t), data(kd * t, 9));
        let ids = Tensor::i32(
            Shape::d2(top, t),
            (0..top * t)
                .map(|i| ((i * 7 + i / top * 3) % e) as i32)
                .collect(),
        );
        let wt = Tensor::f32(Shape::d2(top, t), vec![0.125; top * t]);
        let ins = [
            Value::Act(&x),
            Value::Act(&ids),
            Value::Act(&wt),
            Value::Weight(gu),
            Value::Weight(dn),
        ];
        time(
            &format!("moe q4k 2048/512 top8 T={t}"),
            &be,
            &Op::MoeExperts {
                merged_gate_up: true,
            },
            &ins,
            None,
            3,
        );
    }
}
