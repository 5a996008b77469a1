//! Causal GQA attention over the KV cache, any cell format (docs/kv-cache.md). Per run of
//! the batch ([`KvCache::runs`]): k/v written first, then parallel over tiles of
//! (tokens × query heads of ONE KV head). A tile reads (and, for f16/q8_0/q4_0 cells or
//! shadows, decodes) each KV cell once for all its queries: the GQA group's heads, and in
//! a prefill several tokens too when every token reads a cell from the same place (no
//! window shadows, no ring). Every (token, head) still computes exactly the reference's
//! sums in the same order: each score is Σ_i q_i k_i sequential in i from 0.0 then scaled
//! (several cells × queries are interleaved only for SIMD / instruction-level
//! parallelism), softmax as the reference, and each output element accumulates p_j v_j in
//! increasing j from 0.0. So results are bitwise the reference's for any tiling / threads.

use crate::par;
use pn_ops::reference::attention::kv_cache;
use pn_ops::reference::common::{act_f32, act_i32, out_f32, token_positions};
use pn_ops::{KvCache, KvType, LayerState, OpError, Tensor, TensorMeta, Value};
use std::cell::RefCell;

/// Per-thread scratch: rotated queries, scores, a transposed K block, decoded cells.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    s: Vec<f32>,
    inv: Vec<f32>,
    kt: Vec<f32>,
    rows: Vec<f32>,
    w: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Cells processed together (a K block is transposed to `[d][CB]` so the CB dot products
/// of one query are one SIMD vector).
const CB: usize = 8;
/// Tokens per tile when the tile's tokens can share decoded cells (prefill).
const TT: usize = 4;
/// Output lanes accumulated in registers in the V pass.
const VW: usize = 16;

/// One tile: tokens `t0..t1`, query heads `h0..h0 + gs` (all on KV head `g`).
#[derive(Clone, Copy)]
struct Tile<'a> {
    kv: &'a KvCache,
    q: &'a [f32],
    pos: &'a [i32],
    t0: usize,
    t1: usize,
    h0: usize,
    gs: usize,
    g: usize,
    n_head: usize,
    scale: f32,
}

/// acc[n][c] = Σ_i q_n[i] · kt[i][c], sequential in i from 0.0, for NQ queries
/// (`q`: NQ rows of d) and the CB cells of the transposed block `kt` (`[d][CB]`).
#[inline(always)]
fn dots<const NQ: usize>(q: &[f32], d: usize, kt: &[f32]) -> [[f32; CB]; NQ] {
    assert!(q.len() >= NQ * d && kt.len() >= d * CB);
    let mut acc = [[0.0f32; CB]; NQ];
    for i in 0..d {
        // SAFETY: i < d, n < NQ, c < CB: in bounds by the assert above.
        let k: &[f32; CB] = unsafe { &*(kt.as_ptr().add(i * CB) as *const [f32; CB]) };
        for (n, a) in acc.iter_mut().enumerate() {
            let qi = unsafe { *q.get_unchecked(n * d + i) };
            for c in 0..CB {
                a[c] += qi * k[c];
            }
        }
    }
    acc
}

/// o[i] += w[c] · rows[c][i] for c = 0, 1, … in order, per output element i.
#[inline(always)]
fn accumulate(o: &mut [f32], rows: &[f32], w: &[f32], d: usize) {
    assert!(o.len() == d && rows.len() >= w.len() * d);
    let mut i = 0;
    while i + VW <= d {
        let mut acc: [f32; VW] = o[i..i + VW].try_into().expect("VW lanes");
        for (c, &wc) in w.iter().enumerate() {
            // SAFETY: c < w.len(), i + VW <= d: in bounds by the assert above.
            let r: &[f32; VW] = unsafe { &*(rows.as_ptr().add(c * d + i) as *const [f32; VW]) };
            for l in 0..VW {
                acc[l] += wc * r[l];
            }
        }
        o[i..i + VW].copy_from_slice(&acc);
        i += VW;
    }
    for (i, oi) in o.iter_mut().enumerate().skip(i) {
        let mut x = *oi;
        for (c, &wc) in w.iter().enumerate() {
            x += wc * rows[c * d + i];
        }
        *oi = x;
    }
}

/// Score rows `q0..q0+NQ` for the block of `n` cells at `jb` (offset in the score rows).
#[inline(always)]
fn score_rows<const NQ: usize>(sc_q: &[f32], s: &mut [f32], kt: &[f32], d: usize, q0: usize, ncells: usize, jb: usize, n: usize, scale: f32) {
    let acc = dots::<NQ>(&sc_q[q0 * d..(q0 + NQ) * d], d, kt);
    for (k, a) in acc.iter().enumerate() {
        let row = &mut s[(q0 + k) * ncells + jb..][..n];
        for (x, &v) in row.iter_mut().zip(a) {
            *x = scale * v;
        }
    }
}

