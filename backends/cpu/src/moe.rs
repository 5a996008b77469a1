//! MoE routing (TopK, MoeWeights) and routed experts. MoeExperts routes every token
//! first, groups the (token, slot) pairs by expert, runs one batched matmul chain per
//! active expert (in parallel), keeps each (token, slot) result, and finally sums each
//! token's slots in selection order — the reference's order, whatever the batch.

use crate::matmul::{gemm, quantize_rows};
use crate::par;
use pn_ops::reference::common::{
    act_f32, act_format, act_i32, out_f32, out_i32, silu, topk_before, MOE_MIN_WEIGHT_SUM,
};
use pn_ops::reference::moe::ExpertSet;
use pn_ops::{OpError, Tensor, TensorMeta, Value};
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    static IDX: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub fn topk(ins: &[Value<'_>], out: &TensorMeta, k: usize) -> Result<Tensor, OpError> {
    const OP: &str = "TopK";
    let x = act_f32(OP, &ins[0])?;
    let n = ins[0].act().shape.0[0];
    let rows = out.shape.rows();
    let mut y = vec![0i32; k * rows];
    par::rows(&mut y, k, 8 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        IDX.with(|idx| {
            let mut idx = idx.borrow_mut();
            idx.clear();
            idx.extend(0..n);
            let cmp = |a: &usize, b: &usize| topk_before((xr[*a], *a), (xr[*b], *b));
            // The order is total (index tie-break), so selecting then sorting the top k
            // gives exactly the reference's full sort prefix.
            if k < n {
                idx.select_nth_unstable_by(k - 1, cmp);
            }
            idx[..k].sort_unstable_by(cmp);
            for (o, &i) in yr.iter_mut().zip(idx.iter()) {
                *o = i as i32;
            }
        });
    });
    out_i32(OP, out, y)
}

pub fn moe_weights(
    ins: &[Value<'_>],
    out: &TensorMeta,
    normalize: bool,
) -> Result<Tensor, OpError> {
    const OP: &str = "MoeWeights";
    let p = act_f32(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let e = ins[0].act().shape.0[0];
    let k = out.shape.0[0];
    let t = out.shape.rows();
    if p.len() < e * t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("probs hold {} values for {t} tokens of {e}", p.len()),
        });
    }
    if let Some(&id) = ids.iter().find(|&&id| id < 0 || id as usize >= e) {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("expert id {id} out of range ({e} experts)"),
        });
    }
    let mut y = vec![0.0f32; k * t];
    par::rows(&mut y, k, 4 * k, |ti, row| {
        for (r, w) in row.iter_mut().enumerate() {
            *w = p[ti * e + ids[ti * k + r] as usize];
        }
        if normalize {
            let mut sum = 0.0f32;
            for &w in row.iter() {
                sum += w;
            }
            let den = sum.max(MOE_MIN_WEIGHT_SUM);
            for w in row.iter_mut() {
                *w /= den;
            }
        }
    });
    out_f32(OP, out, y)
}

