//! Whether a round drafts (`--draft-policy adaptive`, the default of the CLI and the
//! server): drafting pays when a verify pass of k sequences and their drafts emits more
//! tokens a second than a plain step of the k, and that depends on the model, the
//! machine, the text and k. On the built-in model with 6 slots MTP drafting ran at 0.61×
//! plain decoding (`pn batch --slots 6`: the step already batches the weights, the drafts
//! add work); one sequence at 1.0–1.25×; a block with random weights accepts nothing.
//!
//! Per number of sequences in the round, a moving average of the tokens a second of
//! drafting rounds and of plain rounds (a plain round: the same verify pass without
//! drafts, so the drafters keep up: an MTP drafter catches up on the hidden rows it was
//! given at its next draft). The better one runs; every [`EXPLORE_EVERY`] rounds of a k the
//! other runs once, so a change (a text that starts to repeat, other load) is seen. The
//! first round of each (k, mode) is not counted (it may compile a pass shape).
//!
//! Which rounds draft never changes the text: acceptance is the coupled rule (accept.rs),
//! so a seed gives the same tokens with drafts or without.

use super::Drafter;

/// Weight of a new measurement in the moving averages.
const ALPHA: f64 = 0.25;
/// Rounds of one k between two tries of the mode not chosen.
pub const EXPLORE_EVERY: u32 = 16;

/// One k's measurements.
#[derive(Clone, Debug, Default)]
struct PerK {
    /// Tokens a second: [plain, drafting] (None until measured).
    rate: [Option<f64>; 2],
    /// Rounds seen of each mode (the first is not counted).
    seen: [u32; 2],
    /// Rounds since the mode not chosen last ran.
    since: u32,
}

/// The adaptive policy's measurements (one per engine loop or sequence).
#[derive(Clone, Debug, Default)]
pub struct Adaptive {
    by_k: Vec<PerK>,
    /// Rounds that drafted, and plain ones.
    pub rounds: [u64; 2],
    /// The drafters' catch-up so far: seconds and positions.
    caught: (f64, u64),
}

impl Adaptive {
    fn at(&mut self, k: usize) -> &mut PerK {
        if self.by_k.len() <= k {
            self.by_k.resize(k + 1, PerK::default());
        }
        &mut self.by_k[k]
    }

    /// Whether the next round of `k` sequences drafts.
    pub fn draft(&mut self, k: usize) -> bool {
        let p = self.at(k);
        let pick = match p.rate {
            // drafting first (what was asked for), then plain, until both are measured
            [_, None] => true,
            [None, _] => false,
            [Some(plain), Some(draft)] => {
                let best = draft > plain;
                p.since += 1;
                if p.since >= EXPLORE_EVERY {
                    p.since = 0;
                    !best
                } else {
                    best
                }
            }
        };
        self.rounds[usize::from(!pick)] += 1;
        pick
    }

    /// A round of `k` sequences (drafting or not) emitted `tokens` in `secs`, of which
    /// `caught` (seconds, positions) the drafters spent catching up on earlier rounds
    /// (`Drafter::caught_up`). Every emitted token is charged the average catch-up of a
    /// position instead: a round without drafts leaves its positions' block passes to
    /// the next drafting round, which must not look slower for it.
    pub fn record(&mut self, k: usize, drafted: bool, tokens: usize, secs: f64, caught: (f64, u64)) {
        self.caught = (self.caught.0 + caught.0, self.caught.1 + caught.1);
        let per = self.caught.0 / self.caught.1.max(1) as f64;
        let secs = secs - caught.0 + per * tokens as f64;
        let p = self.at(k);
        let m = usize::from(drafted);
        p.seen[m] = p.seen[m].saturating_add(1);
        if p.seen[m] == 1 || secs <= 0.0 {
            return;
        }
        let r = tokens as f64 / secs;
        p.rate[m] = Some(p.rate[m].map_or(r, |old| old + ALPHA * (r - old)));
    }

    /// Drafting rounds over all rounds so far (for the end-of-run line).
    pub fn drafting_share(&self) -> f64 {
        let [d, p] = self.rounds;
        d as f64 / (d + p).max(1) as f64
    }
}

