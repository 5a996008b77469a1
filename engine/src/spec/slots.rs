//! Speculative decoding with decode slots: every slot's pending token and its own drafts
//! in ONE forward pass ([`Runner::forward_multi`]: weights stream once for all, each
//! stateful op runs once over every sequence), then each sequence accepts and rolls back
//! on its own. Rows are bitwise what each sequence gives alone, so greedy output is
//! still token for token plain decoding. Each slot has its own drafter: prompt lookup,
//! or the MTP block with its own KV cache (then the pass also gives out every row's
//! hidden state, `result_norm`, which each sequence's drafter keeps for its accepted
//! tokens).

use super::verify::{self, Pass};
use super::{accept, mtp, Drafter, SpecError, SpecStats};
use crate::runner::{Logits, Runner};
use crate::sampler::Sampler;
use crate::slots::{SlotError, SlotHandle, Slots};
use crate::state::SeqState;
use pn_ops::state::history::Recording;
use pn_ops::LayerState;

/// One slot's drafting: its handle, every token it was fed, the pending one, and its
/// drafter (an MTP drafter must have seen the hidden rows of every fed token:
/// [`Drafter::prefill`] for the prompt, then the rounds).
pub struct SlotDraft<'a> {
    pub handle: SlotHandle,
    pub history: &'a [u32],
    pub pending: u32,
    /// The most drafts it takes this round.
    pub n: usize,
    pub drafter: &'a mut Drafter,
}

/// One slot's part of a [`round`]: its drafting, its sampler and counters.
pub struct SlotRound<'a> {
    pub handle: SlotHandle,
    pub history: &'a [u32],
    pub pending: u32,
    pub sampler: &'a mut Sampler,
    pub stats: &'a mut SpecStats,
    pub drafter: &'a mut Drafter,
}

impl From<SlotError> for SpecError {
    fn from(e: SlotError) -> SpecError {
        match e {
            SlotError::Run(r) => SpecError::Run(r),
            other => SpecError::Unsupported(other.to_string()),
        }
    }
}

