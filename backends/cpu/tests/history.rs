//! The per-token history of recurrent states (pn_ops::state::history) that the conv and
//! delta-rule kernels write while a state is recorded: after a pass of T tokens, a
//! rollback to any kept prefix gives bitwise the state of running only that prefix, on
//! the CPU kernels (one sequence and several in one call) and the reference kernels;
//! recording changes no output; a state not recorded is refused.

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::state::history::Recording;
use pn_ops::*;

const D_CONV: usize = 4;
const C: usize = 40;
const DK: usize = 16;
const HK: usize = 2;
const DV: usize = 16;
const HV: usize = 4;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

fn fresh() -> LayerState {
    let mut r = RecurrentState::new(D_CONV, C, HV, DK, DV);
    r.conv = data(r.conv.len(), 5);
    r.ssm = data(r.ssm.len(), 6).iter().map(|x| x * 0.1).collect();
    LayerState::Recurrent(r)
}

fn rec(s: &LayerState) -> &RecurrentState {
    match s {
        LayerState::Recurrent(r) => r,
        _ => unreachable!(),
    }
}
fn rec_mut(s: &mut LayerState) -> &mut RecurrentState {
    match s {
        LayerState::Recurrent(r) => r,
        _ => unreachable!(),
    }
}

/// The token range `a..b` of one sequence's inputs: conv x, then q, k, v, g, beta.
struct Inputs {
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    b: Vec<f32>,
    taps: Vec<u8>,
}

fn inputs(t: usize, seed: u32) -> Inputs {
    let taps: Vec<u8> = data(D_CONV * C, seed).iter().flat_map(|x| x.to_le_bytes()).collect();
    Inputs {
        x: data(t * C, seed + 1),
        q: data(t * DK * HK, seed + 2).iter().map(|x| x * 0.3).collect(),
        k: data(t * DK * HK, seed + 3).iter().map(|x| x * 0.3).collect(),
        v: data(t * DV * HV, seed + 4),
        g: data(t * HV, seed + 5).iter().map(|x| -(x + 1.0) * 0.2).collect(),
        b: data(t * HV, seed + 6).iter().map(|x| (x + 1.0) * 0.5).collect(),
        taps,
    }
}

/// One op on one state (a backend's or the reference's execute).
type Exec<'a> = dyn Fn(&Op, &[Value<'_>], &TensorMeta, &mut LayerState) -> Tensor + 'a;

fn slice(v: &[f32], per: usize, a: usize, b: usize) -> Vec<f32> {
    v[a * per..b * per].to_vec()
}

/// Runs conv + delta rule of tokens a..b on `st` with `exec` (a backend's or the
/// reference's execute); returns both outputs.
fn run(exec: &Exec<'_>, inp: &Inputs, a: usize, b: usize, st: &mut LayerState) -> (Vec<f32>, Vec<f32>) {
    let t = b - a;
    let w = WeightView { name: "taps", ty: GgmlType::F32, shape: Shape::d2(D_CONV, C), bytes: &inp.taps, rows16: None };
    let x = Tensor::f32(Shape::d2(C, t), slice(&inp.x, C, a, b));
    let conv = exec(&Op::Conv1dCausal { d_conv: D_CONV, state: 0 }, &[Value::Act(&x), Value::Weight(w)], &TensorMeta::f32(Shape::d2(C, t)), st);
    let q = Tensor::f32(Shape::d3(DK, HK, t), slice(&inp.q, DK * HK, a, b));
    let k = Tensor::f32(Shape::d3(DK, HK, t), slice(&inp.k, DK * HK, a, b));
    let v = Tensor::f32(Shape::d3(DV, HV, t), slice(&inp.v, DV * HV, a, b));
    let g = Tensor::f32(Shape::d2(HV, t), slice(&inp.g, HV, a, b));
    let bt = Tensor::f32(Shape::d2(HV, t), slice(&inp.b, HV, a, b));
    let ins = [Value::Act(&q), Value::Act(&k), Value::Act(&v), Value::Act(&g), Value::Act(&bt)];
    let o = exec(&Op::DeltaRule { state: 0 }, &ins, &TensorMeta::f32(Shape::d3(DV, HV, t)), st);
    (conv.into_f32(), o.into_f32())
}

