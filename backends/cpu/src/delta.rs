//! Gated-DeltaNet state ops: causal conv (parallel over tokens × channel blocks) and the
//! gated delta rule (parallel over V heads; per head the chunked form for prefill, the
//! vectorized recurrence for short batches — see `delta_chunk`).

use crate::par;
use pn_ops::reference::common::{act_f32, out_f32, recurrent_state, weight, weight_f32};
use pn_ops::state::history;
use pn_ops::{LayerState, OpError, RecurrentState, SeqSpan, Tensor, TensorMeta, Value};
use crate::delta_chunk::{self, HeadIn, Scratch};
use rayon::prelude::*;
use std::cell::RefCell;

pub fn conv1d_causal(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    d_conv: usize,
) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    conv1d_causal_into(ins, out, state, d_conv, &mut y)?;
    out_f32("Conv1dCausal", out, y)
}

thread_local! {
    /// The transposed conv taps, reused from call to call.
    static TAPS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `conv1d_causal` into `y` (every element written).
pub fn conv1d_causal_into(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    d_conv: usize,
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Conv1dCausal";
    let (x, wv, c, _) = conv_inputs(ins, out, y)?;
    let st = recurrent_state(OP, state)?;
    conv_seq(x, &wv, st, d_conv, c, y)
}

/// The conv's input `[C][T]`, taps, channels and tokens, checked against `y`.
fn conv_inputs<'a>(ins: &[Value<'a>], out: &TensorMeta, y: &[f32]) -> Result<(&'a [f32], pn_ops::WeightView<'a>, usize, usize), OpError> {
    const OP: &str = "Conv1dCausal";
    let x = act_f32(OP, &ins[0])?;
    let wv = weight(OP, &ins[1])?;
    let c = out.shape.0[0];
    let t = out.shape.rows();
    crate::norm::len_check(OP, t * c, y.len())?;
    if x.len() != t * c {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("x has {} elements, expected {c}×{t}", x.len()),
        });
    }
    Ok((x, wv, c, t))
}

