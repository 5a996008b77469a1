//! Causal GQA attention over the KV cache, any cell format (docs/kv-cache.md). Per run of
//! the batch ([`KvCache::runs`]): k/v written first, then parallel over tiles of
//! (tokens × query heads of ONE KV head): in a prefill a task per TT tokens (all heads),
//! else per (token, GQA group or part of one). A tile reads (and, for f16/q8_0/q4_0 cells or
//! shadows, decodes) each KV cell once for all its queries: the GQA group's heads, and in
//! a prefill several tokens too, except in blocks of cells that the tokens read from
//! different places (where the window boundary moves; those each token reads on its own,
//! [`KvCache::same_source`]). Every (token, head) still computes exactly the reference's
//! sums in the same order: each score is Σ_i q_i k_i sequential in i from 0.0 then scaled
//! (several cells × queries are interleaved only for SIMD / instruction-level
//! parallelism), softmax as the reference, and each output element accumulates p_j v_j in
//! increasing j from 0.0. So results are bitwise the reference's for any tiling / threads.

mod kernels;

use crate::par;
use kernels::{accumulate, hadamard, score_range, softmax, transpose, CB};
use pn_ops::reference::attention::kv_cache;
use pn_ops::reference::common::{act_f32, act_i32, out_f32, token_positions};
use pn_ops::{KvCache, KvType, LayerState, OpError, Tensor, TensorMeta, Value};
use std::cell::RefCell;

/// Per-thread scratch: rotated queries, scores, a transposed K block, decoded cells,
/// weights, the tile's outputs.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    s: Vec<f32>,
    inv: Vec<f32>,
    kt: Vec<f32>,
    rows: Vec<f32>,
    w: Vec<f32>,
    o: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Tokens per tile (prefill): they share the cells they read from the same place.
const TT: usize = 4;
/// Cells per block of the V pass.
const VB: usize = 16;

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
    /// Stride between the tile's tokens in its output slice (head hh of token k at
    /// k·ostride + hh·d).
    ostride: usize,
}

/// Cells `j0..j0 + n` of K (`key`) or V as a query at `p` reads them, `[n][d]`: in place
/// for plain f32 caches, else decoded into `buf`. Cells past `p` (unseen) are zeros.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn cells<'a>(kv: &'a KvCache, key: bool, g: usize, j0: usize, n: usize, p: usize, in_place: bool, buf: &'a mut [f32]) -> &'a [f32] {
    let d = kv.head_dim;
    if in_place && j0 + n <= p + 1 {
        let b = kv.cell(g, j0);
        return if key { &kv.k[b..b + n * d] } else { &kv.v[b..b + n * d] };
    }
    for (c, r) in buf[..n * d].chunks_exact_mut(d).enumerate() {
        if j0 + c <= p {
            kv.read(key, g, j0 + c, p, r);
        } else {
            r.fill(0.0);
        }
    }
    &buf[..n * d]
}

/// V pass of queries `qa..qb` (rows of `o`, `[nq][d]`) over the cells `c0..c1` of a block
/// (`rows`: `[n][d]`) whose first cell is column `jb` of the probabilities (`s`: a row of
/// `ncells` per query, times `inv`): o_q += Σ_c p_qc · rows[c] in increasing c.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn v_run<const NV: usize>(o: &mut [f32], w: &mut [f32], (s, inv, ncells): (&[f32], &[f32], usize), rows: &[f32], (qa, qb): (usize, usize), (c0, c1): (usize, usize), jb: usize, d: usize) {
    let m = c1 - c0;
    for qi in qa..qb {
        let sq = &s[qi * ncells + jb..];
        for c in c0..c1 {
            w[(qi - qa) * m + c - c0] = sq[c] * inv[qi];
        }
    }
    accumulate::<NV>(&mut o[qa * d..qb * d], &rows[c0 * d..c1 * d], w, m, d);
}

