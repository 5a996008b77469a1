//! One engine iteration: a forward pass of the live streams' decode tokens together with
//! the prefill passes that [`StepCosts`] allows (`schedule.rs`), then each sequence's
//! logits row. With `async_steps` the decode step runs on the slots' worker instead, while
//! one prefill pass of the oldest prompt runs here.

use super::prefill::PrefillTask;
use super::schedule::Mode;
use super::{Engine, Event, Live, Seq};
use crate::error::ApiError;
use pn_engine::runner::Logits;
use pn_engine::{SeqState, SlotHandle};
use std::time::Instant;

impl Engine {
    /// One iteration (sync steps): decode + chosen prefill passes in one pass.
    pub(super) fn iterate(&mut self) {
        if self.draft.is_some() || self.async_steps {
            // these paths start each prompt when done (no waves)
            self.release_wave();
        }
        if self.draft.is_some() {
            return self.iterate_drafting();
        }
        if self.async_steps {
            return self.iterate_separately(true);
        }
        let stepping = self.take_live();
        let batch: Vec<(SlotHandle, u32)> = stepping.iter().map(|l| (l.h, l.next)).collect();
        let ubatch = self.runner.ubatch.max(1);
        let room = ubatch.saturating_sub(batch.len());
        let smallest = self.prefilling.front().map_or(0, |(_, t)| t.smallest_pass(ubatch));
        let mode = self.costs.mode(batch.len(), self.prefilling.len(), smallest);
        let ends = self.plan(mode, room, batch.len());
        let never_fits = smallest > room;
        if ends.is_empty() && never_fits && mode != Mode::Budget(0) {
            // a ubatch too small to hold a pass beside the decode tokens: separate passes
            self.live = stepping;
            self.release_wave();
            return self.iterate_separately(false);
        }
        if batch.is_empty() && ends.is_empty() {
            return self.release_wave();
        }
        let t0 = Instant::now();
        let res = self.run_pass(&batch, &ends);
        match res {
            Ok((logits, rows)) => {
                let p: usize = self.prefilling.iter().zip(&ends).map(|((_, t), &e)| e - t.done()).sum();
                self.costs.observe(batch.len(), p, t0.elapsed().as_secs_f64());
                self.shared.metrics.record_step(batch.len());
                if std::env::var_os("PN_TRACE_STEPS").is_some() {
                    eprintln!("step k={} n={} mode={:?} prefill={} ms={:.1}", batch.len(), self.prefilling.len(), mode, p, t0.elapsed().as_secs_f64() * 1e3);
                }
                for (row, l) in stepping.into_iter().enumerate() {
                    if let Some(l) = self.after_step(l, logits.row(row)) {
                        self.live.push(l);
                    }
                }
                for ((_, t), (&e, &r)) in self.prefilling.iter_mut().zip(ends.iter().zip(&rows)) {
                    t.passed(&mut self.cache, e, logits.row(r));
                }
                let hold = batch.is_empty() && self.wave_tokens > 0;
                if hold {
                    self.wave_spent += p;
                }
                self.take_prefilled(ends.len(), hold);
            }
            Err(e) => {
                self.fail(stepping, &format!("decode step: {e}"));
                for _ in 0..ends.len() {
                    let (s, t) = self.prefilling.pop_front().expect("planned");
                    let _ = s.job.events.send(Event::Error(ApiError::internal(format!("prefill: {e}"))));
                    self.spare.push(t.st);
                }
            }
        }
        self.end_wave_when_due();
    }

    /// Waves: prompts prefilled while no stream runs are held when done and start
    /// streaming together, once the last of them is done or the wave has spent
    /// `wave_tokens` prompt tokens. A burst of requests then costs no running stream a
    /// stall (none runs) and every one of them decodes in full steps from its first
    /// token, where starting each as soon as it is done would have the later passes
    /// stall the early streams (or, with the step budget, trickle the rest in over many
    /// small steps). The wave's first tokens come later by the rest of the wave.
    fn end_wave_when_due(&mut self) {
        if self.prefilling.is_empty() || !self.live.is_empty() || self.wave_spent >= self.wave_tokens {
            self.release_wave();
        }
    }