/// Attention of one tile into `o` (`[t1 - t0][gs][d]`, zeroed). `NQ`: queries per
/// register block of the score kernel.
#[inline(always)]
fn tile_impl<const NQ: usize>(tl: Tile<'_>, sc: &mut Scratch, o: &mut [f32]) {
    let kv = tl.kv;
    let d = kv.head_dim;
    let (g, gs) = (tl.g, tl.gs);
    let nt = tl.t1 - tl.t0;
    let nq = nt * gs;
    let mut jlo = usize::MAX;
    let mut pmax = 0;
    for &p in &tl.pos[tl.t0..tl.t1] {
        let p = p as usize;
        jlo = jlo.min(kv.first_visible(p));
        pmax = pmax.max(p);
    }
    let ncells = pmax + 1 - jlo;
    // rotated queries, row k·gs + hh
    sc.q.clear();
    for k in 0..nt {
        let src = ((tl.t0 + k) * tl.n_head + tl.h0) * d;
        sc.q.extend_from_slice(&tl.q[src..src + gs * d]);
    }
    for r in sc.q.chunks_exact_mut(d) {
        kv.rotate_q(r);
    }
    if sc.s.len() < nq * ncells {
        sc.s.resize(nq * ncells, 0.0);
    }
    sc.kt.resize(d * CB, 0.0);
    sc.rows.resize(CB * d, 0.0);
    sc.inv.resize(nq, 0.0);
    sc.w.resize(CB, 0.0);
    let in_place = kv.ty == KvType::F32 && !kv.ring && kv.shadow.sink == 0 && kv.shadow.window == 0;

    // scores: s[q][j - jlo]. Every cell of the block is read as a query at pmax reads it;
    // tiles share cells across tokens only when that is where every token reads it.
    let mut j0 = jlo;
    while j0 <= pmax {
        let n = CB.min(pmax + 1 - j0);
        let rows: &[f32] = if in_place {
            let b = kv.cell(g, j0);
            &kv.k[b..b + n * d]
        } else {
            for c in 0..n {
                kv.read(true, g, j0 + c, pmax, &mut sc.rows[c * d..(c + 1) * d]);
            }
            &sc.rows[..n * d]
        };
        for i in 0..d {
            for c in 0..CB {
                sc.kt[i * CB + c] = if c < n { rows[c * d + i] } else { 0.0 };
            }
        }
        let jb = j0 - jlo;
        let mut q0 = 0;
        while q0 + NQ <= nq {
            score_rows::<NQ>(&sc.q, &mut sc.s, &sc.kt, d, q0, ncells, jb, n, tl.scale);
            q0 += NQ;
        }
        while q0 < nq {
            score_rows::<1>(&sc.q, &mut sc.s, &sc.kt, d, q0, ncells, jb, n, tl.scale);
            q0 += 1;
        }
        j0 += n;
    }

    // softmax per query over its own cells lo..=p (max-subtracted, sum in f64)
    for k in 0..nt {
        let p = tl.pos[tl.t0 + k] as usize;
        let lo = kv.first_visible(p);
        for hh in 0..gs {
            let qi = k * gs + hh;
            let s = &mut sc.s[qi * ncells + lo - jlo..qi * ncells + p + 1 - jlo];
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
            sc.inv[qi] = (1.0 / sum) as f32;
        }
    }

    // o = Σ_j p_j v_j in increasing j, each V cell read once for the tile
    let in_place_v = in_place;
    let mut j0 = jlo;
    while j0 <= pmax {
        let n = CB.min(pmax + 1 - j0);
        let rows: &[f32] = if in_place_v {
            let b = kv.cell(g, j0);
            &kv.v[b..b + n * d]
        } else {
            for c in 0..n {
                kv.read(false, g, j0 + c, pmax, &mut sc.rows[c * d..(c + 1) * d]);
            }
            &sc.rows[..n * d]
        };
        for k in 0..nt {
            let p = tl.pos[tl.t0 + k] as usize;
            let lo = kv.first_visible(p);
            // cells of the block this token sees
            let (c0, c1) = (lo.max(j0) - j0, (p + 1).min(j0 + n).saturating_sub(j0));
            if c0 >= c1 {
                continue;
            }
            for hh in 0..gs {
                let qi = k * gs + hh;
                let inv = sc.inv[qi];
                let s = &sc.s[qi * ncells + j0 - jlo..];
                for c in c0..c1 {
                    sc.w[c] = s[c] * inv;
                }
                let oq = &mut o[qi * d..(qi + 1) * d];
                accumulate(oq, &rows[c0 * d..c1 * d], &sc.w[c0..c1], d);
            }
        }
        j0 += n;
    }
    for oq in o[..nq * d].chunks_exact_mut(d) {
        kv.unrotate_o(oq);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(tl: Tile<'_>, sc: &mut Scratch, o: &mut [f32]) {
    tile_impl::<8>(tl, sc, o)
}

fn tile(tl: Tile<'_>, o: &mut [f32]) {
    SCRATCH.with(|sc| {
        let sc = &mut *sc.borrow_mut();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked). Only mul and add are used (no FMA), so
            // the results are the same as the portable path's.
            return unsafe { tile_avx2(tl, sc, o) };
        }
        tile_impl::<4>(tl, sc, o)
    })
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
    let pos = token_positions(OP, pos, t)?;
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
        // Tokens share decoded cells when every token reads a cell from the same place:
        // no window shadows (their choice depends on the query position), no ring.
        let share = !kv.ring && kv.shadow.window == 0;
        let nt = b - a;
        let tt = if share { TT.min(nt) } else { 1 };
        let n_tiles = nt.div_ceil(tt);
        // Split a GQA group over several tiles only to give every thread work (each split
        // reads the cells again); the split never changes what an element computes.
        let threads = if par::outside_pool() { 1 } else { rayon::current_num_threads() };
        let mut gs = group;
        while gs % 2 == 0 && n_tiles * n_head_kv * (group / gs) < threads {
            gs /= 2;
        }
        let splits = group / gs;
        let work = decode_cost * d * max_kv * (tt + gs);
        let task = |idx: usize, o: &mut [f32]| {
            let tile_i = idx / (n_head_kv * splits);
            let r = idx % (n_head_kv * splits);
            let g = r / splits;
            let t0 = a + tile_i * tt;
            let tl = Tile { kv, q, pos, t0, t1: (t0 + tt).min(b), h0: g * group + (r % splits) * gs, gs, g, n_head, scale };
            tile(tl, o);
        };
        let ys = &mut y[a * n_head * d..b * n_head * d];
        if tt == 1 {
            // tile layout [token][KV head][split] = the output's [token][head]
            par::rows(ys, gs * d, work, task);
        } else {
            let per = tt * gs * d;
            let mut tmp = vec![0.0f32; n_tiles * n_head_kv * splits * per];
            par::rows(&mut tmp, per, work, task);
            for (idx, chunk) in tmp.chunks_exact(per).enumerate() {
                let tile_i = idx / (n_head_kv * splits);
                let r = idx % (n_head_kv * splits);
                let h0 = (r / splits) * group + (r % splits) * gs;
                let t0 = tile_i * tt;
                for kk in 0..(tt.min(nt - t0)) {
                    let dst = ((t0 + kk) * n_head + h0) * d;
                    ys[dst..dst + gs * d].copy_from_slice(&chunk[kk * gs * d..(kk + 1) * gs * d]);
                }
            }
        }
    }
    out_f32(OP, out, y)
}

