//! KV formats: Hadamard rotation, the reference quantizers, decoded attention close to
//! f32 attention, ring semantics, snapshots of the used cells.

use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::state::kv::{decode_row, encode_row, hadamard, quantize_q4_0_ref};
use pn_ops::*;

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 99991)
}

#[allow(clippy::too_many_arguments)]
fn attn(h: usize, hkv: usize, d: usize, q: &[f32], k: &[f32], v: &[f32], pos: &[i32], st: &mut LayerState) -> Vec<f32> {
    let t = pos.len();
    let (q, k, v) = (Tensor::f32(Shape::d3(d, h, t), q.to_vec()), Tensor::f32(Shape::d3(d, hkv, t), k.to_vec()), Tensor::f32(Shape::d3(d, hkv, t), v.to_vec()));
    let p = Tensor::i32(Shape::d1(t), pos.to_vec());
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale: 1.0 / (d as f32).sqrt(), state: 0 };
    let ins = [Value::Act(&q), Value::Act(&k), Value::Act(&v), Value::Act(&p)];
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    execute(&op, &ins, &op.infer(&metas).unwrap(), Some(st)).unwrap().as_f32().to_vec()
}

#[test]
fn hadamard_is_orthonormal_and_involutive() {
    let x = data(256, 1);
    for n in [64, 128, 256] {
        let mut y = x.clone();
        hadamard(&mut y, n);
        let (nx, ny): (f32, f32) = (x.iter().map(|v| v * v).sum(), y.iter().map(|v| v * v).sum());
        assert!((nx - ny).abs() < 1e-4 * nx, "norm kept");
        hadamard(&mut y, n);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5), "H² = I");
    }
    // H_2 row 1 is [1, -1]/√2 (Sylvester ordering)
    let mut e = vec![0.0f32; 64];
    e[1] = 1.0;
    hadamard(&mut e, 64);
    assert!((e[0] - 0.125).abs() < 1e-7 && (e[1] + 0.125).abs() < 1e-7 && (e[2] - 0.125).abs() < 1e-7);
}

#[test]
fn q4_0_quantizer_follows_ggml_ref() {
    // the block's signed max maps to q = 0 (d = max / -8), zero to 8
    let mut x = vec![0.0f32; 32];
    x[0] = -2.0;
    x[1] = 1.0;
    x[17] = 0.26;
    let mut b = [0u8; 18];
    quantize_q4_0_ref(&x, &mut b);
    assert_eq!(half::f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.25);
    assert_eq!(b[2] & 15, 0); // -2 / 0.25 + 8.5 = 0.5 -> 0
    assert_eq!(b[3] & 15, 12); // 1 · (1/-0.25)... d = -2/-8 = 0.25: 4 + 8.5 = 12.5 -> 12
    assert_eq!(b[3] >> 4, 9); // 1.04 + 8.5 = 9.54 -> 9
    assert_eq!(b[4] & 15, 8);
    let mut y = vec![0.0f32; 32];
    decode_row(KvType::Q4_0, &b, &mut y);
    assert_eq!((y[0], y[1], y[17], y[5]), (-2.0, 1.0, 0.25, 0.0));
}

#[test]
fn formats_round_trip_within_their_precision() {
    let x = data(64, 3);
    for (ty, tol) in [(KvType::F32, 0.0), (KvType::F16, 1e-3), (KvType::Q8_0, 1e-2), (KvType::Q4_0, 0.15)] {
        let mut b = vec![0u8; ty.row_bytes(64)];
        encode_row(ty, &x, &mut b);
        let mut y = vec![0.0f32; 64];
        decode_row(ty, &b, &mut y);
        let err = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= tol, "{ty}: max error {err}");
    }
}

#[test]
fn quantized_attention_tracks_f32_attention() {
    let (h, hkv, d, t) = (4, 2, 64, 40);
    let q = data(h * d * t, 1);
    let k = data(hkv * d * t, 2);
    let v = data(hkv * d * t, 3);
    let pos: Vec<i32> = (0..t as i32).collect();
    let mut f = LayerState::Kv(KvCache::new(hkv, d, 64));
    let want = attn(h, hkv, d, &q, &k, &v, &pos, &mut f);
    for (ty, tol) in [(KvType::F16, 2e-3), (KvType::Q8_0, 2e-2), (KvType::Q4_0, 0.2)] {
        for (sink, window) in [(0, 0), ty.default_shadows()] {
            let mut st = LayerState::Kv(KvCache::with_shadows(hkv, d, 64, ty, sink, window));
            let got = attn(h, hkv, d, &q, &k, &v, &pos, &mut st);
            let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(err <= tol, "{ty} sink {sink} window {window}: max error {err}");
            if window >= t {
                // every position read from the f16 shadows: f16 accuracy
                assert!(err <= 2e-3, "{ty} shadows: max error {err}");
            }
        }
    }
}

