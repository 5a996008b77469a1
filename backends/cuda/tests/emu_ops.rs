//! The CUDA kernels of the ops around the matmuls, under the CPU emulation of the CUDA
//! execution model (tests/emu/harness.rs, tests/emu/cuda_emu.h) through the generic
//! launcher (tests/emu/launch.cpp: buffers and launches given as the host code gives them),
//! against the reference ops: Attention with its cache for every KV format (bitwise,
//! cells and shadows byte for byte), RmsNorm / L2Norm / Softmax, TopK / MoeWeights and the
//! MoE combine (bitwise), Unary / Binary, RoPE, the chunked delta rule against the
//! recurrence, and the slices. tests/emu_kernels.rs has the weight-format kernels and the
//! multi-sequence ones.
#![cfg(target_arch = "x86_64")]

#[allow(dead_code)]
#[path = "emu/harness.rs"]
mod harness;

use harness::*;

#[test]
fn norms_and_softmax_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 77u64;
    let (n, rows) = (300usize, 5usize);
    let x = floats(&mut seed, n * rows, 2.0);
    let w = floats(&mut seed, n, 1.0);
    let mut job = Job::default();
    let (bx, bw) = (job.f32s(&x), job.f32s(&w));
    let ys: Vec<u32> = (0..4).map(|_| job.f32s(&vec![f32::NAN; n * rows])).collect();
    let rows_cfg = [rows as u32, 1, 1];
    job.launch("rms_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(bw, 0), A::P(ys[0], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("rms_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::Null, A::P(ys[1], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("l2_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(ys[2], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("softmax_rows", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(ys[3], 0), A::I(n as i32)]);
    let Some(out) = job.run("norm.cu") else { return };
    let xt = Tensor::f32(Shape::d2(n, rows), x.clone());
    let wt = Tensor::f32(Shape::d1(n), w.clone());
    let cases = [
        ("RmsNorm w", reference(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&xt), Value::Act(&wt)])),
        ("RmsNorm", reference(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&xt)])),
        ("L2Norm", reference(&Op::L2Norm { eps: 1e-6 }, &[Value::Act(&xt)])),
        ("Softmax", reference(&Op::Softmax, &[Value::Act(&xt)])),
    ];
    for (i, (what, want)) in cases.iter().enumerate() {
        let e = nmse(&as_f32(&out[ys[i] as usize]), want.as_f32());
        assert!(e <= 1e-12, "{what}: nmse {e:e}");
    }
}

#[test]
fn routing_kernels_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 99u64;
    let (e, t, k, dmodel) = (64usize, 5usize, 8usize, 96usize);
    let mut logits = floats(&mut seed, e * t, 4.0);
    // ties (the lower index first), ±0 folded, one NaN-free row of equal values
    logits[3] = logits[10];
    logits[e + 1] = 0.0;
    logits[e + 2] = -0.0;
    logits[2 * e..3 * e].fill(0.5);
    let probs: Vec<f32> = floats(&mut seed, e * t, 1.0).iter().map(|v| v.abs() + 1e-3).collect();
    let lt = Tensor::f32(Shape::d2(e, t), logits.clone());
    let ids = reference(&Op::TopK { k }, &[Value::Act(&lt)]);
    let d = floats(&mut seed, t * k * dmodel, 1.0);
    let wts = floats(&mut seed, t * k, 1.0);
    let mut job = Job::default();
    let (bl, bp, bd, bwt) = (job.f32s(&logits), job.f32s(&probs), job.f32s(&d), job.f32s(&wts));
    let bids = job.i32s(&vec![-1; t * k]);
    let bref_ids = job.i32s(ids.as_i32());
    let (bw0, bw1, bc) = (job.f32s(&vec![f32::NAN; t * k]), job.f32s(&vec![f32::NAN; t * k]), job.f32s(&vec![f32::NAN; t * dmodel]));
    let grid1 = |items: usize, threads: u32| [items.div_ceil(threads as usize).max(1) as u32, 1, 1];
    job.launch("topk_rows", [t as u32, 1, 1], [256, 1, 1], &[A::P(bl, 0), A::P(bids, 0), A::I(e as i32), A::I(k as i32)]);
    for (b, norm) in [(bw0, 0), (bw1, 1)] {
        job.launch("moe_weights", grid1(t, 128), [128, 1, 1], &[A::P(bp, 0), A::P(bref_ids, 0), A::P(b, 0), A::I(e as i32), A::I(k as i32), A::I(t as i32), A::I(norm)]);
    }
    job.launch("moe_combine", grid1(dmodel * t, 256), [256, 1, 1], &[A::P(bd, 0), A::P(bwt, 0), A::P(bc, 0), A::I(dmodel as i32), A::I(k as i32), A::I(t as i32)]);
    let Some(out) = job.run("moe.cu") else { return };
    assert_eq!(as_i32(&out[bids as usize]), ids.as_i32(), "TopK ids");
    let pt = Tensor::f32(Shape::d2(e, t), probs.clone());
    for (b, normalize) in [(bw0, false), (bw1, true)] {
        let want = reference(&Op::MoeWeights { normalize }, &[Value::Act(&pt), Value::Act(&ids)]);
        assert!(as_f32(&out[b as usize]) == want.as_f32(), "MoeWeights normalize {normalize}: not bitwise the reference");
    }
    // the combine: each token sums its slots in selection order, from 0
    let mut want = vec![0f32; t * dmodel];
    for ti in 0..t {
        for i in 0..dmodel {
            let mut acc = 0f32;
            for r in 0..k {
                acc += d[(ti * k + r) * dmodel + i] * wts[ti * k + r];
            }
            want[ti * dmodel + i] = acc;
        }
    }
    assert!(as_f32(&out[bc as usize]) == want, "moe_combine: not bitwise the selection-order sum");
}