/// The conv of every sequence of a pass (`HostKernels::kernel_seqs`): sequence `i` owns
/// tokens `spans[i]` and the window of `states[i]`; each is [`conv1d_causal_into`] on
/// its tokens (no copies), so every row is bitwise the sequence alone.
pub fn conv1d_causal_seqs(
    ins: &[Value<'_>],
    out: &TensorMeta,
    spans: &[SeqSpan],
    states: &mut [&mut LayerState],
    d_conv: usize,
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Conv1dCausal";
    let (x, wv, c, t) = conv_inputs(ins, out, y)?;
    pn_ops::state::check_spans(OP, spans, states.len(), t)?;
    let mut sts = Vec::with_capacity(spans.len());
    for st in states.iter_mut() {
        sts.push(recurrent_state(OP, Some(&mut **st))?);
    }
    // sequences in parallel when there is enough work (each one's loops stay serial
    // inside; a long one splits its own rows as alone)
    let mut parts: Vec<(SeqSpan, &mut RecurrentState, &mut [f32])> = Vec::with_capacity(spans.len());
    let mut rest = y;
    for (&sp, st) in spans.iter().zip(sts) {
        let (head, tail) = rest.split_at_mut(sp.len * c);
        parts.push((sp, st, head));
        rest = tail;
    }
    let run = |(sp, st, ys): &mut (SeqSpan, &mut RecurrentState, &mut [f32])| conv_seq(&x[sp.start * c..(sp.start + sp.len) * c], &wv, st, d_conv, c, ys);
    if t * c * d_conv < par::SERIAL_WORK || par::outside_pool() || parts.iter().any(|p| p.0.len > DIRECT_CONV_TOKENS) {
        parts.iter_mut().try_for_each(run)
    } else {
        parts.par_iter_mut().with_max_len(1).try_for_each(|p| par::inline(|| run(p)))
    }
}

/// One sequence's conv: `x` `[C][T]` after the window `st.conv`, into `y`; the window
/// moves on by T.
fn conv_seq(x: &[f32], wv: &pn_ops::WeightView<'_>, st: &mut RecurrentState, d_conv: usize, c: usize, y: &mut [f32]) -> Result<(), OpError> {
    let t = x.len() / c;
    let ns = d_conv - 1;
    let wv = *wv;
    let conv = &st.conv;
    // Window row r: state row r for r < ns, else token r - ns.
    let win = |r: usize| -> &[f32] {
        if r < ns {
            &conv[r * c..(r + 1) * c]
        } else {
            &x[(r - ns) * c..(r - ns + 1) * c]
        }
    };
    // per-token history for a rollback (pn_ops::state::history), before the window moves
    if let Some(mut h) = history::take(st) {
        history::write_conv(&mut h, t, ns, c, &win);
        history::put(st, h);
    }
    let f32_taps = wv.ty == pn_ops::GgmlType::F32 && wv.bytes.len() >= 4 * c * d_conv;
    if t == 1 && d_conv == 4 && f32_taps {
        conv_token4(x, &wv.bytes[..16 * c], &mut st.conv, c, y);
        return Ok(());
    }
    if t <= DIRECT_CONV_TOKENS && f32_taps {
        // Decode: each channel's taps read in place, in order i = 0.. from 0.0 (as below
        // and the reference); transposing the taps would cost more than the conv.
        let taps = &wv.bytes[..4 * c * d_conv];
        for (ti, yr) in y.chunks_exact_mut(c).enumerate() {
            if d_conv == 4 {
                sum_taps4(yr, taps, [win(ti), win(ti + 1), win(ti + 2), win(ti + 3)]);
                continue;
            }
            for (ch, (v, t)) in yr.iter_mut().zip(taps.chunks_exact(4 * d_conv)).enumerate() {
                let mut acc = 0.0f32;
                for (i, b) in t.chunks_exact(4).enumerate() {
                    acc += win(ti + i)[ch] * f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                *v = acc;
            }
        }
    } else {
        conv_transposed(&wv, d_conv, c, &win, y)?;
    }
    // New state: the last ns window rows (row j ← window row t + j: a later state row,
    // not overwritten yet, or a token).
    for j in 0..ns {
        let r = t + j;
        if r < ns {
            st.conv.copy_within(r * c..(r + 1) * c, j * c);
        } else {
            st.conv[j * c..(j + 1) * c].copy_from_slice(&x[(r - ns) * c..(r - ns + 1) * c]);
        }
    }
    Ok(())
}

/// One decode token's conv of the usual width (4 taps, F32 `[C][4]` in place): each
/// block of channels summed (taps in order from 0.0, as everywhere) and its window moved
/// on (state rows 0, 1, 2 ← rows 1, 2 and the token) in one task, while its columns are
/// in cache; blocks in parallel. At 8192 channels the token reads ~230 KB of taps and
/// window from memory and writes 96 KB of state.
fn conv_token4(x: &[f32], taps: &[u8], conv: &mut [f32], c: usize, y: &mut [f32]) {
    let (r0, rest) = conv[..3 * c].split_at_mut(c);
    let (r1, r2) = rest.split_at_mut(c);
    type Block<'a> = (((((&'a mut [f32], &'a mut [f32]), &'a mut [f32]), &'a mut [f32]), &'a [f32]), &'a [u8]);
    let run = |(((((ys, a0), a1), a2), xs), ts): Block<'_>| {
        sum_taps4(ys, ts, [a0, a1, a2, xs]);
        a0.copy_from_slice(a1);
        a1.copy_from_slice(a2);
        a2.copy_from_slice(xs);
    };
    let y = &mut y[..c];
    if c <= CONV_BLOCK || par::outside_pool() {
        return run((((((y, r0), r1), r2), &x[..c]), taps));
    }
    y.par_chunks_mut(CONV_BLOCK)
        .zip(r0.par_chunks_mut(CONV_BLOCK))
        .zip(r1.par_chunks_mut(CONV_BLOCK))
        .zip(r2.par_chunks_mut(CONV_BLOCK))
        .zip(x[..c].par_chunks(CONV_BLOCK))
        .zip(taps.par_chunks(16 * CONV_BLOCK))
        .for_each(run);
}