    /// Start the wave's prompts now.
    fn release_wave(&mut self) {
        self.wave_spent = 0;
        for (s, t) in std::mem::take(&mut self.wave) {
            self.prefilled(s, t);
        }
    }

    /// The pass ends of the oldest prefills (in order, stopping at the first that does not
    /// fit) for `mode`, with `room` tokens left in a pass beside `k` decode tokens.
    fn plan(&self, mode: Mode, room: usize, k: usize) -> Vec<usize> {
        let ub = self.runner.ubatch;
        let mut left = match mode {
            Mode::Fill | Mode::Smallest => room,
            Mode::Budget(n) => n.min(room),
        };
        // alone, a prompt's pass may hold a whole chunk: Runner::forward cuts at ubatch
        if k == 0 && self.prefilling.len() == 1 && mode == Mode::Fill {
            left = usize::MAX;
        }
        let mut ends = Vec::new();
        for (_, t) in &self.prefilling {
            let max = if mode == Mode::Smallest { t.smallest_pass(ub) } else { left };
            let Some(e) = t.pass_end(max, ub).filter(|&e| e - t.done() <= left) else { break };
            left -= e - t.done();
            ends.push(e);
            if mode == Mode::Smallest || left == 0 {
                break;
            }
        }
        ends
    }

    /// Run one pass: `batch`'s decode tokens, then the oldest prefills up to `ends`.
    /// Returns the logits and, per prefill, the row of its pass's last token.
    fn run_pass(&mut self, batch: &[(SlotHandle, u32)], ends: &[usize]) -> Result<(Logits, Vec<usize>), String> {
        let mut parts: Vec<(&mut SeqState, &[u32])> = self
            .prefilling
            .iter_mut()
            .zip(ends)
            .map(|((_, t), &e)| {
                let p = t.done();
                (&mut t.st, &t.tokens[p..e])
            })
            .collect();
        // one row per decode token, then one per prefill (its last token's)
        let mut rows: Vec<usize> = (batch.len()..batch.len() + parts.len()).collect();
        let logits = if !batch.is_empty() {
            self.slots.step_mixed(&self.runner, batch, &mut parts).map_err(|e| e.to_string())?
        } else if parts.len() == 1 {
            // a prompt alone: only its last row's logits
            let (st, toks) = parts.pop().expect("one part");
            let l = self.runner.forward(st, toks, false).map_err(|e| e.to_string())?;
            rows[0] = l.rows() - 1;
            l
        } else {
            self.runner.forward_multi_last(&mut parts).map_err(|e| e.to_string())?
        };
        Ok((logits, rows))
    }

    /// Of the first `n` prefills, start those that are done (first token, a slot), or
    /// with `hold` keep them in the wave.
    fn take_prefilled(&mut self, n: usize, hold: bool) {
        let mut keep = Vec::new();
        for _ in 0..n {
            let (s, t) = self.prefilling.pop_front().expect("planned");
            if t.is_done() && hold {
                self.wave.push((s, t));
            } else if t.is_done() {
                self.prefilled(s, t);
            } else {
                keep.push((s, t));
            }
        }
        for st in keep.into_iter().rev() {
            self.prefilling.push_front(st);
        }
    }

    /// The decode step, then one prefill pass of the oldest prompt on its own; with
    /// `overlapped` the step runs on the slots' worker thread during the prefill pass (a
    /// prefill that completes binds its sequence for the next step), a pass as long as
    /// the step budget allows beside the streams (an iteration without one is their
    /// plain step); without, a whole chunk (the fallback of `iterate` for a `--ubatch`
    /// too small to hold a pass beside the decode tokens).
    fn iterate_separately(&mut self, overlapped: bool) {
        let stepping = self.take_live();
        let batch: Vec<(SlotHandle, u32)> = stepping.iter().map(|l| (l.h, l.next)).collect();
        let t0 = Instant::now();
        let launched = if batch.is_empty() { Ok(false) } else { self.slots.step_begin_with(&self.runner, &batch, overlapped).map(|_| true) };
        let prefilled = if overlapped { self.prefill_budgeted(batch.len()) } else { self.prefill_chunk() };
        let res = match launched {
            Ok(true) => self.slots.step_wait(),
            Ok(false) => return,
            Err(e) => Err(e),
        };
        if overlapped && prefilled == 0 && res.is_ok() {
            self.costs.observe(batch.len(), 0, t0.elapsed().as_secs_f64());
        }
        match res {
            Ok(logits) => {
                self.shared.metrics.record_step(stepping.len());
                for (row, l) in stepping.into_iter().enumerate() {
                    if let Some(l) = self.after_step(l, logits.row(row)) {
                        self.live.push(l);
                    }
                }
            }
            Err(e) => self.fail(stepping, &format!("decode step: {e}")),
        }
    }