pub fn moe_experts(ins: &[Value<'_>], out: &TensorMeta, merged: bool) -> Result<Tensor, OpError> {
    const OP: &str = "MoeExperts";
    let x = act_f32(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let wts = act_f32(OP, &ins[2])?;
    let ex = ExpertSet::new(OP, ins, merged)?;
    let (kd, f, ne) = (ex.k, ex.f, ex.e);
    let top = ins[1].act().shape.0[0];
    let t = out.shape.0[1];
    let (gt, grb) = act_format(OP, ex.gate.ty, kd)?;
    let (ut, urb) = act_format(OP, ex.up.ty, kd)?;
    let (dt, drb) = act_format(OP, ex.down.ty, f)?;
    let n_slots = top * t;
    if x.len() != kd * t || ids.len() != n_slots || wts.len() != n_slots {
        return Err(OpError::Invalid {
            op: OP,
            msg: "inputs do not match [K, T] / [k, T]".into(),
        });
    }

    // Route: validate ids, then a stable counting sort of the slots by expert.
    let mut counts = vec![0usize; ne + 1];
    for &id in ids {
        counts[ex.check_id(OP, id)? + 1] += 1;
    }
    for e in 0..ne {
        counts[e + 1] += counts[e];
    }
    let starts = counts.clone();
    let mut order = vec![0usize; n_slots];
    for (slot, &id) in ids.iter().enumerate() {
        let e = id as usize;
        order[counts[e]] = slot;
        counts[e] += 1;
    }
    let active: Vec<usize> = (0..ne).filter(|&e| starts[e + 1] > starts[e]).collect();

    // Each token's x converted once per activation type.
    let xg = quantize_rows(gt, x, kd, grb);
    let xu = if merged || ut == gt {
        None
    } else {
        Some(quantize_rows(ut, x, kd, urb))
    };

    // Per active expert: results [n_e][K] for its slots, in `order` order.
    let run = |e: usize| -> Vec<f32> {
        let slots = &order[starts[e]..starts[e + 1]];
        let n = slots.len();
        let gather = |src: &[u8], rb: usize| -> Vec<u8> {
            let mut q = Vec::with_capacity(n * rb);
            for &s in slots {
                let tok = s / top;
                q.extend_from_slice(&src[tok * rb..(tok + 1) * rb]);
            }
            q
        };
        let xgs = gather(&xg, grb);
        let mut hid = vec![0.0f32; n * f];
        if merged {
            let gu_w = ex.gate.expert(e);
            let mut gu = vec![0.0f32; n * 2 * f];
            gemm(
                ex.gate.ty,
                kd,
                2 * f,
                |r| gu_w.row(r),
                &xgs,
                grb,
                n,
                &mut gu,
            );
            for (h, g) in hid.chunks_mut(f).zip(gu.chunks(2 * f)) {
                for i in 0..f {
                    h[i] = silu(g[i]) * g[f + i];
                }
            }
        } else {
            let xus = match &xu {
                Some(xu) => gather(xu, urb),
                None => xgs.clone(),
            };
            let gw = ex.gate.expert(e);
            let uw = ex.up.expert(e);
            let mut g = vec![0.0f32; n * f];
            let mut u = vec![0.0f32; n * f];
            gemm(ex.gate.ty, kd, f, |r| gw.row(r), &xgs, grb, n, &mut g);
            gemm(ex.up.ty, kd, f, |r| uw.row(r), &xus, urb, n, &mut u);
            for ((h, &g), &u) in hid.iter_mut().zip(&g).zip(&u) {
                *h = silu(g) * u;
            }
        }
        let hq = quantize_rows(dt, &hid, f, drb);
        let dw = ex.down.expert(e);
        let mut res = vec![0.0f32; n * kd];
        gemm(ex.down.ty, f, kd, |r| dw.row(r), &hq, drb, n, &mut res);
        for (row, &s) in res.chunks_mut(kd).zip(slots) {
            let w = wts[s];
            for v in row.iter_mut() {
                *v *= w;
            }
        }
        res
    };
    let results: Vec<Vec<f32>> = if active.len() > 1 {
        active.par_iter().map(|&e| run(e)).collect()
    } else {
        active.iter().map(|&e| run(e)).collect()
    };

    // Where each slot's result lives: (index into `active`, row in that expert's results).
    let mut loc = vec![(0usize, 0usize); n_slots];
    for (a, &e) in active.iter().enumerate() {
        for (i, &s) in order[starts[e]..starts[e + 1]].iter().enumerate() {
            loc[s] = (a, i);
        }
    }
    let mut y = vec![0.0f32; kd * t];
    par::rows(&mut y, kd, kd * top, |ti, acc| {
        for r in 0..top {
            let (a, i) = loc[ti * top + r];
            let o = &results[a][i * kd..(i + 1) * kd];
            for (v, &oi) in acc.iter_mut().zip(o) {
                *v += oi;
            }
        }
    });
    out_f32(OP, out, y)
}
