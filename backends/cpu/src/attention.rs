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
use kernels::{accumulate, blocks_for, hadamard, score_blocks, score_range, softmax, transpose, CB};
use pn_ops::reference::attention::kv_cache;
use pn_ops::reference::common::{act_f32, act_i32, out_f32, token_positions};
use pn_ops::{KvCache, KvType, LayerState, OpError, SeqSpan, Tensor, TensorMeta, Value};
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
    let seen = (p + 1).saturating_sub(j0).min(n);
    kv.read_cells(key, g, j0, seen, p, &mut buf[..seen * d]);
    buf[seen * d..n * d].fill(0.0);
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
    // a decode tile of few queries: several full blocks at a time (one token: every
    // block is shared)
    let nblk = if nt == 1 { blocks_for(nq) } else { 0 };
    sc.kt.resize(d * CB * nblk.max(1), 0.0);
    sc.rows.resize((CB * nblk).max(CB.max(VB)) * d, 0.0);
    while j0 <= pmax {
        let jb = j0 - jlo;
        if nblk > 0 && pmax + 1 - j0 >= nblk * CB {
            let rows = cells(kv, true, g, j0, nblk * CB, pmax, in_place, &mut sc.rows);
            for b in 0..nblk {
                transpose::<AVX>(&rows[b * CB * d..], CB, d, &mut sc.kt[b * d * CB..]);
            }
            score_blocks(&sc.q, &mut sc.s, &sc.kt, d, nq, ncells, jb, tl.scale);
            j0 += nblk * CB;
            continue;
        }
        let n = CB.min(pmax + 1 - j0);
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

/// The inputs of one attention call: q `[d][n_head][T]`, k / v `[d][n_head_kv][T]` of
/// the pass (all its sequences' tokens), and the op's parameters.
#[derive(Clone, Copy)]
struct Attn<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    n_head: usize,
    n_head_kv: usize,
    d: usize,
    scale: f32,
}

impl<'a> Attn<'a> {
    fn from_ins(ins: &[Value<'a>], n_head: usize, n_head_kv: usize, d: usize, scale: f32) -> Result<(Attn<'a>, &'a [i32]), OpError> {
        const OP: &str = "Attention";
        let a = Attn { q: act_f32(OP, &ins[0])?, k: act_f32(OP, &ins[1])?, v: act_f32(OP, &ins[2])?, n_head, n_head_kv, d, scale };
        Ok((a, act_i32(OP, &ins[3])?))
    }
    /// The tokens `r` of the pass (one sequence's).
    fn tokens(&self, r: std::ops::Range<usize>) -> Attn<'a> {
        let (qs, ks) = (self.n_head * self.d, self.n_head_kv * self.d);
        Attn { q: &self.q[r.start * qs..r.end * qs], k: &self.k[r.start * ks..r.end * ks], v: &self.v[r.start * ks..r.end * ks], ..*self }
    }
    /// Writes k, v of tokens `a..b` (positions `pos`) into the cache.
    fn write(&self, kv: &mut KvCache, pos: &[i32], (a, b): (usize, usize)) {
        let d = self.d;
        for (ti, &p) in pos.iter().enumerate().take(b).skip(a) {
            for g in 0..self.n_head_kv {
                let src = (ti * self.n_head_kv + g) * d;
                kv.write(g, p as usize, &self.k[src..src + d], &self.v[src..src + d]);
            }
        }
    }
}

/// Cost per cell and dim of reading a cache of this format (decoding costs more).
fn decode_cost(kv: &KvCache) -> usize {
    if kv.ty == KvType::F32 {
        2
    } else {
        4
    }
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
    let (at, pos) = Attn::from_ins(ins, n_head, n_head_kv, d, scale)?;
    let t = out.shape.0[1];
    let pos = token_positions(OP, pos, t)?;
    let kv = kv_cache(OP, state)?;
    kv.check_positions(OP, pos)?;
    crate::norm::len_check(OP, d * n_head * t, y.len())?;
    y.fill(0.0);
    attend(&at, pos, kv, y);
    Ok(())
}

