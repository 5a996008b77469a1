//! Speculative decoding in the engine's step (`pn serve --draft mtp|lookup --draft-n N`,
//! docs/server.md): every live sequence's pending token and its own drafts (its drafter:
//! prompt lookup over its tokens, or its own MTP block state) in ONE verify pass
//! (pn_engine::spec::slots), each sequence then accepting by its own sampler (the
//! generation's rejection rule, [`crate::generation::Generation::speculate`]) and rolling
//! its state back to what it kept. Then one prefill pass of the oldest prompt alone
//! (prompts are not mixed into verify passes), as long as the step budget allows beside
//! the streams. Greedy output is plain decoding's.

use super::{Engine, Event, Live};
use crate::error::ApiError;
use crate::generation::Step;
use pn_engine::spec::slots::{draft_all, verify_all, SlotDraft};
use pn_engine::spec::Drafter;
use std::sync::atomic::Ordering;

impl Engine {
    /// One iteration with drafts: the verify round of the live sequences (its time their
    /// plain step in the step budget), then one prefill pass within the budget.
    pub(super) fn iterate_drafting(&mut self) {
        let stepping = self.take_live();
        if !stepping.is_empty() {
            let (k, t0) = (stepping.len(), std::time::Instant::now());
            self.verify_round(stepping);
            self.costs.observe(k, 0, t0.elapsed().as_secs_f64());
        }
        self.prefill_budgeted(self.live.len());
    }

