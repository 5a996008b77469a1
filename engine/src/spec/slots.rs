//! Speculative decoding with decode slots: every slot's pending token and its own drafts
//! in ONE forward pass ([`Runner::forward_multi`]: weights stream once for all, each
//! stateful op runs once over every sequence), then each sequence accepts and rolls back
//! on its own. Rows are bitwise what each sequence gives alone, so greedy output is
//! still token for token plain decoding. Drafts come from prompt lookup (the MTP block
//! needs the hidden rows, which a multi-sequence pass does not give out yet).

use super::verify::{self, Pass};
use super::{accept, Lookup, SpecError, SpecStats};
use crate::runner::{Logits, Runner};
use crate::sampler::Sampler;
use crate::slots::{SlotError, SlotHandle, Slots};
use crate::state::SeqState;
use pn_ops::state::history::Recording;
use pn_ops::LayerState;

/// One slot's part of a round: its handle, every token it was fed, and the pending one.
pub struct SlotRound<'a> {
    pub handle: SlotHandle,
    pub history: &'a [u32],
    pub pending: u32,
    pub sampler: &'a mut Sampler,
    pub stats: &'a mut SpecStats,
}

impl From<SlotError> for SpecError {
    fn from(e: SlotError) -> SpecError {
        match e {
            SlotError::Run(r) => SpecError::Run(r),
            other => SpecError::Unsupported(other.to_string()),
        }
    }
}

/// One round for every entry: lookup drafts (up to `n_draft` each), one pass, accept,
/// roll back. Returns per entry (accepted drafts, the next pending token).
pub fn round(slots: &mut Slots, r: &Runner, lookup: &Lookup, n_draft: usize, items: &mut [SlotRound<'_>]) -> Result<Vec<(Vec<u32>, u32)>, SpecError> {
    verify::check_runner(r)?;
    let mut toks: Vec<Vec<u32>> = Vec::with_capacity(items.len());
    for it in items.iter() {
        let st = slots.state(it.handle)?;
        let room = st.max_seq.saturating_sub(st.pos + 1);
        let mut ctx = it.history.to_vec();
        ctx.push(it.pending);
        let mut t = vec![it.pending];
        t.extend(lookup.draft(&ctx, n_draft.min(room)));
        toks.push(t);
    }
    let batch: Vec<(SlotHandle, u32)> = items.iter().map(|it| (it.handle, it.pending)).collect();
    let (idx, mut states) = slots.take_batch(&batch)?;
    let res = pass(r, &mut states, &toks);
    let out = res.and_then(|(rows, passes)| {
        let mut out = Vec::with_capacity(items.len());
        for (i, it) in items.iter_mut().enumerate() {
            let drafts = &toks[i][1..];
            let (k, next) = accept::accept(it.sampler, &rows[i], drafts);
            passes[i].rollback(&mut states[i], k + 1)?;
            if !drafts.is_empty() {
                it.stats.record(drafts.len(), k);
            }
            out.push((drafts[..k].to_vec(), next));
        }
        Ok(out)
    });
    slots.put_back(&idx, states);
    out
}

/// The verify pass of several sequences: per sequence its rows and its [`Pass`].
fn pass(r: &Runner, states: &mut [SeqState], toks: &[Vec<u32>]) -> Result<(Vec<Logits>, Vec<Pass>), SpecError> {
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
    let all = r.forward_multi(&mut parts)?;
    let n_vocab = all.n_vocab;
    let mut rows = Vec::with_capacity(toks.len());
    let mut at = 0;
    for t in toks {
        rows.push(Logits { n_vocab, data: all.data[at * n_vocab..(at + t.len()) * n_vocab].to_vec() });
        at += t.len();
    }
    Ok((rows, passes))
}
