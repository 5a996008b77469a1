//! Causal GQA attention over the KV cache, any cell format (docs/kv-cache.md). Per run of
//! the batch ([`KvCache::runs`]): k/v written first, then parallel over (token, head)
//! pairs. Each pair computes exactly the reference's sums in the same order (several
//! cells' dot products interleaved only for instruction-level parallelism; quantized
//! cells are decoded CB at a time into scratch with the reference's decoder).

use crate::par;
use pn_ops::reference::attention::kv_cache;
use pn_ops::reference::common::{act_f32, act_i32, out_f32};
use pn_ops::state::Cell;
use pn_ops::{KvCache, KvType, LayerState, OpError, Tensor, TensorMeta, Value};
use std::cell::RefCell;

/// Per-thread scratch: scores, the rotated query, CB decoded cells.
#[derive(Default)]
struct Scratch {
    s: Vec<f32>,
    q: Vec<f32>,
    cells: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Cells whose dot products are computed together (independent chains for ILP).
const CB: usize = 8;

/// s[c] = scale · Σ_i q_i blk[c][i] (sequential in i from 0.0) for the CB cells of `blk`.
#[inline(always)]
fn dots_cb(q: &[f32], blk: &[f32], scale: f32, s: &mut [f32]) {
    let d = q.len();
    let mut a = [0.0f32; CB];
    for (i, &qi) in q.iter().enumerate() {
        for (c, a) in a.iter_mut().enumerate() {
            *a += qi * blk[c * d + i];
        }
    }
    for (c, a) in a.iter().enumerate() {
        s[c] = scale * a;
    }
}

#[inline(always)]
fn dot1(q: &[f32], k: &[f32], scale: f32) -> f32 {
    let mut a = 0.0f32;
    for (&qi, &ki) in q.iter().zip(k) {
        a += qi * ki;
    }
    scale * a
}

/// Scores of positions lo..lo+s.len() for a query at `p` on KV head `g`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn scores(kv: &KvCache, g: usize, q: &[f32], lo: usize, p: usize, scale: f32, s: &mut [f32], cells: &mut Vec<f32>) {
    let (d, n) = (q.len(), s.len());
    if kv.ty == KvType::F32 && !kv.ring && kv.shadow.sink == 0 && kv.shadow.window == 0 {
        // contiguous f32 cells: read in place
        let base = kv.cell(g, lo);
        let kc = &kv.k[base..base + n * d];
        let mut j = 0;
        while j + CB <= n {
            dots_cb(q, &kc[j * d..(j + CB) * d], scale, &mut s[j..j + CB]);
            j += CB;
        }
        for j in j..n {
            s[j] = dot1(q, &kc[j * d..(j + 1) * d], scale);
        }
        return;
    }
    cells.resize(CB * d, 0.0);
    let mut j = 0;
    while j + CB <= n {
        for c in 0..CB {
            kv.read(true, g, lo + j + c, p, &mut cells[c * d..(c + 1) * d]);
        }
        dots_cb(q, cells, scale, &mut s[j..j + CB]);
        j += CB;
    }
    for j in j..n {
        match kv.source(true, g, lo + j, p) {
            Cell::F32(k) => s[j] = dot1(q, k, scale),
            _ => {
                kv.read(true, g, lo + j, p, &mut cells[..d]);
                s[j] = dot1(q, &cells[..d], scale);
            }
        }
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
    let kv = kv_cache(OP, state, n_head_kv, d)?;
    kv.check_positions(OP, pos)?;
    let group = n_head / n_head_kv;
    let mut y = vec![0.0f32; d * n_head * t];
    let decode_cost = if kv.ty == KvType::F32 { 2 } else { 4 };
    for (a, b) in kv.runs(pos) {
        for (ti, &p) in pos.iter().enumerate().take(b).skip(a) {
            for g in 0..n_head_kv {
                let src = (ti * n_head_kv + g) * d;
                kv.write(g, p as usize, &k[src..src + d], &v[src..src + d]);
            }
        }
        let kv: &KvCache = kv;
        let max_kv = pos[a..b].iter().map(|&p| p as usize + 1 - kv.first_visible(p as usize)).max().unwrap_or(0);
        let ys = &mut y[a * n_head * d..b * n_head * d];
        par::rows(ys, d, decode_cost * d * max_kv, |idx, o| {
            let idx = a * n_head + idx;
            let (ti, h) = (idx / n_head, idx % n_head);
            let g = h / group;
            let p = pos[ti] as usize;
            let lo = kv.first_visible(p);
            let n_kv = p + 1 - lo;
            SCRATCH.with(|sc| {
                let sc = &mut *sc.borrow_mut();
                if sc.s.len() < n_kv {
                    sc.s.resize(n_kv, 0.0);
                }
                sc.q.clear();
                sc.q.extend_from_slice(&q[idx * d..(idx + 1) * d]);
                kv.rotate_q(&mut sc.q);
                let s = &mut sc.s[..n_kv];
                scores(kv, g, &sc.q, lo, p, scale, s, &mut sc.cells);
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
                sc.cells.resize(d.max(sc.cells.len()), 0.0);
                for (j, &e) in (lo..=p).zip(s.iter()) {
                    let pj = e * inv;
                    let vj: &[f32] = match kv.source(false, g, j, p) {
                        Cell::F32(x) => x,
                        _ => {
                            kv.read(false, g, j, p, &mut sc.cells[..d]);
                            &sc.cells[..d]
                        }
                    };
                    for (oi, &vi) in o.iter_mut().zip(vj) {
                        *oi += pj * vi;
                    }
                }
                kv.unrotate_o(o);
            });
        });
    }
    out_f32(OP, out, y)
}