/// Attention of one tile into `o` (token k's heads at `k·ostride`). `NQ` / `NV`: queries per
/// register block of the score / V kernel; `AVX`: the CPU has AVX2.
#[inline(always)]
fn tile_impl<const NQ: usize, const NV: usize, const AVX: bool>(tl: Tile<'_>, sc: &mut Scratch, o: &mut [f32]) {
    let kv = tl.kv;
    let d = kv.head_dim;
    let (g, gs) = (tl.g, tl.gs);
    let pos = &tl.pos[tl.t0..tl.t1];
    let nt = pos.len();
    let nq = nt * gs;
    let pmin = pos.iter().map(|&p| p as usize).min().unwrap_or(0);
    let pmax = pos.iter().map(|&p| p as usize).max().unwrap_or(0);
    let jlo = pos.iter().map(|&p| kv.first_visible(p as usize)).min().unwrap_or(0);
    let ncells = pmax + 1 - jlo;
    // rotated queries, row k·gs + hh
    sc.q.clear();
    for k in 0..nt {
        let src = ((tl.t0 + k) * tl.n_head + tl.h0) * d;
        sc.q.extend_from_slice(&tl.q[src..src + gs * d]);
    }
    hadamard(&mut sc.q, kv.rot_k);
    if sc.s.len() < nq * ncells {
        // room for the whole cache when that is small (≤ 4 MB): a growing context then
        // never reallocates the scores on the decode path
        let whole = (nq * kv.capacity).min(1 << 20);
        sc.s.resize((nq * ncells).max(whole), 0.0);
    }
    sc.kt.resize(d * CB, 0.0);
    sc.rows.resize(CB.max(VB) * d, 0.0);
    sc.inv.resize(nq, 0.0);
    sc.w.resize(nq * VB, 0.0);
    sc.o.clear();
    sc.o.resize(nq * d, 0.0);
    let in_place = kv.ty == KvType::F32 && !kv.ring && kv.shadow.sink == 0 && kv.shadow.window == 0;
    // A block is shared when every token that sees one of its cells reads it from where
    // a query at pmax does; else (the window boundary moves through it: ≤ pmax − pmin
    // cells per tile) each token reads it on its own, from where it reads it.
    let shared = |j0: usize, n: usize| nt == 1 || (j0..j0 + n).all(|j| kv.same_source(j, j.max(pmin), pmax));
    let seen = |p: usize, j0: usize, n: usize| j0 <= p && kv.first_visible(p) < j0 + n;

    // scores: s[q][j - jlo] (entries a query does not see are never read)
    let mut j0 = jlo;
    while j0 <= pmax {
        let n = CB.min(pmax + 1 - j0);
        let jb = j0 - jlo;
        if shared(j0, n) {
            let rows = cells(kv, true, g, j0, n, pmax, in_place, &mut sc.rows);
            transpose::<AVX>(rows, n, d, &mut sc.kt);
            score_range::<NQ>(&sc.q, &mut sc.s, &sc.kt, d, 0, nq, ncells, jb, n, tl.scale);
        } else {
            for (k, &p) in pos.iter().enumerate() {
                let p = p as usize;
                if seen(p, j0, n) {
                    let rows = cells(kv, true, g, j0, n, p, in_place, &mut sc.rows);
                    transpose::<AVX>(rows, n, d, &mut sc.kt);
                    score_range::<NQ>(&sc.q, &mut sc.s, &sc.kt, d, k * gs, (k + 1) * gs, ncells, jb, n, tl.scale);
                }
            }
        }
        j0 += n;
    }

    // softmax per query over its own cells lo..=p (one token's queries share the range)
    for (k, &p) in pos.iter().enumerate() {
        let lo = kv.first_visible(p as usize);
        let (a, b) = (k * gs * ncells + lo - jlo, k * gs * ncells + p as usize + 1 - jlo);
        softmax(&mut sc.s, ncells, a, b, &mut sc.inv[k * gs..(k + 1) * gs]);
    }

    // o = Σ_j p_j v_j in increasing j, per block of VB cells: tokens k..k2 that see the
    // same cells c0..c1 of the block (and read them from the same place) go together.
    let vis = |p: usize, j0: usize, n: usize| seen(p, j0, n).then(|| (kv.first_visible(p).max(j0) - j0, (p + 1).min(j0 + n) - j0));
    let mut j0 = jlo;
    while j0 <= pmax {
        let n = VB.min(pmax + 1 - j0);
        if shared(j0, n) {
            let rows = cells(kv, false, g, j0, n, pmax, in_place, &mut sc.rows);
            let mut k = 0;
            while k < nt {
                let r = vis(pos[k] as usize, j0, n);
                let mut k2 = k + 1;
                while k2 < nt && vis(pos[k2] as usize, j0, n) == r {
                    k2 += 1;
                }
                if let Some(r) = r {
                    v_run::<NV>(&mut sc.o, &mut sc.w, (&sc.s, &sc.inv, ncells), rows, (k * gs, k2 * gs), r, j0 - jlo, d);
                }
                k = k2;
            }
        } else {
            for (k, &p) in pos.iter().enumerate() {
                let p = p as usize;
                if let Some(r) = vis(p, j0, n) {
                    let rows = cells(kv, false, g, j0, n, p, in_place, &mut sc.rows);
                    v_run::<NV>(&mut sc.o, &mut sc.w, (&sc.s, &sc.inv, ncells), rows, (k * gs, (k + 1) * gs), r, j0 - jlo, d);
                }
            }
        }
        j0 += n;
    }
    hadamard(&mut sc.o, kv.rot_v);
    for (k, ok) in sc.o.chunks_exact(gs * d).enumerate() {
        o[k * tl.ostride..k * tl.ostride + gs * d].copy_from_slice(ok);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(tl: Tile<'_>, sc: &mut Scratch, o: &mut [f32]) {
    tile_impl::<8, 4, true>(tl, sc, o)
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
        tile_impl::<4, 2, false>(tl, sc, o)
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
    let mut y = vec![0.0f32; out.shape.numel()];
    attention_into(ins, out, state, n_head, n_head_kv, d, scale, &mut y)?;
    out_f32("Attention", out, y)
}

/// `attention` into `y` (every element written; no allocation per call once the
/// per-thread scratch is warm).
#[allow(clippy::too_many_arguments)]
pub fn attention_into(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    n_head: usize,
    n_head_kv: usize,
    d: usize,
    scale: f32,
    y: &mut [f32],
) -> Result<(), OpError> {
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
    crate::norm::len_check(OP, d * n_head * t, y.len())?;
    y.fill(0.0);
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
        let nt = b - a;
        let threads = if par::outside_pool() { 1 } else { rayon::current_num_threads() };
        let ys = &mut y[a * n_head * d..b * n_head * d];
        let tile_at = |t0: usize, t1: usize, h0: usize, gs: usize, ostride: usize, o: &mut [f32]| {
            tile(Tile { kv, q, pos, t0, t1, h0, gs, g: h0 / group, n_head, scale, ostride }, o);
        };
        // tokens per tile: up to TT while every thread still gets a task
        let tt = (1..=TT).rev().find(|&tt| nt >= tt * threads).unwrap_or(1);
        if tt > 1 {
            // prefill: a task per tt tokens, its tiles of every KV head
            let work = decode_cost * d * max_kv * (tt + group) * n_head_kv;
            par::rows(ys, tt * n_head * d, work, |i, o| {
                let t0 = a + i * tt;
                for g in 0..n_head_kv {
                    tile_at(t0, (t0 + tt).min(b), g * group, group, n_head * d, &mut o[g * group * d..]);
                }
            });
        } else {
            // a tile per (token, part of a GQA group): split a group only to give every
            // thread work (each split reads the cells again; never changes what an element
            // computes). Layout [token][KV head][split] = the output's [token][head].
            let mut gs = group;
            while gs.is_multiple_of(2) && nt * n_head_kv * (group / gs) < threads {
                gs /= 2;
            }
            let work = decode_cost * d * max_kv * (1 + gs);
            par::rows(ys, gs * d, work, |i, o| tile_at(a + i / (n_head / gs), a + i / (n_head / gs) + 1, (i % (n_head / gs)) * gs, gs, 0, o));
        }
    }
    Ok(())
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