fn check(name: &str, exec: &Exec<'_>) {
    let (head, t) = (3, 6);
    let inp = inputs(head + t, 11);
    for keep_hist in [t, 3] {
        let mut st = fresh();
        run(exec, &inp, 0, head, &mut st);
        let before = st.clone();
        let r = Recording::start([rec(&st)], keep_hist);
        let recorded = run(exec, &inp, head, head + t, &mut st);
        // recording changes no output and no live state
        let mut plain = before.clone();
        assert_eq!(run(exec, &inp, head, head + t, &mut plain), recorded, "{name}: outputs while recording");
        assert_eq!(rec(&plain), rec(&st), "{name}: live state while recording");
        // a clone is another state: the recording does not know it
        let mut c = st.clone();
        assert!(r.rollback(rec_mut(&mut c), t, t - 1).is_err(), "{name}: a clone rolled back");
        let reachable = t - keep_hist + 1..=t;
        // newest first: n_keep == t is the live state (nothing to do)
        for n_keep in (1..=t).rev() {
            let res = r.rollback(rec_mut(&mut st), t, n_keep);
            if !reachable.contains(&n_keep) {
                assert!(res.is_err(), "{name}: keep {n_keep} of {t} with history {keep_hist} should be out of reach");
                continue;
            }
            res.unwrap();
            let mut want = before.clone();
            run(exec, &inp, head, head + n_keep, &mut want);
            assert_eq!(rec(&st), rec(&want), "{name}: keep {n_keep} of {t} (history {keep_hist})");
        }
        // the same rollback again changes nothing (the kept state was swapped in: its
        // entry holds a later state now), and a kept prefix cannot grow back
        let low = t - keep_hist + 1;
        let now = rec(&st).clone();
        r.rollback(rec_mut(&mut st), t, low).unwrap();
        assert_eq!(rec(&st), &now, "{name}: the same rollback twice");
        assert!(r.rollback(rec_mut(&mut st), t, low + 1).is_err(), "{name}: keep {low} grew back to {}", low + 1);
        // the swapped-in state is a live state like any other: the pass's other tokens
        // continue from it to what running them all at once gives
        run(exec, &inp, head + low, head + t, &mut st);
        let mut want = before.clone();
        run(exec, &inp, head, head + t, &mut want);
        assert_eq!(rec(&st), rec(&want), "{name}: tokens {low}.. run again after the rollback (history {keep_hist})");
    }
}

fn cpu_exec(be: &CpuBackend, op: &Op, ins: &[Value<'_>], m: &TensorMeta, st: &mut LayerState) -> Tensor {
    let mut out = Tensor::f32(m.shape, vec![0.0; m.shape.numel()]);
    let mut go = || be.kernel_into(op, ins, m, Some(&mut *st), &mut out).unwrap();
    be.run_pass(&mut go);
    out
}

#[test]
fn cpu_kernels_record_and_roll_back_exactly() {
    for threads in [1, 2] {
        let be = CpuBackend::new(threads);
        check(&format!("cpu ×{threads}"), &|op, ins, m, st| cpu_exec(&be, op, ins, m, st));
    }
}

#[test]
fn reference_kernels_record_and_roll_back_exactly() {
    check("reference", &|op, ins, m, st| pn_ops::reference::execute(op, ins, m, Some(st)).unwrap());
}

/// Several sequences in one call (decode slots): each one's history is its own.
#[test]
fn cpu_multi_sequence_history_is_per_sequence() {
    let be = CpuBackend::new(2);
    let lens = [4usize, 3];
    let inp = [inputs(lens[0], 21), inputs(lens[1], 31)];
    let t: usize = lens.iter().sum();
    let spans = SeqSpan::table(&lens);
    let cat = |f: &dyn Fn(&Inputs) -> &Vec<f32>| [f(&inp[0]).as_slice(), f(&inp[1])].concat();
    let mut sts = [fresh(), fresh()];
    let recs: Vec<Recording> = sts.iter().zip(lens).map(|(s, n)| Recording::start([rec(s)], n)).collect();
    let x = Tensor::f32(Shape::d2(C, t), cat(&|i| &i.x));
    let w = WeightView { name: "taps", ty: GgmlType::F32, shape: Shape::d2(D_CONV, C), bytes: &inp[0].taps, rows16: None };
    let q = Tensor::f32(Shape::d3(DK, HK, t), cat(&|i| &i.q));
    let k = Tensor::f32(Shape::d3(DK, HK, t), cat(&|i| &i.k));
    let v = Tensor::f32(Shape::d3(DV, HV, t), cat(&|i| &i.v));
    let g = Tensor::f32(Shape::d2(HV, t), cat(&|i| &i.g));
    let b = Tensor::f32(Shape::d2(HV, t), cat(&|i| &i.b));
    let calls: [(Op, Vec<Value<'_>>, TensorMeta); 2] = [
        (Op::Conv1dCausal { d_conv: D_CONV, state: 0 }, vec![Value::Act(&x), Value::Weight(w)], TensorMeta::f32(Shape::d2(C, t))),
        (Op::DeltaRule { state: 0 }, vec![Value::Act(&q), Value::Act(&k), Value::Act(&v), Value::Act(&g), Value::Act(&b)], TensorMeta::f32(Shape::d3(DV, HV, t))),
    ];
    for (op, ins, m) in &calls {
        let mut out = Tensor::f32(m.shape, vec![0.0; m.shape.numel()]);
        let [s0, s1] = &mut sts;
        let mut states = [s0, s1];
        let mut go = || be.kernel_seqs(op, ins, m, &spans, &mut states, &mut out).unwrap();
        be.run_pass(&mut go);
    }
    for (i, st) in sts.iter_mut().enumerate() {
        // the second sequence's taps are the first's (one weight for the pass)
        let own = Inputs { taps: inp[0].taps.clone(), ..inputs(lens[i], [21, 31][i]) };
        for n_keep in (1..=lens[i]).rev() {
            recs[i].rollback(rec_mut(st), lens[i], n_keep).unwrap();
            let mut want = fresh();
            run(&|op, ins, m, s| cpu_exec(&be, op, ins, m, s), &own, 0, n_keep, &mut want);
            assert_eq!(rec(st), rec(&want), "sequence {i}: keep {n_keep} of {}", lens[i]);
        }
    }
}
