//! The chunked gated delta rule (spec §4.4.5) and the vectorized recurrence against the
//! reference recurrence (§4.4.4): outputs and final state within 1e-4 relative, for T
//! around the chunk size, with a non-zero initial state; and batch vs token-by-token.

use pn_cpu::delta_chunk::{chunked, recurrent, HeadIn, Scratch, CHUNK};
use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

/// L2-normalized rows (as the model feeds q and k).
fn unit_rows(n: usize, d: usize, seed: u32) -> Vec<f32> {
    let mut x = data(n * d, seed);
    for r in x.chunks_mut(d) {
        let s = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        r.iter_mut().for_each(|v| *v /= s);
    }
    x
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let m = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |e, (x, y)| e.max((x - y).abs())) / m
}

/// The reference (sequential) recurrence for one head, state [Dv][Dk], out [T][Dv].
fn reference(q: &[f32], k: &[f32], v: &[f32], g: &[f32], b: &[f32], d: usize, s: &mut [f32]) -> Vec<f32> {
    let t = g.len();
    let scale = 1.0 / (d as f32).sqrt();
    let mut o = vec![0f32; t * d];
    for ti in 0..t {
        let (qt, kt, vt) = (&q[ti * d..][..d], &k[ti * d..][..d], &v[ti * d..][..d]);
        let decay = g[ti].exp();
        s.iter_mut().for_each(|x| *x *= decay);
        for j in 0..d {
            let kv: f32 = (0..d).fold(0.0, |a, i| a + s[j * d + i] * kt[i]);
            let dj = (vt[j] - kv) * b[ti];
            for i in 0..d {
                s[j * d + i] += kt[i] * dj;
            }
            o[ti * d + j] = (0..d).fold(0.0, |a, i| a + s[j * d + i] * qt[i]) * scale;
        }
    }
    o
}

#[test]
fn chunked_and_recurrent_match_reference() {
    let d = 128;
    for t in [1usize, 2, 15, 63, 64, 65, 130] {
        for (gscale, seed) in [(0.1f32, 1u32), (2.0, 2)] {
            let q = unit_rows(t, d, 10 + seed);
            let k = unit_rows(t, d, 20 + seed);
            let v = data(t * d, 30 + seed);
            let g: Vec<f32> = data(t, 40 + seed).iter().map(|x| -gscale * (x + 1.0)).collect();
            let b: Vec<f32> = data(t, 50 + seed).iter().map(|x| 0.5 * (x + 1.0)).collect();
            let s0 = data(d * d, 60 + seed);
            let mut sr = s0.clone();
            let want = reference(&q, &k, &v, &g, &b, d, &mut sr);
            let p = HeadIn { q: &q, k: &k, v: &v, g: &g, beta: &b, qk_stride: d, v_stride: d, gb_stride: 1, dk: d, dv: d, t };
            let (mut sc, mut s1, mut o1) = (Scratch::default(), s0.clone(), vec![0f32; t * d]);
            chunked(&p, &mut s1, &mut o1, &mut sc);
            let (mut s2, mut o2) = (s0.clone(), vec![0f32; t * d]);
            recurrent(&p, &mut s2, &mut o2);
            for (name, o, s) in [("chunked", &o1, &s1), ("recurrent", &o2, &s2)] {
                let (eo, es) = (max_rel(o, &want), max_rel(s, &sr));
                assert!(eo <= 1e-4 && es <= 1e-4, "{name} T={t} g×{gscale}: out {eo:e}, state {es:e}");
            }
        }
    }
    assert_eq!(CHUNK, 64);
}

/// The op on the CPU backend: one pass over 130 tokens vs the reference, and vs feeding
/// the tokens in pieces (state carried), within 1e-4.
#[test]
fn op_batch_vs_pieces() {
    let (dk, hk, dv, hv, t) = (128usize, 2usize, 128usize, 4usize, 130usize);
    let q = Tensor::f32(Shape::d3(dk, hk, t), unit_rows(hk * t, dk, 1));
    let k = Tensor::f32(Shape::d3(dk, hk, t), unit_rows(hk * t, dk, 2));
    let v = Tensor::f32(Shape::d3(dv, hv, t), data(dv * hv * t, 3));
    let g = Tensor::f32(Shape::d2(hv, t), data(hv * t, 4).iter().map(|x| -0.3 * (x + 1.0)).collect());
    let b = Tensor::f32(Shape::d2(hv, t), data(hv * t, 5).iter().map(|x| 0.5 * (x + 1.0)).collect());
    let mut r = RecurrentState::new(4, 1, hv, dk, dv);
    r.ssm = data(r.ssm.len(), 6);
    let st = LayerState::Recurrent(r);
    let op = Op::DeltaRule { state: 0 };
    let run = |be: Option<&CpuBackend>, t0: usize, t1: usize, s: &mut LayerState| -> Vec<f32> {
        let n = t1 - t0;
        let sl = |x: &Tensor, w: usize, h: usize| Tensor::f32(if h == 0 { Shape::d2(w, n) } else { Shape::d3(w, h, n) }, x.as_f32()[t0 * w * h.max(1)..t1 * w * h.max(1)].to_vec());
        let (q, k, v, g, b) = (sl(&q, dk, hk), sl(&k, dk, hk), sl(&v, dv, hv), sl(&g, hv, 0), sl(&b, hv, 0));
        let ins = [Value::Act(&q), Value::Act(&k), Value::Act(&v), Value::Act(&g), Value::Act(&b)];
        let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
        let out = op.infer(&metas).unwrap();
        let y = match be {
            Some(be) => be.execute(&op, &ins, &out, Some(s)).unwrap(),
            None => execute(&op, &ins, &out, Some(s)).unwrap(),
        };
        y.as_f32().to_vec()
    };
    let ssm = |s: &LayerState| match s {
        LayerState::Recurrent(r) => r.ssm.clone(),
        _ => unreachable!(),
    };
    let mut sref = st.clone();
    let want = run(None, 0, t, &mut sref);
    let be = CpuBackend::new(2);
    let mut sb = st.clone();
    let batch = run(Some(&be), 0, t, &mut sb);
    assert!(max_rel(&batch, &want) <= 1e-4 && max_rel(&ssm(&sb), &ssm(&sref)) <= 1e-4);
    let mut sp = st.clone();
    let mut pieces = Vec::new();
    for (a, z) in [(0, 1), (1, 64), (64, 65), (65, 100), (100, 130)] {
        pieces.extend(run(Some(&be), a, z, &mut sp));
    }
    assert!(max_rel(&pieces, &want) <= 1e-4 && max_rel(&ssm(&sp), &ssm(&sref)) <= 1e-4);
}

