//! Causal GQA attention over the KV cache: KV written first, then parallel over
//! (token, head) pairs. Each pair computes exactly the reference's sums in the same order
//! (several cells' dot products interleaved only for instruction-level parallelism).

use crate::par;
use pn_ops::reference::common::{act_f32, act_i32, check_positions, kv_state, out_f32};
use pn_ops::{KvCache, LayerState, OpError, Tensor, TensorMeta, Value};
use std::cell::RefCell;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Cells whose dot products are computed together (independent chains for ILP).
const CB: usize = 8;

/// s[j] = scale · Σ_i q_i k_j[i] (sequential in i from 0.0) for cells j in 0..n of KV head g.
fn scores(kv: &KvCache, g: usize, q: &[f32], n: usize, scale: f32, s: &mut [f32]) {
    let d = q.len();
    let base = kv.cell(g, 0);
    let kc = &kv.k[base..base + n * d];
    let mut j = 0;
    while j + CB <= n {
        let blk = &kc[j * d..(j + CB) * d];
        let mut a = [0.0f32; CB];
        for (i, &qi) in q.iter().enumerate() {
            for (c, a) in a.iter_mut().enumerate() {
                *a += qi * blk[c * d + i];
            }
        }
        for (c, a) in a.iter().enumerate() {
            s[j + c] = scale * a;
        }
        j += CB;
    }
    while j < n {
        let kj = &kc[j * d..(j + 1) * d];
        let mut a = 0.0f32;
        for (&qi, &ki) in q.iter().zip(kj) {
            a += qi * ki;
        }
        s[j] = scale * a;
        j += 1;
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    n_head: usize,
    n_head_kv: usize,
    d: usize,
    scale: f32,
) -> Result<Tensor, OpError> {
    const OP: &str = "Attention";
    let q = act_f32(OP, &ins[0])?;
    let k = act_f32(OP, &ins[1])?;
    let v = act_f32(OP, &ins[2])?;
    let pos = act_i32(OP, &ins[3])?;
    let t = out.shape.0[1];
    if pos.len() < t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("{} positions for {t} tokens", pos.len()),
        });
    }
    let pos = &pos[..t];
    let kv = kv_state(OP, state, n_head_kv, d)?;
    check_positions(OP, pos, kv.capacity)?;
    for (ti, &p) in pos.iter().enumerate() {
        for g in 0..n_head_kv {
            let src = (ti * n_head_kv + g) * d;
            let dst = kv.cell(g, p as usize);
            kv.k[dst..dst + d].copy_from_slice(&k[src..src + d]);
            kv.v[dst..dst + d].copy_from_slice(&v[src..src + d]);
        }
    }
    let kv: &KvCache = kv;
    let group = n_head / n_head_kv;
    let max_kv = pos.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
    let mut y = vec![0.0f32; d * n_head * t];
    par::rows(&mut y, d, 4 * d * max_kv, |idx, o| {
        let (ti, h) = (idx / n_head, idx % n_head);
        let g = h / group;
        let n_kv = pos[ti] as usize + 1;
        let qh = &q[idx * d..(idx + 1) * d];
        SCORES.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < n_kv {
                s.resize(n_kv, 0.0);
            }
            let s = &mut s[..n_kv];
            scores(kv, g, qh, n_kv, scale, s);
            let mut m = f32::NEG_INFINITY;
            for &x in s.iter() {
                if x > m {
                    m = x;
                }
            }
            let mut sum = 0.0f64;
            for x in s.iter_mut() {
                *x = (*x - m).exp();
                sum += *x as f64;
            }
            let inv = (1.0 / sum) as f32;
            let vbase = kv.cell(g, 0);
            for (j, &e) in s.iter().enumerate() {
                let p = e * inv;
                let vj = &kv.v[vbase + j * d..vbase + (j + 1) * d];
                for (oi, &vi) in o.iter_mut().zip(vj) {
                    *oi += p * vi;
                }
            }
        });
    });
    out_f32(OP, out, y)
}