    fn verify_round(&mut self, mut stepping: Vec<Live>) {
        // --draft-policy adaptive: this round drafts where that measures faster for k
        // streams (the text is the same either way: accept.rs's coupled rule)
        let k_streams = stepping.len();
        let drafting = self.adapt.as_mut().is_none_or(|a| a.draft(k_streams));
        let n_cfg = self.draft.as_ref().map_or(0, |d| d.n);
        let n_max = if drafting { n_cfg } else { 0 };
        // a request with a predicted output drafts in every round: its client asked for
        // it, and its drafts are mostly accepted (such rounds do not count as plain ones
        // in the adaptive policy's measurements)
        let lookup = self.draft.as_ref().is_some_and(|d| d.factory.kind() == pn_engine::spec::DraftKind::Lookup);
        let has_prediction = |l: &Live| lookup && l.seq.job.prediction.is_some();
        let predicted = !drafting && stepping.iter().any(|l| has_prediction(l) && l.finishing.is_none());
        let t0 = std::time::Instant::now();
        let caught = |st: &[Live]| pn_engine::spec::adapt::caught_up(st.iter().filter_map(|l| l.seq.drafter.as_ref()));
        let before = caught(&stepping);
        let res = {
            let mut ds: Vec<SlotDraft<'_>> = stepping
                .iter_mut()
                .map(|l| {
                    // a finishing sequence only feeds its last token; drafts past the
                    // generation's limit would never be taken
                    let left = l.seq.gen.limit().saturating_sub(l.seq.gen.generated.len() + 1);
                    let n = match (&l.finishing, has_prediction(l)) {
                        (Some(_), _) => 0,
                        (None, true) => n_cfg.min(left),
                        (None, false) => n_max.min(left),
                    };
                    SlotDraft { handle: l.h, history: &l.seq.fed, pending: l.next, n, drafter: l.seq.drafter.as_mut().expect("a drafter per sequence with --draft") }
                })
                .collect();
            draft_all(&self.slots, &mut ds).and_then(|toks| verify_all(&mut self.slots, &self.runner, &ds, &toks).map(|v| (toks, v)))
        };
        let (toks, rows) = match res {
            Ok(r) => r,
            Err(e) => return self.fail(stepping, &format!("decode step: {e}")),
        };
        let after = caught(&stepping);
        self.shared.metrics.record_step(stepping.len());
        self.shared.metrics.record_draft_round(drafting || predicted);
        let mut emitted = 0;
        let budget = self.cache.config().budget_bytes;
        for (i, mut l) in stepping.into_iter().enumerate() {
            let drafts = &toks[i][1..];
            let logits = &rows.logits[i];
            if let Some(f) = l.finishing {
                // (a failed rollback only leaves the answer out of the prefix cache)
                if rows.keep(&mut self.slots, i, 1, l.seq.drafter.as_mut().expect("drafter")).is_ok() {
                    l.seq.fed.push(l.next);
                    keep_hidden(&mut l.seq.hidden, rows.hidden(i, 1), budget);
                }
                self.finish(l, f);
                continue;
            }
            if l.seq.job.events.is_closed() {
                self.shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                self.release(l.h);
                continue;
            }
            if let Some(bad) = logits.data.iter().position(|x| !x.is_finite()) {
                let msg = format!("the model produced a non-finite logit (token {}: {}); the weights may contain NaN/Inf", bad % logits.n_vocab.max(1), logits.data[bad]);
                let _ = l.seq.job.events.send(Event::Error(ApiError::internal(msg)));
                self.release(l.h);
                continue;
            }
            self.shared.metrics.observe_inter_token(l.seq.last_token.elapsed());
            let before = l.seq.gen.generated.len();
            let (mut steps, k) = l.seq.gen.speculate(&self.tok, logits, drafts);
            l.seq.last_token = std::time::Instant::now();
            emitted += l.seq.gen.generated.len() - before;
            self.shared.metrics.record_generated((l.seq.gen.generated.len() - before) as u64);
            self.shared.metrics.record_drafts(drafts.len(), k);
            l.seq.drafts = (l.seq.drafts.0 + drafts.len(), l.seq.drafts.1 + k);
            for s in &mut steps {
                if !s.delta.is_empty() {
                    let _ = l.seq.job.events.send(Event::Delta(std::mem::take(&mut s.delta)));
                }
            }
            // the state keeps the pending token and the accepted drafts, except a last
            // accepted draft that ended the answer without belonging to it (a stop string)
            let last: Step = steps.pop().expect("at least one step");
            let ends_in_draft = steps.len() < k;
            let n_keep = if ends_in_draft && !last.feed { k } else { k + 1 };
            let drafter = l.seq.drafter.as_mut().expect("drafter");
            if let Err(e) = rows.keep(&mut self.slots, i, n_keep, drafter) {
                let _ = l.seq.job.events.send(Event::Error(ApiError::internal(format!("decode step: {e}"))));
                self.release(l.h);
                continue;
            }
            l.seq.fed.push(l.next);
            l.seq.fed.extend_from_slice(&drafts[..n_keep - 1]);
            keep_hidden(&mut l.seq.hidden, rows.hidden(i, n_keep), budget);
            if ends_in_draft {
                self.finish(l, last.finish.expect("a draft step ends only when it finishes"));
                continue;
            }
            if let Some(l) = self.settle(l, last) {
                self.live.push(l);
            }
        }
        if let Some(a) = self.adapt.as_mut().filter(|_| !predicted) {
            a.record(k_streams, drafting, emitted, t0.elapsed().as_secs_f64(), pn_engine::spec::adapt::since(before, after));
        }
    }
}

/// The hidden rows of tokens a sequence kept, after its earlier ones (when it keeps
/// them for the prefix cache); dropped once they pass the cache's `budget` bytes (no
/// entry could hold them).
fn keep_hidden(all: &mut Option<(usize, Vec<f32>)>, rows: &[f32], budget: usize) {
    if let Some((_, h)) = all {
        h.extend_from_slice(rows);
        if 4 * h.len() > budget {
            *all = None;
        }
    }
}

/// An MTP drafter's prompt rows: the hidden rows its prefill kept.
pub(super) fn observe_prompt(drafter: Option<&mut Drafter>, hidden: Option<&[f32]>) {
    if let (Some(Drafter::Mtp(m)), Some(h)) = (drafter, hidden) {
        m.observe_hidden(h);
    }
}