#[test]
fn elementwise_kernels_match_the_reference() {
    use pn_ops::{BinaryOp, Op, Shape, Tensor, UnaryOp, Value};
    let mut seed = 5u64;
    let (n, t) = (300usize, 6usize);
    let x = floats(&mut seed, n * t, 8.0);
    let z = floats(&mut seed, n * t, 1.0);
    let row = floats(&mut seed, n, 1.0);
    let mut job = Job::default();
    let (bx, bz, brow) = (job.f32s(&x), job.f32s(&z), job.f32s(&row));
    let grid1 = |items: usize| [items.div_ceil(256) as u32, 1, 1];
    let unary = [(UnaryOp::Silu, 0), (UnaryOp::Sigmoid, 1), (UnaryOp::Softplus, 2), (UnaryOp::Exp, 3), (UnaryOp::Scale(0.37), 4)];
    let mut outs = Vec::new();
    for (u, code) in unary {
        let s = if let UnaryOp::Scale(s) = u { s } else { 0.0 };
        let y = job.f32s(&vec![f32::NAN; n * t]);
        job.launch("unary_f32", grid1(n * t), [256, 1, 1], &[A::P(bx, 0), A::P(y, 0), A::L((n * t) as i64), A::I(code), A::F(s)]);
        outs.push((format!("Unary {u:?}"), y, Op::Unary(u), false));
    }
    for (b, code) in [(BinaryOp::Add, 0), (BinaryOp::Mul, 1), (BinaryOp::SwiGlu, 2)] {
        for bcast in [false, true] {
            let (other, b0, b1) = if bcast { (brow, n as i32, 1) } else { (bz, n as i32, t as i32) };
            let y = job.f32s(&vec![f32::NAN; n * t]);
            let dims = [A::I(n as i32), A::I(t as i32), A::I(1), A::I(1), A::I(b0), A::I(b1), A::I(1), A::I(1)];
            let mut args = vec![A::P(bx, 0), A::P(other, 0), A::P(y, 0)];
            args.extend(dims);
            args.push(A::I(code));
            job.launch("binary_f32", grid1(n * t), [256, 1, 1], &args);
            outs.push((format!("Binary {b:?} bcast {bcast}"), y, Op::Binary(b), bcast));
        }
    }
    let Some(out) = job.run("elementwise.cu") else { return };
    let (xt, zt, rt) = (Tensor::f32(Shape::d2(n, t), x.clone()), Tensor::f32(Shape::d2(n, t), z.clone()), Tensor::f32(Shape::d2(n, 1), row.clone()));
    for (what, y, op, bcast) in outs {
        let want = match op {
            Op::Unary(_) => reference(&op, &[Value::Act(&xt)]),
            _ => reference(&op, &[Value::Act(&xt), Value::Act(if bcast { &rt } else { &zt })]),
        };
        let e = nmse(&as_f32(&out[y as usize]), want.as_f32());
        assert!(e <= 1e-12, "{what}: nmse {e:e}");
    }
}

