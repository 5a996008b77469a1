//! `HostKernels::kernel_seqs` (a multi-sequence pass runs each stateful op for all its
//! sequences in one call; the CPU in one loop over (sequence, head) rows) is bitwise one
//! `execute` per sequence: outputs and updated states, 16 sequences at different
//! positions, decode tokens alone and mixed with multi-token chunks (one longer than the
//! CPU's shared-tile limit), Attention (f32 and q4_0 KV) and DeltaRule (Conv1dCausal:
//! tests/tests/slots.rs end to end), 1/2/3 threads. Plus an ignored timing of both.

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
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
    /// Per input: its token axis (where the sequences' tensors are concatenated).
    axes: Vec<usize>,
    lens: Vec<usize>,
}

/// Tokens of sequence `s` of `n`: one (decode), or with `mixed` a few sequences with
/// chunks of 2, 3 and 7 tokens.
fn len_of(s: usize, mixed: bool) -> usize {
    match (mixed, s % 5) {
        (true, 1) => 2,
        (true, 3) => 7,
        (true, 4) => 3,
        _ => 1,
    }
}

fn attention(ty: KvType, n: usize, mixed: bool) -> Case {
    let (h, hkv, d) = (8, 2, 64);
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 0.125, state: 0 };
    let mut ins = Vec::new();
    let mut states = Vec::new();
    let lens: Vec<usize> = (0..n).map(|s| len_of(s, mixed)).collect();
    for (s, &t) in lens.iter().enumerate() {
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
            Tensor::f32(Shape::d3(d, h, t), data(d * h * t, 300 + s as u32)),
            Tensor::f32(Shape::d3(d, hkv, t), data(d * hkv * t, 400 + s as u32)),
            Tensor::f32(Shape::d3(d, hkv, t), data(d * hkv * t, 500 + s as u32)),
            Tensor::i32(Shape::d1(t), (p..p + t).map(|x| x as i32).collect()),
        ]);
    }
    Case { op, ins, states, axes: vec![2, 2, 2, 0], lens }
}

fn delta(n: usize, mixed: bool) -> Case {
    let (dk, hk, dv, hv) = (32, 2, 32, 4);
    let mut ins = Vec::new();
    let mut states = Vec::new();
    let lens: Vec<usize> = (0..n).map(|s| len_of(s, mixed)).collect();
    for (s, &t) in lens.iter().enumerate() {
        let sd = 1000 + 10 * s as u32;
        let mut r = RecurrentState::new(4, 1, hv, dk, dv);
        r.ssm = data(r.ssm.len(), sd);
        states.push(LayerState::Recurrent(r));
        ins.push(vec![
            Tensor::f32(Shape::d3(dk, hk, t), data(dk * hk * t, sd + 1)),
            Tensor::f32(Shape::d3(dk, hk, t), data(dk * hk * t, sd + 2)),
            Tensor::f32(Shape::d3(dv, hv, t), data(dv * hv * t, sd + 3)),
            Tensor::f32(Shape::d2(hv, t), data(hv * t, sd + 4).iter().map(|x| -0.5 * (x + 1.0)).collect()),
            Tensor::f32(Shape::d2(hv, t), data(hv * t, sd + 5).iter().map(|x| 0.5 * (x + 1.0)).collect()),
        ]);
    }
    Case { op: Op::DeltaRule { state: 0 }, ins, states, axes: vec![2, 2, 2, 1, 1], lens }
}

impl Case {
    fn values(&self) -> Vec<Vec<Value<'_>>> {
        self.ins.iter().map(|v| v.iter().map(Value::Act).collect()).collect()
    }
    fn outs(&self, vals: &[Vec<Value<'_>>]) -> Vec<TensorMeta> {
        vals.iter().map(|v| self.op.infer(&v.iter().map(meta_of).collect::<Vec<_>>()).unwrap()).collect()
    }
    /// One `execute` per sequence, in order.
    fn alone(&self, be: &dyn HostKernels, states: &mut [LayerState]) -> Vec<Tensor> {
        let vals = self.values();
        let outs = self.outs(&vals);
        vals.iter().zip(&outs).zip(states.iter_mut()).map(|((v, o), s)| be.execute(&self.op, v, o, Some(s)).unwrap()).collect()
    }
    /// The sequences' inputs concatenated along their token axes, one `kernel_seqs`,
    /// the output cut back into one tensor per sequence.
    fn multi(&self, be: &dyn HostKernels, states: &mut [LayerState]) -> Vec<Tensor> {
        let vals = self.values();
        let outs = self.outs(&vals);
        let total: usize = self.lens.iter().sum();
        let cat: Vec<Tensor> = self
            .axes
            .iter()
            .enumerate()
            .map(|(i, &ax)| {
                let mut shape = self.ins[0][i].shape;
                shape.0[ax] = total;
                match &self.ins[0][i].data {
                    TensorData::F32(_) => Tensor::f32(shape, self.ins.iter().flat_map(|v| v[i].as_f32().to_vec()).collect()),
                    TensorData::I32(_) => Tensor::i32(shape, self.ins.iter().flat_map(|v| v[i].as_i32().to_vec()).collect()),
                }
            })
            .collect();
        let cv: Vec<Value<'_>> = cat.iter().map(Value::Act).collect();
        let meta = self.op.infer(&cv.iter().map(meta_of).collect::<Vec<_>>()).unwrap();
        let mut st: Vec<&mut LayerState> = states.iter_mut().collect();
        let mut out = Tensor::f32(Shape::d1(1), vec![0.0]);
        be.kernel_seqs(&self.op, &cv, &meta, &SeqSpan::table(&self.lens), &mut st, &mut out).unwrap();
        let mut at = 0;
        outs.iter()
            .map(|o| {
                let n = o.shape.numel();
                at += n;
                Tensor::f32(o.shape, out.as_f32()[at - n..at].to_vec())
            })
            .collect()
    }
}

fn cases(n: usize, mixed: bool) -> Vec<(&'static str, Case)> {
    vec![
        ("attention f32", attention(KvType::F32, n, mixed)),
        ("attention q4_0", attention(KvType::Q4_0, n, mixed)),
        ("delta rule", delta(n, mixed)),
    ]
}

#[test]
fn sixteen_sequences_execute_seqs_equals_one_by_one() {
    let bes = [CpuBackend::new(1), CpuBackend::new(2), CpuBackend::new(3)];
    for (name, case) in cases(16, false).into_iter().chain(cases(16, true)) {
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
        // the reference backend's default execute_seqs loops
        let mut rs = case.states.clone();
        let r: Vec<Vec<u32>> = case.multi(&pn_engine::ReferenceBackend, &mut rs).iter().map(bits).collect();
        if name.starts_with("attention") {
            assert!(r == want, "{name}: reference differs");
        }
    }
}

#[test]
#[ignore]
fn bench_execute_seqs() {
    let be = CpuBackend::new(2);
    for n in [4, 16] {
        for (name, case) in cases(n, false) {
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
            println!("{n:2} seqs {name:15}: one by one {a:8.1} µs, execute_seqs {m:8.1} µs");
        }
    }
}