#[test]
fn ring_attends_to_the_last_capacity_positions() {
    let (h, hkv, d, cap, n) = (2, 1, 8, 16, 40);
    let q = data(h * d * n, 4);
    let k = data(hkv * d * n, 5);
    let v = data(hkv * d * n, 6);
    let mut kv = KvCache::new(hkv, d, cap);
    kv.ring = true;
    let mut st = LayerState::Kv(kv);
    let pos: Vec<i32> = (0..n as i32).collect();
    let o = attn(h, hkv, d, &q, &k, &v, &pos, &mut st);
    let scale = 1.0 / (d as f64).sqrt();
    for t in 0..n {
        let lo = (t + 1).saturating_sub(cap);
        for hh in 0..h {
            let qh = &q[(t * h + hh) * d..][..d];
            let s: Vec<f64> = (lo..=t).map(|j| scale * (0..d).map(|i| qh[i] as f64 * k[j * d + i] as f64).sum::<f64>()).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..d {
                let want: f64 = (lo..=t).zip(&e).map(|(j, e)| e / z * v[j * d + i] as f64).sum();
                let got = o[(t * h + hh) * d + i] as f64;
                assert!((got - want).abs() < 1e-5, "t {t}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn snapshot_keeps_only_used_cells_and_restores() {
    let (h, hkv, d) = (2, 2, 64);
    for ty in KvType::ALL {
        let mut st = LayerState::Kv(KvCache::with_type(hkv, d, 1024, ty));
        let pos: Vec<i32> = (0..20).collect();
        attn(h, hkv, d, &data(h * d * 20, 1), &data(hkv * d * 20, 2), &data(hkv * d * 20, 3), &pos, &mut st);
        let snap = st.snapshot(20);
        let LayerSnapshot::Kv(ks) = &snap else { unreachable!() };
        assert_eq!(ks.used, 20);
        assert!(snap.bytes() * 10 < st.bytes(), "{ty}: snapshot {} of {}", snap.bytes(), st.bytes());
        let next = |st: &mut LayerState| attn(h, hkv, d, &data(h * d, 9), &data(hkv * d, 8), &data(hkv * d, 7), &[20], st);
        let a = next(&mut st);
        let mut other = LayerState::Kv(KvCache::with_type(hkv, d, 1024, ty));
        other.restore(&snap).unwrap();
        assert_eq!(a, next(&mut other), "{ty}");
        // another format is refused
        let wrong = if ty == KvType::F32 { KvType::Q8_0 } else { KvType::F32 };
        assert!(LayerState::Kv(KvCache::with_type(hkv, d, 1024, wrong)).restore(&snap).is_err());
    }
}

#[test]
fn read_cells_decodes_what_read_decodes_cell_by_cell() {
    let (hkv, d) = (2, 64);
    for ty in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        for (sink, window) in [(0, 0), (4, 64), (1, 3), (0, 16)] {
            for (cap, ring, n) in [(300, false, 300), (96, true, 400)] {
                let mut kv = KvCache::with_shadows(hkv, d, cap, ty, sink, window);
                kv.ring = ring;
                for p in 0..n {
                    let (k, v) = (data(hkv * d, 7 + p as u32), data(hkv * d, 90_001 + p as u32));
                    for g in 0..hkv {
                        kv.write(g, p, &k[g * d..(g + 1) * d], &v[g * d..(g + 1) * d]);
                    }
                    // every query position once its cells are written, a few runs each
                    if p % 7 != 3 && p + 1 != n {
                        continue;
                    }
                    let lo = kv.first_visible(p);
                    for (j0, len) in [(lo, p + 1 - lo), (p + 1 - (p + 1 - lo).min(9), (p + 1 - lo).min(9)), ((lo + p) / 2, 1)] {
                        for (g, key) in [(0, true), (1, false)] {
                            let mut got = vec![f32::NAN; len * d];
                            kv.read_cells(key, g, j0, len, p, &mut got);
                            let mut want = vec![f32::NAN; len * d];
                            for (c, r) in want.chunks_exact_mut(d).enumerate() {
                                kv.read(key, g, j0 + c, p, r);
                            }
                            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{ty:?} sink {sink} window {window} cap {cap} ring {ring}: cells {j0}+{len} at {p}, head {g}");
                        }
                    }
                }
            }
        }
    }
}