#[test]
fn rope_matches_the_reference() {
    use pn_ops::{Op, RopeMode, Shape, Tensor, Value};
    let mut seed = 11u64;
    let (d, h, t) = (64usize, 3usize, 5usize);
    let x = floats(&mut seed, d * h * t, 2.0);
    let pos: Vec<i32> = vec![0, 7, 8, 100, 4095];
    let mut job = Job::default();
    let bpos = job.i32s(&pos);
    let mut outs = Vec::new();
    for (mode, n_rot) in [(RopeMode::Neox, 64usize), (RopeMode::Neox, 32), (RopeMode::Normal, 64)] {
        let (freq_base, freq_scale) = (10000.0f32, 1.0f32);
        let theta_scale = freq_base.powf(-2.0f32 / n_rot as f32);
        // the host copies x into y, then rotates y in place
        let y = job.f32s(&x);
        let n = n_rot / 2 * h * t;
        let args = [
            A::P(y, 0), A::P(bpos, 0), A::I(d as i32), A::I(h as i32), A::I(t as i32), A::I(1), A::I(n_rot as i32), A::F(theta_scale), A::F(freq_scale),
            A::I(0), A::I(0), A::I(0), A::I(0), A::I(0), A::Null, A::I((mode == RopeMode::Normal) as i32),
        ];
        job.launch("rope_neox", [n.div_ceil(256) as u32, 1, 1], [256, 1, 1], &args);
        outs.push((mode, n_rot, freq_base, freq_scale, y));
    }
    let Some(out) = job.run("rope.cu") else { return };
    let xt = Tensor::f32(Shape([d, h, t, 1]), x.clone());
    let pt = Tensor::i32(Shape::d1(t), pos.clone());
    for (mode, n_rot, freq_base, freq_scale, y) in outs {
        let want = reference(&Op::Rope { n_rot, mode, freq_base, freq_scale }, &[Value::Act(&xt), Value::Act(&pt)]);
        let e = nmse(&as_f32(&out[y as usize]), want.as_f32());
        assert!(e <= 1e-12, "Rope {mode:?} n_rot {n_rot}: nmse {e:e}");
    }
}

