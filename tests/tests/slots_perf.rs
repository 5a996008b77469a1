//! `Backend::execute_multi` (decode slots run each stateful op for all sequences at once,
//! concurrently on the CPU pool) is bitwise one `execute` per sequence: outputs and
//! updated states, 16 sequences at different positions, Attention (f32 and q4_0 KV),
//! and DeltaRule (Conv1dCausal: tests/tests/slots.rs end to end), 1/2/3 threads. Plus an ignored timing of both.

use pn_cpu::CpuBackend;
use pn_engine::Backend;
use pn_ops::reference::common::meta_of;
use pn_ops::*;
use std::time::Instant;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().iter().map(|x| x.to_bits()).collect()
}

/// One op for 16 sequences: (op, per-sequence inputs, per-sequence states).
struct Case {
    op: Op,
    ins: Vec<Vec<Tensor>>,
    states: Vec<LayerState>,
}

fn attention(ty: KvType, n: usize) -> Case {
    let (h, hkv, d) = (8, 2, 64);
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 0.125, state: 0 };
    let mut ins = Vec::new();
    let mut states = Vec::new();
    for s in 0..n {
        let p = 3 + 11 * s; // different positions per sequence
        let mut kv = KvCache::with_type(hkv, d, 256, ty);
        let (k, v) = (data(d * hkv * p, 100 + s as u32), data(d * hkv * p, 200 + s as u32));
        for j in 0..p {
            for g in 0..hkv {
                let o = (j * hkv + g) * d;
                kv.write(g, j, &k[o..o + d], &v[o..o + d]);
            }
        }
        states.push(LayerState::Kv(kv));
        ins.push(vec![
            Tensor::f32(Shape::d3(d, h, 1), data(d * h, 300 + s as u32)),
            Tensor::f32(Shape::d3(d, hkv, 1), data(d * hkv, 400 + s as u32)),
            Tensor::f32(Shape::d3(d, hkv, 1), data(d * hkv, 500 + s as u32)),
            Tensor::i32(Shape::d1(1), vec![p as i32]),
        ]);
    }
    Case { op, ins, states }
}

fn delta(n: usize) -> Case {
    let (dk, hk, dv, hv) = (32, 2, 32, 4);
    let mut ins = Vec::new();
    let mut states = Vec::new();
    for s in 0..n {
        let sd = 1000 + 10 * s as u32;
        let mut r = RecurrentState::new(4, 1, hv, dk, dv);
        r.ssm = data(r.ssm.len(), sd);
        states.push(LayerState::Recurrent(r));
        ins.push(vec![
            Tensor::f32(Shape::d3(dk, hk, 1), data(dk * hk, sd + 1)),
            Tensor::f32(Shape::d3(dk, hk, 1), data(dk * hk, sd + 2)),
            Tensor::f32(Shape::d3(dv, hv, 1), data(dv * hv, sd + 3)),
            Tensor::f32(Shape::d2(hv, 1), data(hv, sd + 4).iter().map(|x| -0.5 * (x + 1.0)).collect()),
            Tensor::f32(Shape::d2(hv, 1), data(hv, sd + 5).iter().map(|x| 0.5 * (x + 1.0)).collect()),
        ]);
    }
    Case { op: Op::DeltaRule { state: 0 }, ins, states }
}

impl Case {
    fn values(&self) -> Vec<Vec<Value<'_>>> {
        self.ins.iter().map(|v| v.iter().map(Value::Act).collect()).collect()
    }
    fn outs(&self, vals: &[Vec<Value<'_>>]) -> Vec<TensorMeta> {
        vals.iter().map(|v| self.op.infer(&v.iter().map(meta_of).collect::<Vec<_>>()).unwrap()).collect()
    }
    /// One `execute` per sequence, in order.
    fn alone(&self, be: &dyn Backend, states: &mut [LayerState]) -> Vec<Tensor> {
        let vals = self.values();
        let outs = self.outs(&vals);
        vals.iter().zip(&outs).zip(states.iter_mut()).map(|((v, o), s)| be.execute(&self.op, v, o, Some(s)).unwrap()).collect()
    }
    fn multi(&self, be: &dyn Backend, states: &mut [LayerState]) -> Vec<Tensor> {
        let vals = self.values();
        let outs = self.outs(&vals);
        let mut st: Vec<Option<&mut LayerState>> = states.iter_mut().map(Some).collect();
        be.execute_multi(&self.op, &vals, &outs, &mut st).unwrap()
    }
}

fn cases(n: usize) -> Vec<(&'static str, Case)> {
    vec![
        ("attention f32", attention(KvType::F32, n)),
        ("attention q4_0", attention(KvType::Q4_0, n)),
        ("delta rule", delta(n)),
    ]
}

#[test]
fn sixteen_sequences_execute_multi_equals_one_by_one() {
    let bes = [CpuBackend::new(1), CpuBackend::new(2), CpuBackend::new(3)];
    for (name, case) in cases(16) {
        let mut want_states = case.states.clone();
        let want: Vec<Vec<u32>> = case.alone(&bes[0], &mut want_states).iter().map(bits).collect();
        for be in &bes {
            // twice: the second call continues from the updated states
            let mut st = case.states.clone();
            let got: Vec<Vec<u32>> = case.multi(be, &mut st).iter().map(bits).collect();
            assert!(got == want, "{name}: {} threads: outputs differ from one-by-one", be.threads());
            assert!(st == want_states, "{name}: {} threads: states differ", be.threads());
            let mut ws = want_states.clone();
            let w2: Vec<Vec<u32>> = case.alone(be, &mut ws).iter().map(bits).collect();
            let g2: Vec<Vec<u32>> = case.multi(be, &mut st).iter().map(bits).collect();
            assert!(g2 == w2 && st == ws, "{name}: {} threads: second step differs", be.threads());
        }
        // the reference backend's default execute_multi loops
        let mut rs = case.states.clone();
        let r: Vec<Vec<u32>> = case.multi(&pn_engine::ReferenceBackend, &mut rs).iter().map(bits).collect();
        if name.starts_with("attention") {
            assert!(r == want, "{name}: reference differs");
        }
    }
}

#[test]
#[ignore]
fn bench_execute_multi() {
    let be = CpuBackend::new(2);
    for n in [4, 16] {
        for (name, case) in cases(n) {
            let iters = 300;
            let mut st = case.states.clone();
            let t0 = Instant::now();
            for _ in 0..iters {
                st.clone_from(&case.states);
                case.alone(&be, &mut st);
            }
            let a = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            let t0 = Instant::now();
            for _ in 0..iters {
                st.clone_from(&case.states);
                case.multi(&be, &mut st);
            }
            let m = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            println!("{n:2} seqs {name:15}: one by one {a:8.1} µs, execute_multi {m:8.1} µs");
        }
    }
}
