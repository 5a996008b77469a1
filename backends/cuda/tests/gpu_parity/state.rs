//! Stateful op parity: attention over every KV-cache format (f32, f16, q8_0, q4_0 with
//! its sink / window shadows, Hadamard rotation, ring mode past capacity, GQA), the
//! delta rule's chunked form and wide V heads, and (with a device) graphs and events.
//! Without a device the backend under test is the reference (see `under_test`).

use super::{both, cpu, cuda, t32, under_test, Rng};
use pn_engine::HostKernels;
use pn_ops::{KvCache, KvType, LayerState, Op, RecurrentState, Shape, Tensor, Value};

fn attn_op(h: usize, hkv: usize, d: usize) -> Op {
    Op::Attention {
        n_head: h,
        n_head_kv: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        state: 0,
    }
}

/// q, k, v, positions of one attention step.
fn attn_inputs(rng: &mut Rng, h: usize, hkv: usize, d: usize, pos: &[i32]) -> [Tensor; 4] {
    let t = pos.len();
    [
        t32(Shape::d3(d, h, t), rng, 1.0),
        t32(Shape::d3(d, hkv, t), rng, 1.0),
        t32(Shape::d3(d, hkv, t), rng, 1.0),
        Tensor::i32(Shape::d1(t), pos.to_vec()),
    ]
}

fn run_cpu(op: &Op, x: &[Tensor; 4], state: &mut LayerState) {
    let ins = x.each_ref().map(Value::Act);
    let metas: Vec<_> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let out = op.infer(&metas).expect("valid op");
    cpu().execute(op, &ins, &out, Some(state)).expect("cpu");
}

/// A cache of format `ty` filled by `hist` (batches of positions `a..b`, on the CPU), then one
/// step at positions `pos` on both backends: output and the whole cache compared (the
/// cache byte for byte: cells, shadows).
#[allow(clippy::too_many_arguments)]
fn attn_case(
    what: &str,
    ty: KvType,
    (h, hkv, d): (usize, usize, usize),
    cap: usize,
    ring: bool,
    hist: &[(i32, i32)],
    pos: Vec<i32>,
) {
    let mut rng = Rng(0x5eed ^ (what.len() as u64 * 31));
    let op = attn_op(h, hkv, d);
    let mut kv = KvCache::with_type(hkv, d, cap, ty);
    kv.ring = ring;
    let mut state = LayerState::Kv(kv);
    for &(a, b) in hist {
        let p: Vec<i32> = (a..b).collect();
        run_cpu(&op, &attn_inputs(&mut rng, h, hkv, d, &p), &mut state);
    }
    let x = attn_inputs(&mut rng, h, hkv, d, &pos);
    both(what, &op, &x.each_ref().map(Value::Act), Some(state), 1e-10);
}

#[test]
fn attention_every_kv_type() {
    let gqa = (8, 2, 128);
    for ty in KvType::ALL {
        // decode at 100 (q4_0: sink 0..4, q4_0 cells 4..=36, window 37..=100)
        attn_case(
            &format!("Attention {ty} decode@100"),
            ty,
            gqa,
            256,
            false,
            &[(0, 100)],
            vec![100],
        );
        // a long prefill: several runs of ≤ SEG positions when there are window shadows
        attn_case(
            &format!("Attention {ty} prefill 10..170"),
            ty,
            gqa,
            256,
            false,
            &[(0, 10)],
            (10..170).collect(),
        );
        // head dim 64 (rotation chunk 64 for K too), one KV head per query head
        attn_case(
            &format!("Attention {ty} d64 MHA"),
            ty,
            (4, 4, 64),
            128,
            false,
            &[(0, 70)],
            (70..75).collect(),
        );
        // ring past capacity: a batch that wraps, then decode far past the capacity
        attn_case(
            &format!("Attention {ty} ring wrap"),
            ty,
            (8, 2, 64),
            48,
            true,
            &[(0, 40)],
            (40..70).collect(),
        );
        attn_case(
            &format!("Attention {ty} ring decode@150"),
            ty,
            (8, 2, 64),
            80,
            true,
            &[(0, 100), (100, 150)],
            vec![150],
        );
    }
    // head dim 40 is not a multiple of 32: the quantized formats store f16 cells
    attn_case(
        "Attention q4_0 (f16) d40",
        KvType::Q4_0,
        (4, 2, 40),
        64,
        false,
        &[(0, 20)],
        (20..23).collect(),
    );
}

#[test]
fn attention_prefill_then_decode() {
    // the shared state advanced on the CPU between steps, as a runner would
    let (d, h, hkv) = (64, 8, 2);
    let op = attn_op(h, hkv, d);
    for ty in KvType::ALL {
        let mut rng = Rng(5);
        let mut state = LayerState::Kv(KvCache::with_type(hkv, d, 96, ty));
        let mut p0 = 0;
        for t in [7usize, 1, 1, 5, 70, 1] {
            let pos: Vec<i32> = (p0..p0 + t as i32).collect();
            let x = attn_inputs(&mut rng, h, hkv, d, &pos);
            let what = format!("Attention {ty} T={t} at {p0}");
            both(
                &what,
                &op,
                &x.each_ref().map(Value::Act),
                Some(state.clone()),
                1e-10,
            );
            run_cpu(&op, &x, &mut state);
            p0 += t as i32;
        }
    }
}