/// Denormal floats in the state (what a strongly decayed head drifts into) are flushed
/// to zero by every form of the CPU delta rule: bitwise the run with those entries zeroed,
/// none left in the state; and the thread's floating-point control word is as before.
/// (Where k is zero in a column, nothing but the decay touches that column of the state,
/// so a kept denormal would survive the pass and the states would differ.)
#[test]
fn denormals_flush_to_zero() {
    let (d, t) = (128usize, 20usize);
    let q = unit_rows(t, d, 1);
    let mut k = unit_rows(t, d, 2);
    for row in k.chunks_mut(d) {
        row[..16].iter_mut().for_each(|x| *x = 0.0);
    }
    let v = data(t * d, 3);
    let g: Vec<f32> = data(t, 4).iter().map(|x| -0.3 * (x + 1.0)).collect();
    let b: Vec<f32> = data(t, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
    let p = HeadIn { q: &q, k: &k, v: &v, g: &g, beta: &b, qk_stride: d, v_stride: d, gb_stride: 1, dk: d, dv: d, t };
    let normal = data(d * d, 6);
    // columns 0..16 of every row denormal (k is zero there), the rest as `normal`
    let tiny: Vec<f32> = normal.iter().enumerate().map(|(i, &x)| if i % d < 16 { x * 1e-39 } else { x }).collect();
    assert!(tiny.iter().any(|x| x.is_subnormal()));
    let zeroed: Vec<f32> = tiny.iter().map(|&x| if x.is_subnormal() { 0.0 } else { x }).collect();
    let csr_before = mxcsr();
    for form in ["recurrent", "chunked"] {
        let run = |st: &[f32]| {
            let (mut st, mut o) = (st.to_vec(), vec![0f32; t * d]);
            match form {
                "recurrent" => recurrent(&p, &mut st, &mut o),
                _ => chunked(&p, &mut st, &mut o, &mut Scratch::default()),
            }
            (st, o)
        };
        let (st_t, o_t) = run(&tiny);
        let (st_z, o_z) = run(&zeroed);
        assert!(st_t.iter().all(|x| !x.is_subnormal()), "{form}: denormals left in the state");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&st_t), bits(&st_z), "{form}: state");
        assert_eq!(bits(&o_t), bits(&o_z), "{form}: outputs");
        assert_eq!(mxcsr(), csr_before, "{form}: the thread's MXCSR changed");
    }
}

/// The thread's SSE control word (0 off x86-64).
fn mxcsr() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v: u32 = 0;
        // SAFETY: stmxcsr writes the control word into `v` only.
        unsafe { std::arch::asm!("stmxcsr [{0}]", in(reg) &mut v, options(nostack, preserves_flags)) };
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Rough timing of one head's prefill (`cargo test --release -p pn-cpu --test delta_chunk -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing() {
    let d = 128;
    for t in [1usize, 16, 64, 128, 512] {
        let q = unit_rows(t, d, 1);
        let k = unit_rows(t, d, 2);
        let v = data(t * d, 3);
        let g: Vec<f32> = data(t, 4).iter().map(|x| -0.3 * (x + 1.0)).collect();
        let b: Vec<f32> = data(t, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
        let p = HeadIn { q: &q, k: &k, v: &v, g: &g, beta: &b, qk_stride: d, v_stride: d, gb_stride: 1, dk: d, dv: d, t };
        let mut s = data(d * d, 6);
        let mut o = vec![0f32; t * d];
        let mut sc = Scratch::default();
        let reps = (2048 / t).max(4);
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t0 = std::time::Instant::now();
                for _ in 0..reps {
                    f();
                }
                best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
            }
            best * 1e6 / t as f64
        };
        let tc = time(&mut || chunked(&p, &mut s, &mut o, &mut sc));
        let tr = time(&mut || recurrent(&p, &mut s, &mut o));
        // a state and k / v in the denormal range (a long-decayed head), refreshed each rep
        let kt: Vec<f32> = k.iter().map(|x| x * 1e-20).collect();
        let vt: Vec<f32> = v.iter().map(|x| x * 1e-38).collect();
        let pt = HeadIn { k: &kt, v: &vt, ..p };
        let st0: Vec<f32> = data(d * d, 6).iter().map(|x| x * 1e-39).collect();
        let td = time(&mut || {
            s.copy_from_slice(&st0);
            recurrent(&pt, &mut s, &mut o)
        });
        eprintln!("T={t}: chunked {tc:.2} µs/token, recurrent {tr:.2} µs/token, recurrent from a denormal state {td:.2} µs/token (one head)");
    }
}