impl crate::CpuBackend {
    /// One stateful op for several sequences (decode slots: `Backend::execute_multi`):
    /// unless every sequence's op is light enough to run inline, the sequences run
    /// concurrently on the pool, one task each (a kernel's own loops
    /// still split only when its work is large, `par::rows`). Every sequence's kernel
    /// computes exactly what it computes alone, so results are bitwise those of one
    /// `execute` per sequence, for any thread count.
    pub fn run_multi(
        &self,
        op: &pn_ops::Op,
        inputs: &[Vec<Value<'_>>],
        outs: &[TensorMeta],
        states: &mut [Option<&mut LayerState>],
    ) -> Result<Vec<Tensor>, OpError> {
        use rayon::prelude::*;
        if inputs.len() != outs.len() || inputs.len() != states.len() {
            return Err(OpError::Invalid { op: op.kind(), msg: format!("{} inputs, {} outputs, {} states", inputs.len(), outs.len(), states.len()) });
        }
        // Ops light enough to run inline (small DeltaRule / conv steps) stay on the
        // caller's thread one after another: a pool hand-off costs more than they do.
        let light = inputs.iter().zip(outs).all(|(ins, out)| crate::runs_inline(op, ins, out));
        if inputs.len() <= 1 || self.threads <= 1 || light {
            return inputs.iter().zip(outs).zip(states.iter_mut()).map(|((ins, out), st)| self.run(op, ins, out, st.as_deref_mut())).collect();
        }
        for (ins, out) in inputs.iter().zip(outs) {
            pn_ops::reference::common::validate(op, ins, out)?;
        }
        self.pool.install(|| {
            states
                .par_iter_mut()
                .zip(inputs.par_iter())
                .zip(outs.par_iter())
                .with_max_len(1)
                .map(|((st, ins), out)| crate::dispatch(op, ins, out, st.as_deref_mut()))
                .collect()
        })
    }
}