/// `ys[i]` = channel i's 4 taps (`ts`: its F32 `[C][4]` bytes, read in place) against
/// window rows `w` at i, summed in order from 0.0 as everywhere (LLVM vectorizes the
/// interleaved tap loads).
#[inline(always)]
fn sum_taps4(ys: &mut [f32], ts: &[u8], w: [&[f32]; 4]) {
    let win = w[0].iter().zip(w[1]).zip(w[2]).zip(w[3]);
    for ((v, t), (((&a, &b), &cc), &d)) in ys.iter_mut().zip(ts.chunks_exact(16)).zip(win) {
        let tap = |i: usize| f32::from_le_bytes([t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]]);
        let mut acc = 0.0f32;
        acc += a * tap(0);
        acc += b * tap(1);
        acc += cc * tap(2);
        acc += d * tap(3);
        *v = acc;
    }
}

/// Tokens up to which the conv reads its taps in place instead of transposing them.
const DIRECT_CONV_TOKENS: usize = 2;

/// Channels a parallel task of a decode token's conv takes.
const CONV_BLOCK: usize = 1024;

/// The conv of `t` tokens with the taps transposed to `[d_conv][c]`, so the loops run
/// along channels (vectorized); each output still sums its taps in order i = 0.. from
/// 0.0, as the reference.
fn conv_transposed<'w>(
    wv: &pn_ops::WeightView<'_>,
    d_conv: usize,
    c: usize,
    win: &(dyn Fn(usize) -> &'w [f32] + Sync),
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Conv1dCausal";
    let mut wt = TAPS.with(|w| std::mem::take(&mut *w.borrow_mut()));
    wt.clear();
    wt.resize(d_conv * c, 0.0);
    if wv.ty == pn_ops::GgmlType::F32 && wv.bytes.len() >= 4 * c * d_conv {
        // F32 taps read in place (no dequantized copy)
        for ch in 0..c {
            for i in 0..d_conv {
                let b = &wv.bytes[4 * (ch * d_conv + i)..4 * (ch * d_conv + i) + 4];
                wt[i * c + ch] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    } else {
        let w = weight_f32(OP, wv)?;
        for ch in 0..c {
            for i in 0..d_conv {
                wt[i * c + ch] = w[ch * d_conv + i];
            }
        }
    }
    // each token row zeroed where it is summed (no serial pass over the whole output)
    par::rows(y, c, 2 * c * d_conv, |ti, yr| {
        if d_conv == 4 {
            // the usual width in one pass over the row (the same sums, in the same order)
            let (x0, x1, x2, x3) = (win(ti), win(ti + 1), win(ti + 2), win(ti + 3));
            let (w0, w1, w2, w3) = (&wt[..c], &wt[c..2 * c], &wt[2 * c..3 * c], &wt[3 * c..4 * c]);
            let xs = x0.iter().zip(x1).zip(x2).zip(x3);
            let ws = w0.iter().zip(w1).zip(w2).zip(w3);
            for (v, ((((&a, &b), &cc), &d), (((&p, &q), &r), &s))) in yr.iter_mut().zip(xs.zip(ws)) {
                let mut acc = 0.0f32;
                acc += a * p;
                acc += b * q;
                acc += cc * r;
                acc += d * s;
                *v = acc;
            }
            return;
        }
        yr.fill(0.0);
        for i in 0..d_conv {
            let (xr, wr) = (win(ti + i), &wt[i * c..(i + 1) * c]);
            for ((v, &xv), &tap) in yr.iter_mut().zip(xr).zip(wr) {
                *v += xv * tap;
            }
        }
    });
    TAPS.with(|w| *w.borrow_mut() = wt);
    Ok(())
}

/// Geometry and inputs of one delta-rule call.
#[derive(Clone, Copy)]
struct Delta<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    dk: usize,
    hk: usize,
    dv: usize,
    hv: usize,
    t: usize,
}

fn delta_inputs<'a>(ins: &[Value<'a>], out: &TensorMeta) -> Result<Delta<'a>, OpError> {
    const OP: &str = "DeltaRule";
    let [dk, hk, _, _] = ins[0].act().shape.0;
    let [dv, hv, t, _] = out.shape.0;
    Ok(Delta {
        q: act_f32(OP, &ins[0])?,
        k: act_f32(OP, &ins[1])?,
        v: act_f32(OP, &ins[2])?,
        g: act_f32(OP, &ins[3])?,
        beta: act_f32(OP, &ins[4])?,
        dk,
        hk,
        dv,
        hv,
        t,
    })
}