/// max |a − b| / max |b|.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    let e = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).abs())
        .fold(0.0, f64::max);
    if m == 0.0 {
        e
    } else {
        e / m
    }
}

/// One delta-rule call on both backends from a random state, with inputs shaped like a
/// model's (unit q / k rows, log-decay g < 0, β in (0, 1)); output and state compared
/// by max relative error.
fn delta_case(what: &str, (dk, hk, dv, hv): (usize, usize, usize, usize), t: usize, tol: f64) {
    let mut rng = Rng(0xde17a ^ t as u64);
    let mut unit = |n: usize| -> Vec<f32> {
        let mut x = rng.vec(n * dk, 1.0);
        for r in x.chunks_mut(dk) {
            let s = r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v /= s);
        }
        x
    };
    let q = Tensor::f32(Shape::d3(dk, hk, t), unit(hk * t));
    let k = Tensor::f32(Shape::d3(dk, hk, t), unit(hk * t));
    let v = t32(Shape::d3(dv, hv, t), &mut rng, 1.0);
    let g = (0..hv * t).map(|_| -0.02 - 0.3 * rng.f().abs()).collect();
    let b = (0..hv * t).map(|_| 0.1 + 0.8 * rng.f().abs()).collect();
    let (g, b) = (
        Tensor::f32(Shape::d2(hv, t), g),
        Tensor::f32(Shape::d2(hv, t), b),
    );
    let mut st = RecurrentState::new(4, 8, hv, dk, dv);
    st.ssm = rng.vec(st.ssm.len(), 0.3);
    let ins = [&q, &k, &v, &g, &b].map(Value::Act);
    let op = Op::DeltaRule { state: 0 };
    let metas: Vec<_> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let out = op.infer(&metas).expect("valid op");
    let (mut s_cpu, mut s_dev) = (LayerState::Recurrent(st.clone()), LayerState::Recurrent(st));
    let want = cpu()
        .execute(&op, &ins, &out, Some(&mut s_cpu))
        .expect("cpu");
    let dev = under_test();
    let got = pn_engine::execute_op(&dev, &op, &ins, &out, Some(&mut s_dev))
        .unwrap_or_else(|e| panic!("{what}: {}: {e}", dev.name()));
    let (LayerState::Recurrent(sg), LayerState::Recurrent(sc)) = (s_dev, s_cpu) else {
        unreachable!()
    };
    let (ey, es) = (rel(got.as_f32(), want.as_f32()), rel(&sg.ssm, &sc.ssm));
    println!("{what:<40} rel y {ey:.2e} ssm {es:.2e}");
    assert!(
        ey <= tol && es <= tol,
        "{what}: rel y {ey:e} ssm {es:e} > {tol:e}"
    );
}

#[test]
fn delta_rule_chunked_vs_recurrent() {
    // The device's chunked form from 64 tokens (off by default, as on the CPU; process-wide:
    // tools/gpu-check.sh runs each test in its own process); the CPU runs the recurrence:
    // they agree to float reassociation.
    pn_cuda::set_delta_chunked_from(64);
    for (geo, t) in [
        ((64, 2, 64, 4), 64),
        ((32, 2, 48, 4), 150),
        ((128, 1, 128, 2), 200),
    ] {
        delta_case(&format!("DeltaRule chunked {geo:?} T={t}"), geo, t, 1e-4);
    }
    // the recurrence below the threshold: the reference's sums in its order
    delta_case("DeltaRule recurrent T=63", (64, 2, 64, 4), 63, 1e-5);
}

#[test]
fn delta_rule_wide_v_heads() {
    // Dv > 1024: rows of S tiled over blocks (recurrent, and chunked from 64 tokens)
    pn_cuda::set_delta_chunked_from(64);
    delta_case("DeltaRule Dv=1100 T=3", (32, 1, 1100, 2), 3, 1e-5);
    delta_case("DeltaRule Dv=1100 T=70", (32, 1, 1100, 2), 70, 1e-4);
}

#[test]
fn graphs_and_events_on_device() {
    let Some(gpu) = cuda() else {
        println!(
            "SKIPPED graphs_and_events_on_device: no GPU (host bookkeeping: pn-cuda unit tests)"
        );
        return;
    };
    let s = gpu.graph_selftest().expect("graph selftest");
    println!("graph selftest: {s:?}");
    assert_eq!(
        (s.captures, s.recaptures, s.replays, s.aborts),
        (2, 1, 3, 0)
    );
}
