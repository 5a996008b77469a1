//! CPU attention vs the reference for every KV format (f32, f16, q8_0, q4_0 with and
//! without shadows, Hadamard-rotated or not, ring overflow): outputs and the updated cache
//! must be bitwise equal, for 1, 2 and 3 threads.

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;
use std::sync::OnceLock;

fn backends() -> &'static [CpuBackend] {
    static B: OnceLock<Vec<CpuBackend>> = OnceLock::new();
    B.get_or_init(|| vec![CpuBackend::new(1), CpuBackend::new(2), CpuBackend::new(3)])
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().iter().map(|x| x.to_bits()).collect()
}

fn same_kv(a: &LayerState, b: &LayerState) -> bool {
    let (LayerState::Kv(x), LayerState::Kv(y)) = (a, b) else { return false };
    let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    f(&x.k) == f(&y.k) && f(&x.v) == f(&y.v) && x.kq == y.kq && x.vq == y.vq && x.shadow == y.shadow
}

/// One attention call on the reference and every CPU backend; returns the reference's
/// output and next state.
fn step(h: usize, hkv: usize, d: usize, pos: &[i32], st: &LayerState, seed: u32) -> (Result<Tensor, OpError>, LayerState) {
    let t = pos.len();
    // keys with a few large channels, like real models (outliers are what rotation helps)
    let mut kd = data(d * hkv * t, seed + 1);
    for (i, x) in kd.iter_mut().enumerate() {
        if i % d == 3 {
            *x *= 8.0;
        }
    }
    let q = Tensor::f32(Shape::d3(d, h, t), data(d * h * t, seed));
    let k = Tensor::f32(Shape::d3(d, hkv, t), kd);
    let v = Tensor::f32(Shape::d3(d, hkv, t), data(d * hkv * t, seed + 2));
    let p = Tensor::i32(Shape::d1(t), pos.to_vec());
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 1.0 / (d as f32).sqrt(), state: 0 };
    let ins = [Value::Act(&q), Value::Act(&k), Value::Act(&v), Value::Act(&p)];
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas).unwrap();
    let mut rs = st.clone();
    let want = execute(&op, &ins, &out, Some(&mut rs));
    for be in backends() {
        let mut cs = st.clone();
        let got = be.execute(&op, &ins, &out, Some(&mut cs));
        match (&want, &got) {
            (Ok(w), Ok(g)) => assert!(bits(w) == bits(g), "{pos:?}: {} threads differ from the reference", be.threads()),
            (Err(w), Err(g)) => assert_eq!(w, g),
            _ => panic!("reference {want:?} vs cpu({}) {got:?}", be.threads()),
        }
        assert!(same_kv(&rs, &cs), "{pos:?}: {} threads left a different cache", be.threads());
    }
    if let Ok(w) = &want {
        assert!(w.as_f32().iter().all(|x| x.is_finite()));
    }
    (want, rs)
}

fn run_sequence(st: LayerState, h: usize, hkv: usize, d: usize, steps: &[Vec<i32>]) -> LayerState {
    let mut st = st;
    for (i, pos) in steps.iter().enumerate() {
        let (r, next) = step(h, hkv, d, pos, &st, 10 * i as u32 + 1);
        r.unwrap();
        st = next;
    }
    st
}

fn range(a: i32, b: i32) -> Vec<i32> {
    (a..b).collect()
}

#[test]
fn every_format_matches_the_reference() {
    for ty in KvType::ALL {
        // d 64: rotation 64; d 128: K rotated by H_128; d 32: no rotation; d 24: f16 fallback
        for (h, hkv, d) in [(4, 2, 64), (2, 1, 128), (3, 3, 32), (2, 2, 24)] {
            let st = LayerState::Kv(KvCache::with_type(hkv, d, 96, ty));
            let steps = [range(0, 11), vec![11], range(12, 20), vec![20], range(21, 60)];
            let st = run_sequence(st, h, hkv, d, &steps);
            let LayerState::Kv(kv) = &st else { unreachable!() };
            assert_eq!(kv.ty, ty.for_head_dim(d));
            // context full: an error, the cache untouched
            let (r, after) = step(h, hkv, d, &[95, 96], &st, 99);
            assert!(matches!(r, Err(OpError::ContextFull { pos: 96, .. })), "{ty}: {r:?}");
            assert!(same_kv(&st, &after));
        }
    }
}

#[test]
fn shadows_and_long_batches_match_the_reference() {
    // window shadows force runs of ≤ SEG+1 positions: a 300-token prefill is split
    for (sink, window) in [(0, 7), (3, 0), (3, 5), (4, 64)] {
        let st = LayerState::Kv(KvCache::with_shadows(2, 64, 400, KvType::Q4_0, sink, window));
        run_sequence(st, 4, 2, 64, &[range(0, 300), vec![300], range(301, 310)]);
        let st = LayerState::Kv(KvCache::with_shadows(1, 32, 400, KvType::Q8_0, sink, window));
        run_sequence(st, 2, 1, 32, &[range(0, 140), range(140, 141)]);
    }
}

