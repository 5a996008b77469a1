//! Causal GQA attention over the layer's KV cache (spec §4.3.4–4.3.5), in f32 over the
//! decoded cells of any KV format (docs/kv-cache.md).

use super::common::{act_f32, act_i32, out_f32, token_positions};
use crate::{KvCache, LayerState, OpError, Tensor, TensorMeta, Value};

/// The KV cache of an attention call (its shape checked by [`crate::StateShape::check`]).
pub fn kv_cache<'s>(op: &'static str, state: Option<&'s mut LayerState>) -> Result<&'s mut KvCache, OpError> {
    match state {
        Some(LayerState::Kv(kv)) => Ok(kv),
        _ => Err(OpError::Invalid { op, msg: "needs a KV-cache layer state".into() }),
    }
}

/// The batch is processed in runs ([`KvCache::runs`]; one run unless the cache is a ring
/// past its capacity or keeps window shadows). Per run: write k, v of every token at its
/// position ([`KvCache::write`]), then each query (t, h) attends to positions
/// `first_visible(p)..=p` (p = pos[t]) of KV head h / (H/Hkv), in increasing order:
/// q' = rotate_q(q); s_j = scale·(q'·k_j) with k_j the decoded cell ([`KvCache::read`],
/// dot sequential in i from 0.0); softmax (max-subtracted, sum in f64);
/// o = unrotate(Σ_j p_j v_j) accumulated per element in j order from 0.0.
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
    let pos = token_positions(OP, pos, t)?;
    let kv = kv_cache(OP, state)?;
    kv.check_positions(OP, pos)?;

    let group = n_head / n_head_kv;
    let mut y = vec![0.0f32; d * n_head * t];
    let (mut qr, mut kj, mut o) = (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
    let mut s = Vec::new();
    for (a, b) in kv.runs(pos) {
        for ti in a..b {
            for g in 0..n_head_kv {
                let src = (ti * n_head_kv + g) * d;
                kv.write(g, pos[ti] as usize, &k[src..src + d], &v[src..src + d]);
            }
        }
        for ti in a..b {
            let p = pos[ti] as usize;
            let lo = kv.first_visible(p);
            for h in 0..n_head {
                let g = h / group;
                qr.copy_from_slice(&q[(ti * n_head + h) * d..][..d]);
                kv.rotate_q(&mut qr);
                s.clear();
                for j in lo..=p {
                    kv.read(true, g, j, p, &mut kj);
                    let mut dot = 0.0f32;
                    for i in 0..d {
                        dot += qr[i] * kj[i];
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
                    *x = crate::math::exp(*x - m);
                    sum += *x as f64;
                }
                let inv = (1.0 / sum) as f32;
                o.fill(0.0);
                for (j, &e) in (lo..=p).zip(s.iter()) {
                    let pj = e * inv;
                    kv.read(false, g, j, p, &mut kj);
                    for i in 0..d {
                        o[i] += pj * kj[i];
                    }
                }
                kv.unrotate_o(&mut o);
                y[(ti * n_head + h) * d..][..d].copy_from_slice(&o);
            }
        }
    }
    out_f32(OP, out, y)
}
