//! How much prefill work goes into each engine step (docs/server.md, "Scheduling").
//!
//! Each iteration is one forward pass over the k live streams' decode tokens and the
//! prefill passes chosen here (`Slots::step_mixed`; `Runner::forward_multi` with no live
//! stream), in one of two modes, from k and the n prompts still prefilling:
//! * **fill** (k = 0, or n > k: more prompts waiting to start than streams running): the
//!   pass takes as many prompt tokens as it holds (`ubatch`), several prompts at once, the
//!   k decode tokens riding along. A wave of prompts starts together (the weights stream
//!   once for all of them) instead of each one stalling every running stream in turn.
//! * **budget** (k ≥ n > 0): a step may cost at most `ratio` × a plain decode step of k
//!   streams. The prefill tokens it may add follow from the measured marginal cost per
//!   prefill token. When even the oldest prompt's smallest pass (a granule of 64 tokens,
//!   or a short prompt whole) costs more than that, the unspent allowance is kept as
//!   credit until it pays for that pass, so on average the streams slow down by at most
//!   `ratio` (and once the credit reaches its cap, the smallest pass goes in anyway).
//!
//! Costs are measured online: the seconds of a plain decode step per batch size k (EWMA),
//! and the marginal seconds per prefill token of a mixed step (its time minus the plain
//! step of its k, over its prefill tokens).

/// Weight of a new measurement in the moving averages.
const ALPHA: f64 = 0.3;
/// Credit kept at most (seconds): a long quiet spell does not bank a long stall.
const MAX_CREDIT: f64 = 2.0;

/// What the next pass may hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// As many prompt tokens as the pass holds.
    Fill,
    /// At most this many prompt tokens (0: a plain decode step).
    Budget(usize),
    /// The oldest prompt's smallest pass (to measure the cost of a prefill token).
    Smallest,
}

pub struct StepCosts {
    /// Seconds of a plain decode step, by batch size.
    decode: Vec<Option<f64>>,
    /// Marginal seconds per prefill token in a mixed step.
    per_token: Option<f64>,
    /// Seconds of prefill the waiting prompts may still spend (negative: overspent).
    credit: f64,
    /// The most a mixed step may cost, relative to a plain decode step (> 1).
    ratio: f64,
    /// The last mode was Fill (its prefill time is not charged to the credit).
    filling: bool,
}

fn ewma(old: Option<f64>, x: f64) -> f64 {
    old.map_or(x, |o| o + ALPHA * (x - o))
}

impl StepCosts {
    pub fn new(ratio: f64, n_slots: usize) -> StepCosts {
        StepCosts { decode: vec![None; n_slots + 1], per_token: None, credit: 0.0, ratio, filling: false }
    }

    /// A plain decode step of `k` streams: measured, else the nearest measured size.
    fn decode_secs(&self, k: usize) -> Option<f64> {
        let near = |d: usize| [k.checked_sub(d), Some(k + d)].into_iter().flatten().find_map(|i| self.decode.get(i).copied().flatten());
        (0..self.decode.len()).find_map(near)
    }

    /// The mode of the next pass with `k` live streams and `n` prompts prefilling, the
    /// oldest of which needs at least `smallest` tokens in a pass.
    pub fn mode(&mut self, k: usize, n: usize, smallest: usize) -> Mode {
        self.filling = false;
        if n == 0 {
            self.credit = 0.0;
            return Mode::Budget(0);
        }
        if k == 0 || n > k {
            self.filling = true;
            self.credit = 0.0;
            return Mode::Fill;
        }
        let Some(d) = self.decode_secs(k) else {
            // first learn what a plain step costs
            return Mode::Budget(0);
        };
        let allowance = (self.ratio - 1.0) * d;
        self.credit = (self.credit + allowance).min(MAX_CREDIT);
        let Some(c) = self.per_token.filter(|&c| c > 0.0) else {
            // not measured yet: one smallest pass tells
            return Mode::Smallest;
        };
        // this step's allowance, no more even with credit banked
        let fit = (allowance.min(self.credit) / c).floor().max(0.0) as usize;
        if fit >= smallest.max(1) {
            Mode::Budget(fit)
        } else if self.credit >= c * smallest as f64 || self.credit >= MAX_CREDIT {
            // the smallest pass costs more than one step's allowance: the credit pays
            Mode::Smallest
        } else {
            Mode::Budget(0)
        }
    }

    /// A pass of `k` decode tokens and `p` prefill tokens took `secs`.
    pub fn observe(&mut self, k: usize, p: usize, secs: f64) {
        if p == 0 {
            if let Some(slot) = self.decode.get_mut(k) {
                *slot = Some(ewma(*slot, secs));
            }
            return;
        }
        // the marginal cost over a plain step of the same k (none without decode tokens)
        let Some(plain) = self.decode_secs(k).filter(|_| k > 0) else { return };
        let extra = (secs - plain).max(0.0);
        self.per_token = Some(ewma(self.per_token, extra / p as f64));
        if !self.filling {
            self.credit -= extra;
        }
    }