#[test]
fn ring_overflow_matches_the_reference() {
    for ty in KvType::ALL {
        let mut kv = KvCache::with_type(2, 64, 16, ty);
        kv.ring = true;
        let st = run_sequence(LayerState::Kv(kv), 4, 2, 64, &[range(0, 10), range(10, 22), vec![22], range(23, 60)]);
        let LayerState::Kv(kv) = &st else { unreachable!() };
        assert!(kv.ring);
    }
}

#[test]
fn batch_split_does_not_change_results() {
    // q4_0 with shadows: a prefill in one batch equals the same prefill one token at a
    // time, bitwise (the runs make every query read the same cells either way)
    let (h, hkv, d) = (4, 2, 64);
    let n = 200;
    let q = data(d * h * n, 5);
    let k = data(d * hkv * n, 6);
    let v = data(d * hkv * n, 7);
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 0.125, state: 0 };
    let be = &backends()[1];
    let call = |st: &mut LayerState, a: usize, b: usize| {
        let t = b - a;
        let qt = Tensor::f32(Shape::d3(d, h, t), q[a * d * h..b * d * h].to_vec());
        let kt = Tensor::f32(Shape::d3(d, hkv, t), k[a * d * hkv..b * d * hkv].to_vec());
        let vt = Tensor::f32(Shape::d3(d, hkv, t), v[a * d * hkv..b * d * hkv].to_vec());
        let pt = Tensor::i32(Shape::d1(t), (a as i32..b as i32).collect());
        let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&pt)];
        let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
        be.execute(&op, &ins, &op.infer(&metas).unwrap(), Some(st)).unwrap().as_f32().to_vec()
    };
    let mut a = LayerState::Kv(KvCache::with_type(hkv, d, 256, KvType::Q4_0));
    let whole = call(&mut a, 0, n);
    let mut b = LayerState::Kv(KvCache::with_type(hkv, d, 256, KvType::Q4_0));
    let mut pieces = Vec::new();
    for t in 0..n {
        pieces.extend(call(&mut b, t, t + 1));
    }
    assert!(whole.iter().zip(&pieces).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(same_kv(&a, &b));
}

#[test]
fn prefill_tiles_straddling_sink_and_window_match_the_reference() {
    // Prefill chunks whose tiles of tokens cross the sink (4) and window (64) boundaries:
    // each token must read every cell from where its own query reads it. Also unordered
    // batches (descending, interleaved far apart), where a tile's positions span more
    // than the window.
    let inter: Vec<i32> = (0..40).flat_map(|i| [437 + i, 477 + i]).collect();
    let desc: Vec<i32> = (517..600).rev().collect();
    let seqs = [vec![range(0, 100), range(100, 400)], vec![range(0, 37), range(37, 137), range(137, 437), inter, desc]];
    for (ty, sink, window) in [(KvType::Q4_0, 4, 64), (KvType::Q8_0, 4, 64), (KvType::F16, 4, 64), (KvType::F32, 4, 64), (KvType::F32, 0, 0)] {
        for (h, hkv, d) in [(8, 2, 64), (2, 1, 256)] {
            for steps in &seqs {
                let st = LayerState::Kv(KvCache::with_shadows(hkv, d, 640, ty, sink, window));
                run_sequence(st, h, hkv, d, steps);
            }
        }
    }
    // the full model's geometry, default q4_0 cache
    let st = LayerState::Kv(KvCache::with_type(2, 256, 512, KvType::Q4_0));
    run_sequence(st, 16, 2, 256, &[range(0, 37), range(37, 300)]);
}

#[test]
fn decode_with_small_query_groups_matches_the_reference() {
    // one decode token with 1–4 query heads per KV head scores several cell blocks at a
    // time: contexts reaching those blocks, their remainders, shadows and the ring
    for ty in KvType::ALL {
        for (h, hkv, d) in [(2, 2, 32), (4, 2, 64), (6, 2, 32), (8, 2, 64), (3, 1, 64), (16, 2, 64)] {
            let st = LayerState::Kv(KvCache::with_type(hkv, d, 200, ty));
            run_sequence(st, h, hkv, d, &[range(0, 70), vec![70], vec![71], range(72, 100), vec![100], vec![101]]);
        }
        let mut kv = KvCache::with_type(2, 64, 40, ty);
        kv.ring = true;
        run_sequence(LayerState::Kv(kv), 2, 2, 64, &[range(0, 30), vec![30], range(31, 70), vec![70], vec![71]]);
    }
}