impl<'a> Delta<'a> {
    /// The tokens `r` of the pass (one sequence's).
    fn tokens(&self, r: std::ops::Range<usize>) -> Delta<'a> {
        let (qk, vs) = (self.hk * self.dk, self.hv * self.dv);
        Delta {
            q: &self.q[r.start * qk..r.end * qk],
            k: &self.k[r.start * qk..r.end * qk],
            v: &self.v[r.start * vs..r.end * vs],
            g: &self.g[r.start * self.hv..r.end * self.hv],
            beta: &self.beta[r.start * self.hv..r.end * self.hv],
            t: r.len(),
            ..*self
        }
    }
    /// The layer state (its shape checked once, [`pn_ops::StateShape::check`]).
    fn state<'s>(&self, state: Option<&'s mut LayerState>) -> Result<&'s mut RecurrentState, OpError> {
        recurrent_state("DeltaRule", state)
    }
}

/// Tokens from which the chunked form is used (below: the vectorized recurrence). Off by
/// default: the chunked form rounds differently from the recurrence, so a prompt fed in
/// one batch and token by token would differ by ~1e-6 before the quantized matmuls,
/// which their activation rounding amplifies to ~1e-2 in the logits (tests/state.rs and
/// tests/chat.rs ask for 1e-3 on q4_k_m models); and on this machine it is no faster than
/// the vectorized recurrence (docs/perf.md). `PN_DELTA_CHUNKED_FROM=N` turns it on.
pub const CHUNKED_FROM_T: usize = usize::MAX;

/// `CHUNKED_FROM_T`, or `PN_DELTA_CHUNKED_FROM` when set (experiments; read once).
fn chunked_from() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("PN_DELTA_CHUNKED_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CHUNKED_FROM_T)
    })
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Where one head writes its per-token history: its rows of each kept state (entry `e`:
/// the state after token `first + e`) and the first token kept.
type HeadHist<'h> = Option<(Vec<&'h mut [f32]>, usize)>;

