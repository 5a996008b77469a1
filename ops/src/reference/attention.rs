//! Causal GQA attention over the layer's KV cache (spec §4.3.4–4.3.5), all f32.

use super::common::{act_f32, act_i32, check_positions, kv_state, out_f32};
use crate::{LayerState, OpError, Tensor, TensorMeta, Value};

/// Write k, v at cells `pos[t]`, then each query (t, h) attends to cells 0..=pos[t] of KV
/// head h / (H/Hkv): s_j = scale·(q·k_j), softmax (max-subtracted, sum in f64),
/// o = Σ_j p_j v_j.
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

    for ti in 0..t {
        let p = pos[ti] as usize;
        for g in 0..n_head_kv {
            let src = (ti * n_head_kv + g) * d;
            let dst = kv.cell(g, p);
            kv.k[dst..dst + d].copy_from_slice(&k[src..src + d]);
            kv.v[dst..dst + d].copy_from_slice(&v[src..src + d]);
        }
    }

    let group = n_head / n_head_kv;
    let mut y = vec![0.0f32; d * n_head * t];
    let mut s = Vec::new();
    for ti in 0..t {
        let n_kv = pos[ti] as usize + 1;
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[(ti * n_head + h) * d..][..d];
            s.clear();
            for j in 0..n_kv {
                let kj = &kv.k[kv.cell(g, j)..][..d];
                let mut dot = 0.0f32;
                for i in 0..d {
                    dot += qh[i] * kj[i];
                }
                s.push(scale * dot);
            }
            let mut m = f32::NEG_INFINITY;
            for &x in &s {
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
            let o = &mut y[(ti * n_head + h) * d..][..d];
            for j in 0..n_kv {
                let p = s[j] * inv;
                let vj = &kv.v[kv.cell(g, j)..][..d];
                for i in 0..d {
                    o[i] += p * vj[i];
                }
            }
        }
    }
    out_f32(OP, out, y)
}