#[test]
fn attention_kernels_match_the_reference_for_every_kv_format() {
    use pn_ops::{KvCache, KvType, LayerState, Op, Shape, Tensor, Value};
    let (d, h, hkv, cap) = (64usize, 4usize, 2usize, 40usize);
    let scale = 1.0 / (d as f32).sqrt();
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale, state: 0 };
    // each format with its default shadows, and without any (every position read from
    // the cells)
    let formats = [(KvType::F32, 0), (KvType::F16, 1), (KvType::Q8_0, 2), (KvType::Q4_0, 3)];
    for ((ty, code), shadows) in formats.into_iter().flat_map(|f| [(f, true), (f, false)]) {
        let mut seed = 21 + code as u64;
        let mut cache = if shadows { KvCache::with_type(hkv, d, cap, ty) } else { KvCache::with_shadows(hkv, d, cap, ty, 0, 0) };
        let (rb, sink, window, slots) = (cache.ty.row_bytes(d), cache.shadow.sink, cache.shadow.window, cache.shadow.slots);
        let rs = |n: usize| if n == 0 { 0.0 } else { 1.0 / (n as f32).sqrt() };
        let (rot_k, rot_v) = (cache.rot_k, cache.rot_v);
        let mut job = Job::default();
        let cell_bytes = hkv * cap * rb;
        let cells = [job.buf(vec![0; cell_bytes]), job.buf(vec![0; cell_bytes])];
        let sinks = [job.buf(vec![0; hkv * sink * d * 2]), job.buf(vec![0; hkv * sink * d * 2])];
        let wins = [job.buf(vec![0; hkv * slots * d * 2]), job.buf(vec![0; hkv * slots * d * 2])];
        let ptr = |b: u32| A::P(b, 0);
        let mut wants = Vec::new();
        let mut ys = Vec::new();
        // a prefill of 6 tokens (one run), then a decode token, as ops_attn.rs `run` launches them
        for (pos, fixed) in [(vec![0i32, 1, 2, 3, 4, 5], false), (vec![6], true)] {
            let t = pos.len();
            let (q, k, v) = (floats(&mut seed, d * h * t, 1.0), floats(&mut seed, d * hkv * t, 1.0), floats(&mut seed, d * hkv * t, 1.0));
            let (qt, kt, vt) = (Tensor::f32(Shape([d, h, t, 1]), q.clone()), Tensor::f32(Shape([d, hkv, t, 1]), k.clone()), Tensor::f32(Shape([d, hkv, t, 1]), v.clone()));
            let pt = Tensor::i32(Shape::d1(t), pos.clone());
            let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&pt)];
            let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
            let out = op.infer(&metas).unwrap();
            let mut st = LayerState::Kv(cache);
            wants.push(pn_ops::reference::execute(&op, &ins, &out, Some(&mut st)).unwrap());
            let LayerState::Kv(c) = st else { unreachable!() };
            cache = c;
            let (bq, bk, bv, bp) = (job.f32s(&q), job.f32s(&k), job.f32s(&v), job.i32s(&pos));
            let span = if fixed { cap } else { *pos.iter().max().unwrap() as usize + 1 };
            let (bs, by) = (job.f32s(&vec![0.0; h * t * span]), job.f32s(&vec![f32::NAN; d * h * t]));
            let mut a = vec![ptr(cells[0]), ptr(cells[1]), ptr(sinks[0]), ptr(sinks[1]), ptr(wins[0]), ptr(wins[1]), A::Null, A::Null, ptr(bk), ptr(bv), ptr(bp)];
            a.extend([A::I(0), A::I(code), A::I(d as i32), A::I(hkv as i32), A::I(rb as i32), A::I(cap as i32), A::I(cap as i32), A::I(0), A::I(sink as i32), A::I(slots as i32)]);
            a.extend([A::I(rot_k as i32), A::F(rs(rot_k)), A::I(rot_v as i32), A::F(rs(rot_v))]);
            job.launch("kv_store", [t as u32, hkv as u32, 1], [128, 1, 1], &a);
            let mut a = vec![ptr(bq), ptr(cells[0]), ptr(cells[1]), ptr(sinks[0]), ptr(sinks[1]), ptr(wins[0]), ptr(wins[1]), ptr(bp), ptr(bs), ptr(by)];
            a.extend([A::I(0), A::I(code), A::I(d as i32), A::I(h as i32), A::I(hkv as i32), A::I(rb as i32), A::I(cap as i32), A::I(cap as i32), A::I(0)]);
            a.extend([A::I(sink as i32), A::I(window as i32), A::I(slots as i32), A::I(span as i32)]);
            a.extend([A::I(rot_k as i32), A::F(rs(rot_k)), A::I(rot_v as i32), A::F(rs(rot_v)), A::F(scale)]);
            job.launch("attn_kv", [h as u32, t as u32, 1], [128, 1, 1], &a);
            ys.push(by);
        }
        let Some(out) = job.run("attention.cu") else { return };
        for (pass, (y, want)) in ys.iter().zip(&wants).enumerate() {
            assert!(as_f32(&out[*y as usize]) == want.as_f32(), "{ty:?} (shadows {shadows}) pass {pass}: attention output not bitwise the reference");
        }
        let enc = |i: usize| if ty == KvType::F32 { (if i == 0 { &cache.k } else { &cache.v }).iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>() } else { (if i == 0 { &cache.kq } else { &cache.vq }).clone() };
        let u16s = |v: &Vec<u16>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for i in 0..2 {
            assert!(out[cells[i] as usize] == enc(i), "{ty:?}: cells {i} differ from the reference cache");
        }
        assert!(out[sinks[0] as usize] == u16s(&cache.shadow.k_sink) && out[sinks[1] as usize] == u16s(&cache.shadow.v_sink), "{ty:?}: sink shadows differ");
        assert!(out[wins[0] as usize] == u16s(&cache.shadow.k_win) && out[wins[1] as usize] == u16s(&cache.shadow.v_win), "{ty:?}: window shadows differ");
    }
}