/// One (sequence, V head) task: inputs, head, state, output, history block.
type HeadTask<'p, 'h> = (&'p Delta<'p>, usize, &'h mut [f32], &'h mut [f32], HeadHist<'h>);

/// One V head over all tokens: `s` is the head's state [Dv][Dk], `o` its output [T][Dv];
/// with `hist`, the states after the kept tokens are copied out on the way (the tokens
/// run one call each from `first`, bitwise the same recurrence).
fn delta_head(p: &Delta<'_>, h: usize, s: &mut [f32], o: &mut [f32], hist: HeadHist<'_>) {
    let kh = h % p.hk;
    let hi = HeadIn {
        q: &p.q[kh * p.dk..],
        k: &p.k[kh * p.dk..],
        v: &p.v[h * p.dv..],
        g: &p.g[h..],
        beta: &p.beta[h..],
        qk_stride: p.hk * p.dk,
        v_stride: p.hv * p.dv,
        gb_stride: p.hv,
        dk: p.dk,
        dv: p.dv,
        t: p.t,
    };
    let Some((mut entries, first)) = hist else { return delta_all(&hi, s, o) };
    if first > 0 {
        delta_all(&hi.tokens(0, first), s, &mut o[..first * p.dv]);
    }
    for ti in first..p.t {
        delta_chunk::recurrent(&hi.tokens(ti, ti + 1), s, &mut o[ti * p.dv..(ti + 1) * p.dv]);
        if let Some(dst) = entries.get_mut(ti - first) {
            dst.copy_from_slice(s);
        }
    }
}

/// One head's tokens in the form their count chooses.
fn delta_all(hi: &HeadIn<'_>, s: &mut [f32], o: &mut [f32]) {
    if hi.t >= chunked_from() {
        SCRATCH.with(|sc| delta_chunk::chunked(hi, s, o, &mut sc.borrow_mut()))
    } else {
        delta_chunk::recurrent(hi, s, o)
    }
}

pub fn delta_rule(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    delta_rule_into(ins, out, state, &mut y)?;
    out_f32("DeltaRule", out, y)
}

thread_local! {
    /// Per-head outputs before the transpose, reused from call to call.
    static HEADS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `delta_rule` into `y` (every element written).
pub fn delta_rule_into(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    y: &mut [f32],
) -> Result<(), OpError> {
    let p = delta_inputs(ins, out)?;
    let st = p.state(state)?;
    delta_rule_seqs_of(&mut [(p, st)], p.hv * p.dv * p.t, y)
}

/// The delta rule of every sequence of a pass (`HostKernels::kernel_seqs`): sequence `i`
/// owns tokens `spans[i]` and the ssm state of `states[i]`; ONE loop over all
/// (sequence, V head) pairs, each computing what it computes alone (the form chosen by
/// that sequence's token count), so every row is bitwise the sequence alone.
pub fn delta_rule_seqs(
    ins: &[Value<'_>],
    out: &TensorMeta,
    spans: &[SeqSpan],
    states: &mut [&mut LayerState],
    y: &mut [f32],
) -> Result<(), OpError> {
    let p = delta_inputs(ins, out)?;
    pn_ops::state::check_spans("DeltaRule", spans, states.len(), p.t)?;
    let mut seqs = Vec::with_capacity(spans.len());
    for (sp, st) in spans.iter().zip(states.iter_mut()) {
        let sub = p.tokens(sp.range());
        seqs.push((sub, p.state(Some(&mut **st))?));
    }
    delta_rule_seqs_of(&mut seqs, p.hv * p.dv * p.t, y)
}

/// Each head's rows of the kept states of a recorded sequence of `t` tokens (state `per`
/// floats per head) and its first kept token; marks the history as written for `t`
/// tokens. None when not recorded or nothing is kept.
fn head_blocks(hist: Option<&mut history::Hist>, t: usize, per: usize) -> Option<(std::vec::IntoIter<Vec<&mut [f32]>>, usize)> {
    let h = hist?;
    h.wrote_ssm(t);
    let (first, n) = h.span(t);
    (n > 0).then(|| (history::head_entries(&mut h.ssm[..n], per).into_iter(), first))
}

/// One sequence's heads (in parallel unless `serial`), with its history when recorded.
fn heads_of(p: &Delta<'_>, ssm: &mut [f32], ohs: &mut [f32], hist: Option<&mut history::Hist>, serial: bool) {
    let per = p.dk * p.dv;
    match head_blocks(hist, p.t, per) {
        None if serial => ssm.chunks_mut(per).zip(ohs.chunks_mut(p.t * p.dv)).enumerate().for_each(|(h, (s, o))| delta_head(p, h, s, o, None)),
        None => ssm.par_chunks_mut(per).zip(ohs.par_chunks_mut(p.t * p.dv)).enumerate().for_each(|(h, (s, o))| delta_head(p, h, s, o, None)),
        Some((blocks, first)) if serial => {
            ssm.chunks_mut(per).zip(ohs.chunks_mut(p.t * p.dv)).zip(blocks).enumerate().for_each(|(h, ((s, o), b))| delta_head(p, h, s, o, Some((b, first))))
        }
        Some((blocks, first)) => {
            let bl: Vec<Vec<&mut [f32]>> = blocks.collect();
            ssm.par_chunks_mut(per).zip(ohs.par_chunks_mut(p.t * p.dv)).zip(bl).enumerate().for_each(|(h, ((s, o), b))| delta_head(p, h, s, o, Some((b, first))))
        }
    }
}

/// The sequences' delta rules into `y` (`[T][Hv][Dv]`, sequence after sequence).
fn delta_rule_seqs_of(seqs: &mut [(Delta<'_>, &mut RecurrentState)], n: usize, y: &mut [f32]) -> Result<(), OpError> {
    crate::norm::len_check("DeltaRule", n, y.len())?;
    let Some(p0) = seqs.first().map(|(p, _)| *p) else { return Ok(()) };
    let (dk, dv, hv) = (p0.dk, p0.dv, p0.hv);
    if dk * dv == 0 || n == 0 {
        y.fill(0.0);
        return Ok(());
    }
    // Per-head outputs [Hv][t][Dv] per sequence, then transposed to [t][Hv][Dv] (all
    // sequences of one token: the same layout, written in place).
    let direct = seqs.iter().all(|(p, _)| p.t == 1);
    let mut oh = if direct {
        Vec::new()
    } else {
        let mut v = HEADS.with(|h| std::mem::take(&mut *h.borrow_mut()));
        v.clear();
        v.resize(n, 0.0);
        v
    };
    {
        let ohs: &mut [f32] = if direct { &mut *y } else { &mut oh };
        let serial = n * dk < par::SERIAL_WORK || par::outside_pool();
        if let [(p, st)] = seqs {
            // one sequence: its heads, no task list (nothing allocated per decode step)
            let mut hist = history::take(st);
            heads_of(p, &mut st.ssm, ohs, hist.as_mut(), serial);
            if let Some(h) = hist {
                history::put(st, h);
            }
        } else {
            // (sequence, V head) tasks: the head's state [Dv][Dk], output [t][Dv] and
            // history block (when the sequence is recorded)
            let mut hists: Vec<Option<history::Hist>> = seqs.iter().map(|(_, st)| history::take(st)).collect();
            let mut tasks: Vec<HeadTask<'_, '_>> = Vec::with_capacity(seqs.len() * hv);
            let mut rest = ohs;
            for ((p, st), hist) in seqs.iter_mut().zip(hists.iter_mut()) {
                let (mine, tail) = rest.split_at_mut(hv * p.t * dv);
                rest = tail;
                let t = p.t;
                let p: &Delta<'_> = p;
                let mut blocks = head_blocks(hist.as_mut(), t, dk * dv);
                for (h, (s, o)) in st.ssm.chunks_mut(dk * dv).zip(mine.chunks_mut(t * dv)).enumerate() {
                    tasks.push((p, h, s, o, blocks.as_mut().and_then(|(it, first)| it.next().map(|b| (b, *first)))));
                }
            }
            if serial {
                tasks.into_iter().for_each(|(p, h, s, o, hh)| delta_head(p, h, s, o, hh));
            } else {
                tasks.into_par_iter().for_each(|(p, h, s, o, hh)| delta_head(p, h, s, o, hh));
            }
            for ((_, st), h) in seqs.iter().zip(hists) {
                if let Some(h) = h {
                    history::put(st, h);
                }
            }
        }
    }
    if direct {
        return Ok(());
    }
    let mut at = 0;
    for (p, _) in seqs.iter() {
        let (t, base) = (p.t, at);
        let ys = &mut y[at..at + t * hv * dv];
        at += t * hv * dv;
        let oh = &oh[base..base + t * hv * dv];
        par::rows(ys, hv * dv, hv * dv, |ti, yr| {
            for h in 0..hv {
                yr[h * dv..(h + 1) * dv].copy_from_slice(&oh[(h * t + ti) * dv..(h * t + ti + 1) * dv]);
            }
        });
    }
    HEADS.with(|h| *h.borrow_mut() = oh);
    Ok(())
}