/// `--draft-policy`: draft in every round, or where it measures faster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftPolicy {
    #[default]
    Adaptive,
    Always,
}

impl DraftPolicy {
    /// The measurements this policy keeps (None: every round drafts).
    pub fn tracker(self) -> Option<Adaptive> {
        (self == DraftPolicy::Adaptive).then(Adaptive::default)
    }
}

/// The catch-up between two readings of [`caught_up`] (or one drafter's
/// [`Drafter::caught_up`]): what a round hands [`Adaptive::record`].
pub fn since(before: (f64, u64), after: (f64, u64)) -> (f64, u64) {
    (after.0 - before.0, after.1.saturating_sub(before.1))
}

/// The catch-up of several drafters so far, summed ([`Drafter::caught_up`]): what a
/// round of several sequences hands [`Adaptive::record`], as the difference of two.
pub fn caught_up<'a>(drafters: impl IntoIterator<Item = &'a Drafter>) -> (f64, u64) {
    drafters.into_iter().map(Drafter::caught_up).fold((0.0, 0), |a, c| (a.0 + c.0, a.1 + c.1))
}

impl std::str::FromStr for DraftPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adaptive" => Ok(DraftPolicy::Adaptive),
            "always" => Ok(DraftPolicy::Always),
            _ => Err(format!("expected adaptive or always, found {s:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Measures drafting, then plain; keeps the faster and tries the other every
    /// `EXPLORE_EVERY` rounds; each k on its own; the first round of a mode not counted.
    #[test]
    fn a_rounds_catch_up_is_the_later_reading_less_the_earlier() {
        assert_eq!(since((1.5, 4), (2.25, 7)), (0.75, 3));
        assert_eq!(since((2.0, 7), (2.0, 7)), (0.0, 0));
    }

    #[test]
    fn picks_the_faster_and_keeps_trying_the_other() {
        let mut a = Adaptive::default();
        // k = 4: drafting 2 rounds (the first not counted), then plain 2 rounds
        assert!(a.draft(4));
        a.record(4, true, 8, 100.0, (0.0, 0)); // compile round: ignored
        assert!(a.draft(4));
        a.record(4, true, 8, 0.004, (0.0, 0)); // 2000 tok/s
        assert!(!a.draft(4));
        a.record(4, false, 4, 0.001, (0.0, 0)); // ignored
        assert!(!a.draft(4));
        a.record(4, false, 4, 0.001, (0.0, 0)); // 4000 tok/s: plain wins
        let picks: Vec<bool> = (0..2 * EXPLORE_EVERY).map(|_| a.draft(4)).collect();
        assert_eq!(picks.iter().filter(|&&d| d).count(), 2, "{picks:?}");
        assert!(!picks[0] && picks[EXPLORE_EVERY as usize - 1]);
        // k = 1 is measured on its own
        assert!(a.draft(1));
        // drafting gets faster at k = 4 (e.g. the text repeats): it takes over
        for _ in 0..8 {
            a.record(4, true, 16, 0.001, (0.0, 0));
        }
        assert!(a.draft(4));
        assert!(a.rounds[0] > 0 && a.rounds[1] > 0 && a.drafting_share() > 0.0);
    }

    /// A drafting round that catches up on the plain rounds' positions is charged only
    /// its own tokens' share: plain rounds that only looked cheap by leaving their
    /// catch-up behind lose.
    #[test]
    fn catch_up_is_charged_to_the_rounds_that_left_it() {
        let mut a = Adaptive::default();
        for _ in 0..3 {
            a.record(1, true, 2, 0.002, (0.0005, 1)); // 0.5 ms a position of catch-up
        }
        for _ in 0..3 {
            a.record(1, false, 1, 0.0008, (0.0, 0)); // looks like 1250 tok/s
        }
        // drafting: (2 ms - 0.5 + 2 x 0.5) for 2 tokens = 800 tok/s; plain: (0.8 + 0.5)
        // ms for 1 = 769 tok/s
        assert!(a.draft(1));
    }

    #[test]
    fn parses_the_flag() {
        assert_eq!("always".parse::<DraftPolicy>(), Ok(DraftPolicy::Always));
        assert!("sometimes".parse::<DraftPolicy>().unwrap_err().contains("sometimes"));
    }
}