#[test]
fn chunked_delta_rule_matches_the_recurrence() {
    use pn_ops::{LayerState, Op, RecurrentState, Shape, Tensor, Value};
    // 150 tokens: chunks of 64, 64 and 22; the scratch of one group of all three
    let (dk, hk, dv, hv, t) = (32usize, 2usize, 48usize, 4usize, 150usize);
    let (dc, dtj) = (64usize, 32usize);
    let mut seed = 8u64;
    let q = floats(&mut seed, dk * hk * t, 1.0);
    let k: Vec<f32> = {
        // unit-norm keys, as the model's l2-normed ones
        let raw = floats(&mut seed, dk * hk * t, 1.0);
        raw.chunks(dk).flat_map(|r| {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter().map(move |x| x / n).collect::<Vec<_>>()
        }).collect()
    };
    let v = floats(&mut seed, dv * hv * t, 1.0);
    let g: Vec<f32> = floats(&mut seed, hv * t, 1.0).iter().map(|x| -0.05 - 0.3 * x.abs()).collect();
    let beta: Vec<f32> = floats(&mut seed, hv * t, 1.0).iter().map(|x| 0.5 + 0.4 * x).collect();
    let mut rs = RecurrentState::new(4, 8, hv, dk, dv);
    rs.ssm = floats(&mut seed, hv * dv * dk, 0.5);
    let scale = 1.0 / (dk as f32).sqrt();
    let n_chunks = t.div_ceil(dc);
    let stride = 2 * dc * dc + dc * dk + dc;
    let mut job = Job::default();
    let (bq, bk, bv, bg, bb) = (job.f32s(&q), job.f32s(&k), job.f32s(&v), job.f32s(&g), job.f32s(&beta));
    let (bs, by, bscr) = (job.f32s(&rs.ssm), job.f32s(&vec![f32::NAN; dv * hv * t]), job.f32s(&vec![0.0; hv * n_chunks * stride]));
    let i = |x: usize| A::I(x as i32);
    let p = |b: u32| A::P(b, 0);
    job.launch("delta_chunk_prep", [hv as u32, n_chunks as u32, 1], [256, 1, 1], &[p(bq), p(bk), p(bg), p(bb), p(bscr), i(dk), i(hk), i(hv), i(t), i(0), A::F(scale)]);
    job.launch("delta_chunk_apply", [hv as u32, dv.div_ceil(dtj) as u32, 1], [256, 1, 1], &[p(bs), p(bq), p(bk), p(bv), p(bscr), p(by), i(dk), i(hk), i(dv), i(hv), i(t), i(0), i(n_chunks), A::F(scale)]);
    let Some(out) = job.run("delta_chunk.cu") else { return };
    let ts = |v: &[f32], s: [usize; 4]| Tensor::f32(Shape(s), v.to_vec());
    let (qt, kt, vt, gt, bt) = (ts(&q, [dk, hk, t, 1]), ts(&k, [dk, hk, t, 1]), ts(&v, [dv, hv, t, 1]), ts(&g, [hv, t, 1, 1]), ts(&beta, [hv, t, 1, 1]));
    let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&gt), Value::Act(&bt)];
    let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let op = Op::DeltaRule { state: 0 };
    let meta = op.infer(&metas).unwrap();
    let mut st = LayerState::Recurrent(rs);
    let want = pn_ops::reference::execute(&op, &ins, &meta, Some(&mut st)).unwrap();
    let LayerState::Recurrent(rs) = st else { unreachable!() };
    // the chunked form reassociates the recurrence's sums (≤ 1e-4 relative, docs/perf.md)
    let (ey, es) = (nmse(&as_f32(&out[by as usize]), want.as_f32()), nmse(&as_f32(&out[bs as usize]), &rs.ssm));
    assert!(ey <= 1e-8 && es <= 1e-8, "chunked delta rule: output nmse {ey:e}, state nmse {es:e}");
}

#[test]
fn slices_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 13u64;
    let (n, t) = (96usize, 5usize);
    let x = floats(&mut seed, n * t, 1.0);
    let (group, offset, len) = (32usize, 8usize, 16usize);
    let (start, rows) = (1usize, 3usize);
    let mut job = Job::default();
    let bx = job.f32s(&x);
    let n_cols = n / group * len * t;
    let (yc, yr) = (job.f32s(&vec![f32::NAN; n_cols]), job.f32s(&vec![f32::NAN; n * rows]));
    job.launch("slice_cols", [n_cols.div_ceil(256) as u32, 1, 1], [256, 1, 1], &[A::P(bx, 0), A::P(yc, 0), A::L(n_cols as i64), A::I(group as i32), A::I(offset as i32), A::I(len as i32)]);
    job.launch("copy_f32", [(n * rows).div_ceil(256) as u32, 1, 1], [256, 1, 1], &[A::P(bx, 0), A::P(yr, 0), A::L((start * n) as i64), A::L((n * rows) as i64)]);
    let Some(out) = job.run("elementwise.cu") else { return };
    let xt = Tensor::f32(Shape::d2(n, t), x.clone());
    let cols = reference(&Op::SliceCols { group, offset, len }, &[Value::Act(&xt)]);
    let rows_want = reference(&Op::SliceRows { start, len: rows }, &[Value::Act(&xt)]);
    assert!(as_f32(&out[yc as usize]) == cols.as_f32(), "slice_cols: not the reference's elements");
    assert!(as_f32(&out[yr as usize]) == rows_want.as_f32(), "copy_f32 (SliceRows): not the reference's rows");
}