/// The drafts of every entry (up to its `n`, fewer near the end of its context): per
/// entry, its pending token then its drafts. MTP drafters run their block passes
/// together ([`mtp::draft_many`]).
pub fn draft_all(slots: &Slots, items: &mut [SlotDraft<'_>]) -> Result<Vec<Vec<u32>>, SpecError> {
    let mut ctxs = Vec::with_capacity(items.len());
    let mut toks = Vec::with_capacity(items.len());
    for it in items.iter_mut() {
        let st = slots.state(it.handle)?;
        it.n = it.n.min(st.max_seq.saturating_sub(st.pos + 1));
        let mut ctx = Vec::with_capacity(it.history.len() + 1);
        ctx.extend_from_slice(it.history);
        ctx.push(it.pending);
        ctxs.push(ctx);
        toks.push(vec![it.pending]);
    }
    let mut jobs = Vec::new();
    for ((it, ctx), t) in items.iter_mut().zip(&ctxs).zip(toks.iter_mut()) {
        match &mut *it.drafter {
            Drafter::Mtp(m) => jobs.push((t, mtp::DraftJob { drafter: m, tokens: ctx, n: it.n })),
            d => t.extend(d.draft(ctx, it.n)?),
        }
    }
    let (outs, mut jobs): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    for (t, d) in outs.into_iter().zip(mtp::draft_many(&mut jobs)?) {
        t.extend(d);
    }
    Ok(toks)
}

/// One round for every entry: drafts (up to `n_draft` each), one pass, accept, roll
/// back. Returns per entry (accepted drafts, the next pending token). Runs inside one
/// [`crate::backend::Backend::enter`] of die A's backend, like [`super::Speculator::round`],
/// unless the runner's lanes take the pass.
pub fn round(slots: &mut Slots, r: &Runner, n_draft: usize, items: &mut [SlotRound<'_>]) -> Result<Vec<(Vec<u32>, u32)>, SpecError> {
    if r.lanes() > 1 && items.len() > 1 {
        // the lanes run a pass of several slots on their own threads: inside die A's
        // pool its other thread would spin beside them (the built-in model, 6 slots, plain
        // rounds: 4401 tok/s of steps inside, 5371 with lanes off)
        return round_here(slots, r, n_draft, items);
    }
    super::entered(r, || round_here(slots, r, n_draft, items))
}

fn round_here(slots: &mut Slots, r: &Runner, n_draft: usize, items: &mut [SlotRound<'_>]) -> Result<Vec<(Vec<u32>, u32)>, SpecError> {
    let (toks, rows) = {
        let mut ds: Vec<SlotDraft<'_>> = items.iter_mut().map(|it| SlotDraft { handle: it.handle, history: it.history, pending: it.pending, n: n_draft, drafter: &mut *it.drafter }).collect();
        let toks = draft_all(slots, &mut ds)?;
        if toks.iter().all(|t| t.len() == 1) && !ds.iter().any(|d| d.drafter.wants_hidden()) {
            // no drafts, and no drafter reads hidden rows: a plain decode step (nothing
            // recorded to roll back, no rows copied out per sequence)
            drop(ds);
            let batch: Vec<(SlotHandle, u32)> = items.iter().map(|it| (it.handle, it.pending)).collect();
            verify::check_runner(r)?;
            let logits = slots.step(r, &batch)?;
            return Ok(items.iter_mut().enumerate().map(|(i, it)| (Vec::new(), it.sampler.sample(logits.row(i)))).collect());
        }
        let rows = verify_all(slots, r, &ds, &toks)?;
        (toks, rows)
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, it) in items.iter_mut().enumerate() {
        let drafts = &toks[i][1..];
        let (k, next) = accept::accept(it.sampler, &rows.logits[i], drafts);
        rows.keep(slots, i, k + 1, it.drafter)?;
        if !drafts.is_empty() {
            it.stats.record(drafts.len(), k);
        }
        out.push((drafts[..k].to_vec(), next));
    }
    Ok(out)
}

/// A verify pass of several slots: each one's logits rows, its [`Pass`] (for the
/// rollback) and, when some drafter is MTP, its hidden rows.
pub struct Verified {
    pub logits: Vec<Logits>,
    passes: Vec<(SlotHandle, Pass)>,
    hidden: Vec<Vec<f32>>,
}

impl Verified {
    /// The hidden rows of the first `n_keep` tokens of entry `i`'s pass (empty when no
    /// drafter asked for them).
    pub fn hidden(&self, i: usize, n_keep: usize) -> &[f32] {
        let rows = &self.hidden[i];
        let e = rows.len() / self.passes[i].1.t.max(1);
        &rows[..n_keep.min(self.passes[i].1.t) * e]
    }

    /// Keep the first `n_keep` tokens of entry `i`'s pass (its pending token and the
    /// accepted drafts); its MTP drafter gets their hidden rows.
    pub fn keep(&self, slots: &mut Slots, i: usize, n_keep: usize, drafter: &mut Drafter) -> Result<(), SpecError> {
        let (h, pass) = &self.passes[i];
        pass.rollback(slots.state_mut(*h)?, n_keep)?;
        if let Drafter::Mtp(m) = drafter {
            m.observe_hidden(self.hidden(i, n_keep));
        }
        Ok(())
    }
}

/// The verify pass of every entry: `toks[i]` (its pending token and drafts) fed to its
/// slot in one pass with all logits, recording the recurrent histories.
pub fn verify_all(slots: &mut Slots, r: &Runner, items: &[SlotDraft<'_>], toks: &[Vec<u32>]) -> Result<Verified, SpecError> {
    verify::check_runner(r)?;
    let want_h = items.iter().any(|it| matches!(it.drafter, Drafter::Mtp(_)));
    let batch: Vec<(SlotHandle, u32)> = items.iter().map(|it| (it.handle, it.pending)).collect();
    let (idx, mut states) = slots.take_batch(&batch)?;
    let res = pass(r, &mut states, toks, want_h);
    slots.put_back(&idx, states);
    let (logits, passes, hidden) = res?;
    let passes = items.iter().map(|it| it.handle).zip(passes).collect();
    Ok(Verified { logits, passes, hidden })
}

type PassOut = (Vec<Logits>, Vec<Pass>, Vec<Vec<f32>>);

/// The verify pass of several sequences: per sequence its rows, its [`Pass`] and (with
/// `want_h`) its hidden rows.
fn pass(r: &Runner, states: &mut [SeqState], toks: &[Vec<u32>], want_h: bool) -> Result<PassOut, SpecError> {
    let mut passes = Vec::with_capacity(states.len());
    for (st, t) in states.iter_mut().zip(toks) {
        if st.is_resident() || st.overflow == pn_ops::Overflow::Ring {
            return Err(SpecError::Unsupported("a slot's state is on a device or in ring mode: speculative decoding needs host states without ring overflow".into()));
        }
        let rec = Recording::start(
            st.layers()?.iter().filter_map(|l| match l {
                LayerState::Recurrent(s) => Some(s),
                _ => None,
            }),
            t.len(),
        );
        passes.push(Pass::new(rec, st.pos, t.len()));
    }
    let mut parts: Vec<(&mut SeqState, &[u32])> = states.iter_mut().zip(toks).map(|(s, t)| (s, &t[..])).collect();
    let mut hidden_all = Vec::new();
    let all = if want_h { verify::forward_multi_hidden(r, &mut parts, &mut hidden_all)? } else { r.forward_multi(&mut parts)? };
    let n_vocab = all.n_vocab;
    let e = if want_h { hidden_all.len() / toks.iter().map(Vec::len).sum::<usize>().max(1) } else { 0 };
    let (mut rows, mut hidden) = (Vec::with_capacity(toks.len()), Vec::with_capacity(toks.len()));
    let mut at = 0;
    for t in toks {
        rows.push(Logits { n_vocab, data: all.data[at * n_vocab..(at + t.len()) * n_vocab].to_vec() });
        hidden.push(if want_h { hidden_all[at * e..(at + t.len()) * e].to_vec() } else { Vec::new() });
        at += t.len();
    }
    Ok((rows, passes, hidden))
}