    /// Evaluate one pass of the oldest prefill on its own (a whole chunk); the tokens
    /// evaluated.
    fn prefill_chunk(&mut self) -> usize {
        self.prefill_pass(usize::MAX)
    }

    /// One pass of the oldest prefill on its own, beside the steps of `k` live streams
    /// (the drafting path: a verify round is not a pass that prompts can ride in; the
    /// overlapped one): as long as the step budget allows for them
    /// ([`super::schedule::StepCosts`], their step's own time as the plain step), the
    /// whole chunk when none runs or more prompts wait than streams run. A long prompt
    /// then no longer stalls every stream for a chunk's pass per step. The tokens
    /// evaluated.
    pub(super) fn prefill_budgeted(&mut self, k: usize) -> usize {
        let Some((_, task)) = self.prefilling.front() else { return 0 };
        let smallest = task.smallest_pass(self.runner.ubatch.max(1));
        let max = match self.costs.mode(k, self.prefilling.len(), smallest) {
            Mode::Fill => usize::MAX,
            Mode::Smallest => smallest,
            Mode::Budget(n) => n,
        };
        if max == 0 {
            return 0;
        }
        let t0 = Instant::now();
        let p = self.prefill_pass(max);
        self.costs.observe_alone(p, t0.elapsed().as_secs_f64());
        p
    }

    /// A pass of at most `max` tokens of the oldest prefill on its own; the tokens
    /// evaluated.
    fn prefill_pass(&mut self, max: usize) -> usize {
        let Some((_, task)) = self.prefilling.front_mut() else { return 0 };
        let p = match task.step_upto(max, &mut self.cache, &self.runner) {
            Ok(p) => p,
            Err(e) => {
                let (s, t) = self.prefilling.pop_front().expect("front exists");
                let _ = s.job.events.send(Event::Error(ApiError::internal(format!("prefill: {e}"))));
                self.spare.push(t.st);
                return 0;
            }
        };
        if self.prefilling.front().is_some_and(|(_, t)| t.is_done()) {
            let (s, t) = self.prefilling.pop_front().expect("front exists");
            self.prefilled(s, t);
        }
        p
    }

    /// A prompt is prefilled: remember its tokens, sample its first token (the TTFT),
    /// bind it to a slot for the next step.
    fn prefilled(&mut self, mut seq: Seq, task: PrefillTask) {
        let logits = task.logits.expect("done");
        super::speculate::observe_prompt(seq.drafter.as_mut(), task.hidden.as_deref());
        let budget = self.cache.config().budget_bytes;
        if budget > 0 {
            // the answer's rows join them as the rounds keep tokens (speculate.rs), up to
            // what a cache entry could hold
            seq.hidden = task.hidden.filter(|h| 4 * h.len() <= budget).map(|h| (h.len() / task.tokens.len().max(1), h));
        }
        if let Some(text) = &seq.job.text {
            self.shared.index.insert(text.clone(), task.tokens);
        }
        self.shared.metrics.observe_ttft(seq.job.arrived.elapsed());
        let step = match seq.token(&self.tok, &logits, &self.shared.metrics) {
            Some(s) => s,
            None => {
                self.spare.push(task.st);
                return;
            }
        };
        match self.slots.try_bind(task.st) {
            Ok(h) => {
                let l = Live { seq, h, next: step.token, finishing: None };
                if let Some(l) = self.settle(l, step) {
                    self.live.push(l);
                }
            }
            Err((e, st)) => {
                // its buffers serve the next request
                self.spare.push(st);
                let _ = seq.job.events.send(Event::Error(ApiError::internal(format!("binding a slot: {e}"))));
            }
        }
    }
}