/// One sequence's attention (`at`, `pos`: its tokens), the cache written run by run.
fn attend(at: &Attn<'_>, pos: &[i32], kv: &mut KvCache, y: &mut [f32]) {
    let (n_head, n_head_kv, d) = (at.n_head, at.n_head_kv, at.d);
    let group = n_head / n_head_kv;
    let cost = decode_cost(kv);
    for (a, b) in kv.runs(pos) {
        at.write(kv, pos, (a, b));
        let kv: &KvCache = kv;
        let max_kv = pos[a..b].iter().map(|&p| p as usize + 1 - kv.first_visible(p as usize)).max().unwrap_or(0);
        let nt = b - a;
        let threads = if par::outside_pool() { 1 } else { rayon::current_num_threads() };
        let ys = &mut y[a * n_head * d..b * n_head * d];
        let tile_at = |t0: usize, t1: usize, h0: usize, gs: usize, ostride: usize, o: &mut [f32]| {
            tile(Tile { kv, q: at.q, pos, t0, t1, h0, gs, g: h0 / group, n_head, scale: at.scale, ostride }, o);
        };
        // tokens per tile: up to TT while every thread still gets a task
        let tt = (1..=TT).rev().find(|&tt| nt >= tt * threads).unwrap_or(1);
        if tt > 1 {
            // prefill: a task per tt tokens, its tiles of every KV head
            let work = cost * d * max_kv * (tt + group) * n_head_kv;
            par::rows(ys, tt * n_head * d, work, |i, o| {
                let t0 = a + i * tt;
                for g in 0..n_head_kv {
                    tile_at(t0, (t0 + tt).min(b), g * group, group, n_head * d, &mut o[g * group * d..]);
                }
            });
        } else {
            let gs = split_group(group, nt * n_head_kv, threads);
            let work = cost * d * max_kv * (1 + gs);
            par::rows(ys, gs * d, work, |i, o| tile_at(a + i / (n_head / gs), a + i / (n_head / gs) + 1, (i % (n_head / gs)) * gs, gs, 0, o));
        }
    }
}

/// Query heads per decode tile: the whole GQA group, split only to give every thread
/// work (each split reads the cells again; never changes what an element computes).
fn split_group(group: usize, tasks_per_split: usize, threads: usize) -> usize {
    let mut gs = group;
    while gs.is_multiple_of(2) && tasks_per_split * (group / gs) < threads {
        gs /= 2;
    }
    gs
}

/// Tokens up to which a sequence of a multi-sequence pass joins the shared loop over
/// (token, head group) tiles; longer ones (prefill chunks) run on their own.
const SHARED_MAX: usize = 4;

/// Attention for every sequence of a pass in one call (`HostKernels::kernel_seqs`):
/// sequence `i` owns tokens `spans[i]` and the KV cache of `states[i]`. Short sequences
/// (decode tokens) have their cells written first, then ONE parallel loop over the
/// (token, head group) tiles of all of them; a longer one (or one whose cache writes
/// wrap within the pass) runs alone as [`attention_into`] runs it. A tile computes
/// exactly what it computes in a single-sequence call, so every row is bitwise the
/// sequence alone, for any mix and thread count.
#[allow(clippy::too_many_arguments)]
pub fn attention_seqs(
    ins: &[Value<'_>],
    out: &TensorMeta,
    spans: &[SeqSpan],
    states: &mut [&mut LayerState],
    (n_head, n_head_kv, d, scale): (usize, usize, usize, f32),
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Attention";
    let (at, pos) = Attn::from_ins(ins, n_head, n_head_kv, d, scale)?;
    let t = out.shape.0[1];
    let pos = token_positions(OP, pos, t)?;
    pn_ops::state::check_spans(OP, spans, states.len(), t)?;
    crate::norm::len_check(OP, d * n_head * t, y.len())?;
    y.fill(0.0);
    let qs = n_head * d;
    // per sequence: its cache if it joins the shared loop (cells written), else run now
    let mut shared: Vec<Option<&KvCache>> = Vec::with_capacity(spans.len());
    let (mut max_kv, mut cost, mut n_shared) = (0, 2, 0);
    for (sp, st) in spans.iter().zip(states.iter_mut()) {
        let kv = kv_cache(OP, Some(&mut **st))?;
        let p = &pos[sp.range()];
        kv.check_positions(OP, p)?;
        let sub = at.tokens(sp.range());
        if sp.len <= SHARED_MAX && kv.runs(p).len() == 1 {
            sub.write(kv, p, (0, sp.len));
            let kv: &KvCache = kv;
            max_kv = p.iter().map(|&q| q as usize + 1 - kv.first_visible(q as usize)).fold(max_kv, usize::max);
            cost = cost.max(decode_cost(kv));
            n_shared += sp.len;
            shared.push(Some(kv));
        } else {
            attend(&sub, p, kv, &mut y[sp.start * qs..(sp.start + sp.len) * qs]);
            shared.push(None);
        }
    }
    if n_shared == 0 {
        return Ok(());
    }
    // token → (sequence, its first token), for the shared tiles
    let mut owner = Vec::with_capacity(t);
    for (i, sp) in spans.iter().enumerate() {
        owner.extend(std::iter::repeat_n((i, sp.start), sp.len));
    }
    let group = n_head / n_head_kv;
    let threads = if par::outside_pool() { 1 } else { rayon::current_num_threads() };
    let gs = split_group(group, n_shared * n_head_kv, threads);
    let per_tok = n_head / gs;
    let work = cost * d * max_kv * (1 + gs);
    par::rows(y, gs * d, work, |i, o| {
        let (ti, h0) = (i / per_tok, (i % per_tok) * gs);
        let (s, start) = owner[ti];
        if let Some(kv) = shared[s] {
            let sp = spans[s];
            let q = &at.q[start * qs..(start + sp.len) * qs];
            let k = ti - start;
            tile(Tile { kv, q, pos: &pos[sp.range()], t0: k, t1: k + 1, h0, gs, g: h0 / group, n_head, scale, ostride: 0 }, o);
        }
    });
    Ok(())
}
