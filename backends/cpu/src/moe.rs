//! MoE routing (TopK, MoeWeights) and routed experts. MoeExperts routes every token
//! first, groups the (token, slot) pairs by expert, and runs each projection of every
//! active expert as one parallel loop over (expert, block of weight rows), each block
//! dotting its weight rows with all of the expert's tokens in tiles. Each (token, slot)
//! result is kept, and finally each token sums its slots in selection order — the
//! reference's order, whatever the batch.

use crate::matmul::{dot_rows_tokens, quantize_rows_to};
use crate::par;
use pn_ops::reference::common::{
    act_f32, act_format, act_i32, out_f32, out_i32, topk_before, MOE_MIN_WEIGHT_SUM,
};
use pn_ops::reference::moe::ExpertSet;
use pn_ops::{GgmlType, OpError, Tensor, TensorMeta, Value};
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    static IDX: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub fn topk(ins: &[Value<'_>], out: &TensorMeta, k: usize) -> Result<Tensor, OpError> {
    let mut y = vec![0i32; out.shape.numel()];
    topk_into(ins, out, k, &mut y)?;
    out_i32("TopK", out, y)
}

/// `topk` into `y` (every element written).
pub fn topk_into(ins: &[Value<'_>], out: &TensorMeta, k: usize, y: &mut [i32]) -> Result<(), OpError> {
    const OP: &str = "TopK";
    let x = act_f32(OP, &ins[0])?;
    let n = ins[0].act().shape.0[0];
    let rows = out.shape.rows();
    crate::norm::len_check(OP, k * rows, y.len())?;
    par::rows(y, k, 8 * n, |r, yr| {
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
    Ok(())
}

pub fn moe_weights(
    ins: &[Value<'_>],
    out: &TensorMeta,
    normalize: bool,
) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    moe_weights_into(ins, out, normalize, &mut y)?;
    out_f32("MoeWeights", out, y)
}

/// `moe_weights` into `y` (every element written).
pub fn moe_weights_into(ins: &[Value<'_>], out: &TensorMeta, normalize: bool, y: &mut [f32]) -> Result<(), OpError> {
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
    crate::norm::len_check(OP, k * t, y.len())?;
    par::rows(y, k, 4 * k, |ti, row| {
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
    Ok(())
}

/// Tokens per pass over the experts: longer batches run in blocks, which bounds the
/// scratch (~100 KB per token at full dims: ~52 MB, one copy per process, see
/// [`SHARED`]); each token's result does not depend on the blocking. 512 (with the CLI's
/// 512-token passes) gives 256 experts ~16 tokens each, the AMX tiles' size, where 256
/// gave ~8 on the VNNI kernel: `moe_bench` E=256, 512 tokens, knob 16 alternated (Xeon
/// 6/207, 2 threads) 84.8 → 73.7 ms; `prefill_ab` real-dims q4_k_m pp512 (ubatch 256 →
/// 512 with this block) median per-round ratio 1.064, full-dims 1.062, the default model
/// 1.013. (Session 4, Zen 4, 64 experts: 256 was 5–8% faster than 128.)
const MOE_TOKEN_BLOCK: usize = 512;

const OP: &str = "MoeExperts";

pub fn moe_experts(ins: &[Value<'_>], out: &TensorMeta, merged: bool) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    moe_experts_into(ins, out, merged, &mut y)?;
    out_f32(OP, out, y)
}

/// `moe_experts` into `y` (every element written).
pub fn moe_experts_into(ins: &[Value<'_>], out: &TensorMeta, merged: bool, y: &mut [f32]) -> Result<(), OpError> {
    let x = act_f32(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let wts = act_f32(OP, &ins[2])?;
    let ex = ExpertSet::new(OP, ins, merged)?;
    let kd = ex.k;
    let top = ins[1].act().shape.0[0];
    let t = out.shape.0[1];
    let n_slots = top * t;
    if x.len() != kd * t || ids.len() != n_slots || wts.len() != n_slots {
        return Err(OpError::Invalid {
            op: OP,
            msg: "inputs do not match [K, T] / [k, T]".into(),
        });
    }
    for &id in ids {
        ex.check_id(OP, id)?;
    }
    crate::norm::len_check(OP, kd * t, y.len())?;
    SCRATCH.with(|sc| {
    let mut res = Ok(());
    let block = tuned!(KNOB_MOE_TOKEN_BLOCK, MOE_TOKEN_BLOCK).max(1);
    for t0 in (0..t).step_by(block) {
        let n = block.min(t - t0);
        let (s0, s1) = (t0 * top, (t0 + n) * top);
        let yb = &mut y[t0 * kd..(t0 + n) * kd];
        res = moe_block(&ex, &x[t0 * kd..(t0 + n) * kd], &ids[s0..s1], &wts[s0..s1], top, n, yb, sc);
        if res.is_err() {
            break;
        }
    }
    res
    })
}

/// Buffers of `moe_block` reused from call to call.
#[derive(Default)]
struct MoeScratch {
    counts: Vec<usize>,
    starts: Vec<usize>,
    order: Vec<usize>,
    active: Vec<usize>,
    at: Vec<usize>,
    xq: Vec<u8>,
    xgs: Vec<u8>,
    xus: Vec<u8>,
    hq: Vec<u8>,
    gu: Vec<f32>,
    res: Vec<f32>,
}

impl MoeScratch {
    const fn new() -> MoeScratch {
        MoeScratch {
            counts: Vec::new(),
            starts: Vec::new(),
            order: Vec::new(),
            active: Vec::new(),
            at: Vec::new(),
            xq: Vec::new(),
            xgs: Vec::new(),
            xus: Vec::new(),
            hq: Vec::new(),
            gu: Vec::new(),
            res: Vec::new(),
        }
    }
}

/// The process's MoE scratch (`crate::scratch`).
static SCRATCH: crate::scratch::Shared<MoeScratch> = crate::scratch::Shared::new(MoeScratch::new());

/// `v` cleared and resized to `n` copies of `x` (its allocation reused).
fn reset<T: Clone>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    v.resize(n, x);
}

/// The first `n` items of `v`, grown (never shrunk or cleared) to hold them: for buffers
/// whose every item the caller overwrites (no memset of megabytes per layer).
fn grown<T: Clone + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// The routed experts for `t` tokens (ids already checked): `[K][t]` results in `y`.
#[allow(clippy::too_many_arguments)]
fn moe_block(
    ex: &ExpertSet<'_>,
    x: &[f32],
    ids: &[i32],
    wts: &[f32],
    top: usize,
    t: usize,
    y: &mut [f32],
    sc: &mut MoeScratch,
) -> Result<(), OpError> {
    let MoeScratch {
        counts,
        starts,
        order,
        active,
        at,
        xq,
        xgs,
        xus,
        hq,
        gu,
        res,
    } = sc;
    let merged = ex.merged;
    let (kd, f, ne) = (ex.k, ex.f, ex.e);
    let (gt, grb) = act_format(OP, ex.gate.ty, kd)?;
    let (ut, urb) = act_format(OP, ex.up.ty, kd)?;
    let (dt, drb) = act_format(OP, ex.down.ty, f)?;
    let n_slots = top * t;

    // Route: validate ids, then a stable counting sort of the slots by expert. `order`
    // lists the slots expert by expert; expert e owns order[starts[e]..starts[e + 1]].
    reset(counts, ne + 1, 0);
    for &id in ids {
        counts[id as usize + 1] += 1;
    }
    for e in 0..ne {
        counts[e + 1] += counts[e];
    }
    starts.clear();
    starts.extend_from_slice(counts);
    let starts = &*starts;
    reset(order, n_slots, 0);
    for (slot, &id) in ids.iter().enumerate() {
        let e = id as usize;
        order[counts[e]] = slot;
        counts[e] += 1;
    }
    let order = &*order;
    active.clear();
    active.extend((0..ne).filter(|&e| starts[e + 1] > starts[e]));
    let active = &*active;

    // Each token's x converted once per activation type, then gathered in `order`.
    let gather = |src: &[u8], rb: usize, q: &mut Vec<u8>| {
        q.clear();
        for &s in order {
            let tok = s / top;
            q.extend_from_slice(&src[tok * rb..(tok + 1) * rb]);
        }
    };
    quantize_rows_to(gt, x, kd, grb, xq);
    gather(xq, grb, xgs);
    let xgs = &*xgs;
    let xus = if merged || ut == gt {
        None
    } else {
        quantize_rows_to(ut, x, kd, urb, xq);
        gather(xq, urb, xus);
        Some(xus.as_slice())
    };

    let xs = Inputs { ex, xg: xgs, grb, xu: xus, urb, dt, drb };
    let res = grown(res, n_slots * kd);
    if by_expert(active, starts) {
        expert_ffns(&xs, active, starts, res);
    } else {
        projection_loops(&xs, active, starts, hq, gu, res);
    }
    let rs = &*res;

    // Where each slot's result lives: its index in `order`.
    reset(at, n_slots, 0);
    for (i, &s) in order.iter().enumerate() {
        at[s] = i;
    }
    let at = &*at;
    // Each token sums its slots in selection order, each result scaled first (as the
    // reference: v = o·w, then acc += v).
    y.fill(0.0);
    par::rows(y, kd, kd * top, |ti, acc| {
        for r in 0..top {
            let s = ti * top + r;
            let o = &rs[at[s] * kd..(at[s] + 1) * kd];
            let w = wts[s];
            for (v, &x) in acc.iter_mut().zip(o) {
                *v += x * w;
            }
        }
    });
    Ok(())
}

/// The converted activations an expert's FFN reads: gate's (and up's, when its type
/// differs and the tensors are separate) gathered in slot order, and the hidden rows'
/// format for the down projection.
struct Inputs<'a> {
    ex: &'a ExpertSet<'a>,
    xg: &'a [u8],
    grb: usize,
    xu: Option<&'a [u8]>,
    urb: usize,
    dt: GgmlType,
    drb: usize,
}

impl Inputs<'_> {
    /// Rows `r0..r0 + nr` of expert e's [gate (F rows); up (F rows)] dotted with its `n`
    /// tokens (slots from `s0`), token-major: row r, token j at `dst[j·tstride + r − r0]`
    /// (the expert's `[n][2F]` rows, `tstride` = 2F). Split where gate and up meet.
    ///
    /// # Safety
    /// [`dot_rows_tokens`]' contract for those rows and tokens.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gate_up(&self, e: usize, s0: usize, n: usize, r0: usize, nr: usize, dst: *mut f32, tstride: usize) {
        let (ex, kd, f) = (self.ex, self.ex.k, self.ex.f);
        let mut r = r0;
        while r < r0 + nr {
            let (w, xs, rb, row, end) = if r < f {
                (ex.gate.expert(e), self.xg, self.grb, r, (r0 + nr).min(f))
            } else if ex.merged {
                (ex.gate.expert(e), self.xg, self.grb, r, r0 + nr)
            } else {
                let (xs, rb) = match self.xu {
                    Some(xu) => (xu, self.urb),
                    None => (self.xg, self.grb),
                };
                (ex.up.expert(e), xs, rb, r - f, r0 + nr)
            };
            // SAFETY: rows r..end of the caller's r0..r0 + nr
            unsafe { dot_rows_tokens(&w, kd, row, end - r, &xs[s0 * rb..(s0 + n) * rb], rb, n, dst.add(r - r0), tstride) };
            r = end;
        }
    }

    /// silu(g) ⊙ u of `n` slots from their `[n][2F]` gate/up rows `g` (gate F, then up F),
    /// each converted for the down projection into its row of `q` (`h`: F floats of
    /// scratch).
    fn hidden(&self, g: &[f32], n: usize, h: &mut [f32], q: &mut [u8]) {
        let f = self.ex.f;
        let h = &mut h[..f];
        for (gj, qr) in g.chunks_exact(2 * f).zip(q.chunks_mut(self.drb)).take(n) {
            crate::elementwise::swiglu_row(h, &gj[..f], &gj[f..]);
            pn_ops::quant::quantize_row(self.dt, h, qr);
        }
    }
}

/// Tokens per expert up to which each expert's whole FFN (gate/up, hidden, down) is one
/// task (`expert_ffns`), when there are enough experts to share out: three parallel
/// loops and their hand-offs fewer a pass, which is what an expert with a few tokens
/// costs most. Measured (`decode_ab`, knob 15 at 0 vs default, alternated, Xeon 6/207, 2
/// threads): default model `SLOTS=16` (4 tokens per expert) 1.044×; full-dims q4_k_m
/// `SLOTS=1 / 4 / 16` 1.032 / 1.010 / 1.025×; 256 experts at 8 per expert (rd4 prefill,
/// ubatch 256: few passes qualify) 0.988×, inside the noise.
const FUSED_UPTO_TOKENS: usize = 8;

/// Whether the pass runs one task per expert (`expert_ffns`): every active expert has at
/// most `FUSED_UPTO_TOKENS` tokens, and there are at least two experts per thread.
fn by_expert(active: &[usize], starts: &[usize]) -> bool {
    let upto = tuned!(KNOB_MOE_FUSED_UPTO, FUSED_UPTO_TOKENS);
    active.len() >= 2 * rayon::current_num_threads().max(1)
        && active.iter().all(|&e| starts[e + 1] - starts[e] <= upto)
}

thread_local! {
    /// `expert_ffns`' per-task buffers: gate/up, hidden and down floats; hidden rows.
    static FFN: RefCell<(Vec<f32>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Each active expert's whole FFN as one task, in parallel over experts: `res` gets
/// every slot's result row (in `order`), the same dot products as `projection_loops`.
fn expert_ffns(xs: &Inputs<'_>, active: &[usize], starts: &[usize], res: &mut [f32]) {
    let (kd, f) = (xs.ex.k, xs.ex.f);
    let pairs = starts[starts.len() - 1];
    let serial = active.len() <= 1 || 3 * kd * f * pairs < par::SERIAL_WORK || par::outside_pool();
    split_experts(res, active, starts, kd, serial, &|e, out| {
        let (s0, n) = (starts[e], starts[e + 1] - starts[e]);
        FFN.with(|b| {
            let (fl, q) = &mut *b.borrow_mut();
            let fl = grown(fl, 2 * f * n + f);
            let (gu, h) = fl.split_at_mut(2 * f * n);
            // SAFETY: gu holds the n × 2F token rows, this task's own
            unsafe { xs.gate_up(e, s0, n, 0, 2 * f, gu.as_mut_ptr(), 2 * f) };
            let q = grown(q, n * xs.drb);
            xs.hidden(gu, n, h, q);
            // SAFETY: out is this expert's n × K slot rows, this task's own
            unsafe { dot_rows_tokens(&xs.ex.down.expert(e), f, 0, kd, q, xs.drb, n, out.as_mut_ptr(), kd) };
        });
    });
}

/// Each projection of every active expert as one parallel loop over (expert, block of
/// weight rows), the hidden rows per expert between them: `res` gets every slot's
/// result row (in `order`).
fn projection_loops(xs: &Inputs<'_>, active: &[usize], starts: &[usize], hq: &mut Vec<u8>, gu: &mut Vec<f32>, res: &mut [f32]) {
    let (kd, f, drb) = (xs.ex.k, xs.ex.f, xs.drb);
    let n_slots = starts[starts.len() - 1];
    // Gate and up: expert e's results at gu[2f·starts[e]..] as [n_e][2F] token rows.
    let gu = grown(gu, n_slots * 2 * f);
    expert_blocks(gu, active, starts, 2 * f, kd, |e, r0, nr, dst| {
        let (s0, n) = (starts[e], starts[e + 1] - starts[e]);
        // SAFETY: expert_blocks' contract: columns r0..r0 + nr of e's token rows
        unsafe { xs.gate_up(e, s0, n, r0, nr, dst, 2 * f) };
    });
    // The hidden rows, one task per expert.
    let gu = &*gu;
    let hq = grown(hq, n_slots * drb);
    per_expert(hq, active, starts, drb, |e, q| {
        let (s0, n) = (starts[e], starts[e + 1] - starts[e]);
        HID.with(|h| {
            let mut h = h.borrow_mut();
            let h = grown(&mut h, f);
            xs.hidden(&gu[2 * f * s0..2 * f * (s0 + n)], n, h, q);
        });
    });
    // Down: expert e's results straight into its slot rows res[kd·starts[e]..] ([n_e][K]).
    let hq = &*hq;
    expert_blocks(res, active, starts, kd, f, |e, r0, nr, dst| {
        let (s0, n) = (starts[e], starts[e + 1] - starts[e]);
        // SAFETY: expert_blocks' contract, as above
        unsafe { dot_rows_tokens(&xs.ex.down.expert(e), f, r0, nr, &hq[s0 * drb..(s0 + n) * drb], drb, n, dst, kd) };
    });
}

thread_local! {
    static HID: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Splits `buf` into the active experts' regions (`per_slot` items per slot, expert e
/// at `per_slot·starts[e]`) and runs `f(e, region)` on each, in parallel (recursive
/// halving with `rayon::join`: no task list to allocate).
fn per_expert<T: Send, F>(buf: &mut [T], active: &[usize], starts: &[usize], per_slot: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    let serial = active.len() <= 1
        || per_slot * starts[starts.len() - 1] < par::SERIAL_WORK
        || par::outside_pool();
    split_experts(buf, active, starts, per_slot, serial, &|e, b| f(e, b));
}

/// `g(e, region of e)` for every active expert, the regions of `buf` laid out in order
/// (`per_slot` items per slot of `starts`); in parallel unless `serial`.
fn split_experts<T: Send>(
    buf: &mut [T],
    active: &[usize],
    starts: &[usize],
    per_slot: usize,
    serial: bool,
    g: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    match active {
        [] => {}
        [e] => g(*e, &mut buf[..per_slot * (starts[*e + 1] - starts[*e])]),
        _ if serial => {
            let mut rest = buf;
            for &e in active {
                let n = starts[e + 1] - starts[e];
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(per_slot * n);
                rest = tail;
                g(e, mine);
            }
        }
        _ => {
            let mid = active.len() / 2;
            let cut = per_slot * (starts[active[mid]] - starts[active[0]]);
            let (l, r) = buf.split_at_mut(cut);
            rayon::join(
                || split_experts(l, &active[..mid], starts, per_slot, serial, g),
                || split_experts(r, &active[mid..], starts, per_slot, serial, g),
            );
        }
    }
}

/// Rows of expert weights per parallel task, at least.
const EXPERT_ROWS: usize = 64;

/// Row × token products per parallel task: an expert with few tokens (256 experts, top-8:
/// ~4 per expert in a 128-token batch) gets longer row blocks, so each task still
/// carries ~4 M multiply-adds instead of a pool hand-off per 64 rows × 4 tokens.
/// Measured (256-expert full-dims q4_k_m, pp128, Zen 4, 2 threads, with packing from 4
/// tokens): 748 → 787 tok/s best of 3 at 1024. Session 7 (`moe_bench`, calls interleaved,
/// two pairs, best of 10–16, 1024 → 2048): 256 experts, 128 tokens 17.3–18.2 → 16.2–16.4
/// ms, 64 tokens 12.7–13.8 → 12.1–12.7; 64 experts, 32 / 64 tokens 8.2–8.3 → 8.0 /
/// 6.7–6.8 → 6.4; 8 tokens unchanged (3.60–3.62).
const EXPERT_ROW_TOKENS: usize = 2048;

/// Active experts from which row blocks grow for experts with few tokens: below (decode:
/// the 8 experts of one token, where one task per expert projection would leave a thread
/// idle at the end), `EXPERT_ROWS` rows per task. Measured (`moe_bench`, 64 experts,
/// calls interleaved, best of 20, two pairs, Zen 4, 2 threads; from 64 → from 16):
/// 4 tokens (25 experts) 2.22–2.37 → 1.96–1.99 ms, 8 tokens (41) 4.08–4.34 → 3.40–3.45,
/// 16 tokens (50) 6.29–6.73 → 4.89–5.02; 256 experts, 8 tokens (58) 5.29–7.09 → 4.90–5.23;
/// 1 token (8 experts) unchanged by construction. With 64 the 64-expert file's verify
/// passes and K-slot steps (2–8 tokens per expert) ran 64-row tasks: a hand-off per ~0.2 M
/// multiply-adds.
const LONG_BLOCKS_FROM_EXPERTS: usize = 16;

/// Rows per task for an expert with `n` tokens among `active` active experts: a multiple
/// of 16 (the packed kernels' group), at least `EXPERT_ROWS`.
fn block_rows(n: usize, active: usize) -> usize {
    if active < tuned!(KNOB_MOE_LONG_FROM, LONG_BLOCKS_FROM_EXPERTS) {
        return EXPERT_ROWS;
    }
    (tuned!(KNOB_MOE_ROW_TOKENS, EXPERT_ROW_TOKENS) / n.max(1)).next_multiple_of(16).max(EXPERT_ROWS)
}

/// Splits `buf` (per active expert e: n_e token rows of `rows` floats at
/// `rows·starts[e]`) into column blocks of `block_rows(n_e)` weight rows and runs `f(e,
/// first_row, n_rows, dst)` on every block, all experts' blocks in one parallel loop (`k`
/// = the dot length, for the work estimate). `dst` points at the block's first column
/// in e's first token row: `f` may write columns `first_row..first_row + n_rows` of e's
/// n_e token rows (`rows` apart), no other.
fn expert_blocks<F>(buf: &mut [f32], active: &[usize], starts: &[usize], rows: usize, k: usize, f: F)
where
    F: Fn(usize, usize, usize, *mut f32) + Sync + Send,
{
    let total = rows * active.iter().map(|&e| starts[e + 1] - starts[e]).sum::<usize>() * k;
    let blocks: usize = active.iter().map(|&e| rows.div_ceil(block_rows(starts[e + 1] - starts[e], active.len()))).sum();
    let serial = total < par::SERIAL_WORK || blocks <= 1 || par::outside_pool();
    split_experts(buf, active, starts, rows, serial, &|e, mine| {
        let n = starts[e + 1] - starts[e];
        let br = block_rows(n, active.len());
        let sink = crate::transpose::ColumnSink::new(mine, n, rows);
        let run = |b: usize| f(e, b * br, br.min(rows - b * br), sink.column(b * br));
        if serial {
            (0..rows.div_ceil(br)).for_each(run);
        } else {
            (0..rows.div_ceil(br)).into_par_iter().for_each(run);
        }
    });
}
