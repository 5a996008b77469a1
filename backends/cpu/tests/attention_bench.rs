//! Attention micro-benchmark (ignored; run with
//! `cargo test --release -p pn-cpu --test attention_bench -- --ignored --nocapture`):
//! µs per call for one decode token at positions 128 / 1024 / 4000 and a 512-token
//! prefill, head_dim 256, 16 query heads / 2 KV heads, f32 and q4_0 KV, 1 and 2 threads.
//! Also a parity check of the same geometry against the reference (not ignored).

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;
use std::time::Instant;

const H: usize = 16;
const HKV: usize = 2;
const D: usize = 256;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

/// A cache of `ty` with positions 0..n written (random keys/values).
fn filled(ty: KvType, cap: usize, n: usize) -> LayerState {
    let mut kv = KvCache::with_type(HKV, D, cap, ty);
    let k = data(D * n * HKV, 3);
    let v = data(D * n * HKV, 4);
    for p in 0..n {
        for g in 0..HKV {
            let o = (p * HKV + g) * D;
            kv.write(g, p, &k[o..o + D], &v[o..o + D]);
        }
    }
    LayerState::Kv(kv)
}

struct Call {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    p: Tensor,
    op: Op,
}

fn call(p0: usize, t: usize, seed: u32) -> Call {
    Call {
        q: Tensor::f32(Shape::d3(D, H, t), data(D * H * t, seed)),
        k: Tensor::f32(Shape::d3(D, HKV, t), data(D * HKV * t, seed + 1)),
        v: Tensor::f32(Shape::d3(D, HKV, t), data(D * HKV * t, seed + 2)),
        p: Tensor::i32(Shape::d1(t), (p0 as i32..(p0 + t) as i32).collect()),
        op: Op::Attention { n_head: H, n_head_kv: HKV, head_dim: D, scale: 1.0 / 16.0, state: 0 },
    }
}

impl Call {
    fn run(&self, be: &dyn HostKernels, st: &mut LayerState) -> Result<Tensor, OpError> {
        let ins = [Value::Act(&self.q), Value::Act(&self.k), Value::Act(&self.v), Value::Act(&self.p)];
        let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
        let out = self.op.infer(&metas).unwrap();
        be.execute(&self.op, &ins, &out, Some(st))
    }
    fn reference(&self, st: &mut LayerState) -> Tensor {
        let ins = [Value::Act(&self.q), Value::Act(&self.k), Value::Act(&self.v), Value::Act(&self.p)];
        let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
        let out = self.op.infer(&metas).unwrap();
        execute(&self.op, &ins, &out, Some(st)).unwrap()
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn bench_geometry_matches_the_reference() {
    // the benchmark's geometry (GQA group 8, d 256): decode at several positions and a
    // prefill, every format, 1/2/3 threads, bitwise
    let bes = [CpuBackend::new(1), CpuBackend::new(2), CpuBackend::new(3)];
    for ty in KvType::ALL {
        for (p0, t) in [(0, 1), (0, 37), (37, 1), (40, 9), (300, 1), (301, 70)] {
            let st = filled(ty, 512, p0);
            let c = call(p0, t, 7 + p0 as u32);
            let mut rs = st.clone();
            let want = bits(&c.reference(&mut rs));
            for be in &bes {
                let mut cs = st.clone();
                let got = bits(&c.run(be, &mut cs).unwrap());
                assert!(got == want, "{ty} p0 {p0} t {t}: {} threads differ", be.threads());
                assert!(cs == rs, "{ty} p0 {p0} t {t}: cache differs");
            }
        }
    }
}

#[test]
#[ignore]
fn bench_attention() {
    for threads in [1, 2] {
        let be = CpuBackend::new(threads);
        for ty in [KvType::F32, KvType::Q4_0] {
            for p in [128usize, 1024, 4000] {
                let st = filled(ty, 4096, p);
                let c = call(p, 1, 11);
                let mut s = st.clone();
                c.run(&be, &mut s).unwrap();
                let iters = (200_000 / p).clamp(20, 2000);
                let t0 = Instant::now();
                for _ in 0..iters {
                    c.run(&be, &mut s).unwrap();
                }
                let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
                println!("decode  threads {threads} kv {ty:5} pos {p:5}: {us:9.1} µs");
            }
            let c = call(0, 512, 13);
            let st = filled(ty, 4096, 0);
            let mut s = st.clone();
            c.run(&be, &mut s).unwrap();
            let iters = 3;
            let t0 = Instant::now();
            for _ in 0..iters {
                let mut s = st.clone();
                c.run(&be, &mut s).unwrap();
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            println!("prefill threads {threads} kv {ty:5} 512 tok : {us:9.1} µs");
        }
    }
}