    /// A prefill pass of `p` tokens run on its own, not inside the streams' step (after
    /// a drafting round, or beside the overlapped step of `--async-steps`), took `secs`:
    /// all of it is prefill, and all of it is charged to what the streams may wait.
    pub fn observe_alone(&mut self, p: usize, secs: f64) {
        if p == 0 {
            return;
        }
        self.per_token = Some(ewma(self.per_token, secs / p as f64));
        if !self.filling {
            self.credit -= secs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_when_nothing_runs_or_more_wait_than_run() {
        let mut c = StepCosts::new(1.5, 16);
        assert_eq!(c.mode(0, 3, 1), Mode::Fill);
        assert_eq!(c.mode(2, 3, 1), Mode::Fill);
        assert_eq!(c.mode(5, 0, 1), Mode::Budget(0));
        // k ≥ n, no plain step measured yet: a plain step first
        assert_eq!(c.mode(4, 2, 1), Mode::Budget(0));
    }

    #[test]
    fn budget_follows_the_measured_costs() {
        let mut c = StepCosts::new(1.5, 16);
        c.observe(8, 0, 0.125);
        // a fill pass teaches the per-token cost but is not charged to the credit
        assert_eq!(c.mode(2, 3, 1), Mode::Fill);
        c.observe(2, 64, 1.0);
        assert_eq!(c.credit, 0.0);
        c.per_token = None;
        // no per-token cost yet: the smallest pass measures it
        assert_eq!(c.mode(8, 1, 16), Mode::Smallest);
        // 64 prefill tokens added 0.09375 s; the allowance was 0.5 × 0.125 = 0.0625
        c.observe(8, 64, 0.125 + 0.09375);
        assert_eq!(c.credit, 0.0625 - 0.09375);
        // next step: credit 0.03125 s at 0.09375 / 64 s a token → 21 tokens
        assert_eq!(c.mode(8, 1, 16), Mode::Budget(21));
        c.observe(8, 21, 0.125 + 21.0 * 0.09375 / 64.0);
        // with credit banked, a step still gets one step's allowance: 0.0625 s → 42 tokens
        c.credit = 1.0;
        assert_eq!(c.mode(8, 1, 16), Mode::Budget(42));
        // a size never measured uses the nearest one (k = 8)
        assert_eq!(c.decode_secs(10), Some(0.125));
    }

    #[test]
    fn a_pass_on_its_own_is_charged_whole() {
        let mut c = StepCosts::new(1.5, 4);
        c.observe(2, 0, 0.010);
        // not measured yet: a smallest pass
        assert_eq!(c.mode(2, 1, 64), Mode::Smallest);
        // 64 tokens alone in 32 ms: 0.5 ms a token, all 32 ms against the 5 ms allowance
        c.observe_alone(64, 0.032);
        assert_eq!(c.per_token, Some(0.0005));
        assert!((c.credit - (0.005 - 0.032)).abs() < 1e-12, "{}", c.credit);
        // a smaller allowance than the smallest pass: plain rounds until the credit pays
        let mut plain = 0;
        while c.mode(2, 1, 64) == Mode::Budget(0) {
            plain += 1;
        }
        assert!((11..=12).contains(&plain), "27 ms of debt, then 32 ms of credit, 5 ms a round: {plain}");
        // a fill pass (more prompts than streams) is not charged
        assert_eq!(c.mode(1, 3, 64), Mode::Fill);
        c.observe_alone(256, 0.128);
        assert_eq!(c.credit, 0.0);
        // nothing evaluated: nothing learned
        c.observe_alone(0, 1.0);
        assert_eq!(c.credit, 0.0);
    }

    #[test]
    fn credit_pays_for_a_pass_larger_than_one_steps_allowance() {
        let mut c = StepCosts::new(1.5, 4);
        c.observe(1, 0, 0.010);
        c.observe(1, 40, 0.210); // 5 ms a token: 0.2 s of debt
        // overspent: plain steps until the credit is back, then until it pays for the
        // smallest pass (40 tokens, 0.2 s) at 5 ms of allowance a step
        let mut plain = 0;
        while c.mode(1, 1, 40) == Mode::Budget(0) {
            plain += 1;
        }
        assert!((78..=81).contains(&plain), "0.2 s of debt, then 0.2 s of credit, 5 ms a step: {plain}");
        assert_eq!(c.mode(1, 1, 40), Mode::Smallest);
        // a smallest pass within one step's allowance (1 token = 5 ms): a budget
        assert_eq!(c.mode(1, 1, 1), Mode::Budget(1));
        for _ in 0..10_000 {
            c.mode(1, 1, 100_000);
        }
        // the credit is capped; at the cap, the smallest pass goes in whatever it costs
        assert!(c.credit <= MAX_CREDIT);
        assert_eq!(c.mode(1, 1, 100_000), Mode::Smallest);
        // no prompt waiting: the credit is dropped
        c.mode(1, 0, 0);
        assert_eq!(c.credit, 0.0);
    }
}
