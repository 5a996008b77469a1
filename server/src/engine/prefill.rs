//! A prompt's prefill in bounded chunks, so the engine loop can run decode steps between
//! them (a 4,000-token prompt does not freeze the other streams).
//!
//! It is [`PrefixCache::prefill`] cut open: the same hit rule, the same snapshots. Passes
//! end at cuts: the absolute multiples of the runner's `ubatch` and of the [`granule`]
//! (64 tokens, the delta rule's chunk, when `chunk` is a multiple of it; else `chunk`),
//! skipping a granule cut that would leave a last pass shorter than [`MIN_TAIL`]. The
//! scheduler picks how many granules a pass takes (at most `chunk` tokens, never across a
//! multiple of `chunk`). `chunk` divides the snapshot interval, so every interval boundary
//! is a cut and a hit there evaluates the rest exactly as a cold prefill would.
//!
//! Which cuts a pass skips does not change a bit of the result: the kernels are
//! batch-invariant, the CPU's delta rule is the recurrence at every length, and were the
//! chunked form on (`PN_DELTA_CHUNKED_FROM`), passes that start on multiples of 64 and
//! leave no tail under [`MIN_TAIL`] compute what one pass computes (docs/serving.md).
//! So a prompt prefilled beside 15 streams in small passes is bitwise one prefilled alone.

use pn_engine::prefix_cache::{PrefixCache, MIN_TAIL};
use pn_engine::{RunError, Runner, SeqState};

pub struct PrefillTask {
    pub tokens: Vec<u32>,
    /// Tokens evaluated (or restored) so far.
    done: usize,
    /// Prompt tokens restored from the cache.
    pub reused: usize,
    pub st: SeqState,
    /// The last prompt token's logits, once done.
    pub logits: Option<Vec<f32>>,
    chunk: usize,
    /// `--draft mtp`: every prompt token's hidden row (the MTP drafter's input), kept
    /// as the passes run; such a prefill restores only a cached prefix that holds them.
    pub hidden: Option<Vec<f32>>,
}

/// The delta rule's chunk: passes cut at its multiples compute what one pass computes.
const DELTA_CHUNK: usize = 64;

/// Cuts fall on multiples of this (`chunk` ≥ 1 divides the cache interval).
pub fn granule(chunk: usize) -> usize {
    if chunk.is_multiple_of(DELTA_CHUNK) {
        DELTA_CHUNK
    } else {
        chunk
    }
}

/// The cut rule of a prompt of `end` tokens: whether a pass may end at `b` (0 < b < end).
fn cut(b: usize, end: usize, granule: usize, ubatch: usize) -> bool {
    b.is_multiple_of(ubatch) || (b.is_multiple_of(granule) && end - b >= MIN_TAIL)
}

impl PrefillTask {
    /// Start prefilling `tokens` into `st` (its content is discarded): restore the longest
    /// usable cached prefix. `chunk` ≥ 1 divides the cache's interval (checked by the
    /// caller).
    /// With `hidden` the passes keep every token's hidden row, and only a cached prefix
    /// that holds its rows is restored (they come with it).
    pub fn start(cache: &mut PrefixCache, runner: &Runner, mut st: SeqState, tokens: Vec<u32>, chunk: usize, hidden: bool) -> PrefillTask {
        let (iv, ub, end) = (cache.config().interval, runner.ubatch.max(1), tokens.len());
        let g = granule(chunk.max(1));
        let ok = |n: usize| n > 0 && (!(iv > 0 && n.is_multiple_of(iv)) || cut(n, end, g, ub));
        let (done, restored) = cache.restore_prefix(&mut st, &tokens, ok, hidden);
        let rows = hidden.then(|| restored.map_or_else(Vec::new, |h| h.to_vec()));
        PrefillTask { tokens, done, reused: done, st, logits: None, chunk: chunk.max(1), hidden: rows }
    }

    pub fn is_done(&self) -> bool {
        self.logits.is_some()
    }

    /// Tokens still to evaluate.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.done
    }

    /// Tokens evaluated (or restored) so far.
    pub fn done(&self) -> usize {
        self.done
    }

    /// The end of the longest pass from here of at most `max` tokens: the furthest cut
    /// within `max`, never past the next multiple of `ubatch`, nor past the next multiple
    /// of `chunk` unless the first cut is. None when even the first cut is further.
    pub fn pass_end(&self, max: usize, ubatch: usize) -> Option<usize> {
        let (p, end, ub) = (self.done, self.tokens.len(), ubatch.max(1));
        if p >= end {
            return None;
        }
        let g = granule(self.chunk);
        let is_cut = |b: usize| b == end || cut(b, end, g, ub);
        let first = (p + 1..=end).find(|&b| is_cut(b)).expect("the end is a cut");
        if first - p > max {
            return None;
        }
        let next_chunk = ((p / self.chunk + 1) * self.chunk).max(first);
        let limit = p.saturating_add(max).min(next_chunk).min((p / ub + 1) * ub).min(end);
        Some((first..=limit).rev().find(|&b| is_cut(b)).unwrap_or(first))
    }

    /// The smallest pass from here, in tokens (0 when done).
    pub fn smallest_pass(&self, ubatch: usize) -> usize {
        (1..=self.remaining()).find(|&n| self.pass_end(n, ubatch).is_some()).unwrap_or(0)
    }

    /// A pass to `end` was evaluated into `st`, `last` its last token's logits: snapshot
    /// an interval boundary (and, with `snapshot_end`, the end); keep the logits when done.
    pub fn passed(&mut self, cache: &mut PrefixCache, end: usize, last: &[f32]) {
        let iv = cache.config().interval;
        let on = cache.config().budget_bytes > 0;
        self.done = end;
        let at_end = end == self.tokens.len();
        if at_end {
            self.logits = Some(last.to_vec());
        }
        if on && ((iv > 0 && end.is_multiple_of(iv)) || (at_end && cache.config().snapshot_end)) {
            cache.insert_state_with(&self.tokens[..end], &self.st, self.hidden.as_deref());
        }
    }

    /// Evaluate the next pass on its own, of at most `max` and `chunk` tokens (the
    /// longest the cuts allow: [`PrefillTask::pass_end`]; beside a decode step on the
    /// slots' worker, or between drafting rounds); returns the tokens evaluated (0 when
    /// no cut is within `max`).
    pub fn step_upto(&mut self, max: usize, cache: &mut PrefixCache, runner: &Runner) -> Result<usize, RunError> {
        let Some(next) = self.pass_end(max.min(self.chunk), runner.ubatch) else { return Ok(0) };
        let p = next - self.done;
        let toks = &self.tokens[self.done..next];
        let l = match &mut self.hidden {
            Some(h) => {
                let mut rows = Vec::new();
                let l = pn_engine::spec::verify::forward_hidden(runner, &mut self.st, toks, false, &mut rows)?;
                h.extend_from_slice(&rows);
                l
            }
            None => runner.forward(&mut self.st, toks, false)?,
        };
        self.passed(cache, next, l.last());
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task of `n` tokens with `done` evaluated (the cut rule needs no model).
    fn task(n: usize, done: usize, chunk: usize) -> PrefillTask {
        PrefillTask { tokens: vec![0; n], done, reused: 0, st: SeqState::new(vec![], 4096), logits: None, chunk, hidden: None }
    }

    #[test]
    fn a_short_prompt_is_one_pass() {
        let t = task(35, 0, 256);
        assert_eq!(t.pass_end(1000, 256), Some(35));
        assert_eq!(t.pass_end(usize::MAX, 256), Some(35));
        assert_eq!(t.pass_end(34, 256), None);
        assert_eq!(t.smallest_pass(256), 35);
    }

    #[test]
    fn passes_take_whole_granules_up_to_the_chunk() {
        let t = task(300, 0, 256);
        assert_eq!(t.smallest_pass(256), 64);
        assert_eq!(t.pass_end(63, 256), None);
        assert_eq!(t.pass_end(100, 256), Some(64));
        assert_eq!(t.pass_end(200, 256), Some(192));
        assert_eq!(t.pass_end(1000, 256), Some(256), "never past a multiple of chunk");
        // from 256 the rest (44) is one pass: 320 is past the end
        assert_eq!(task(300, 256, 256).pass_end(1000, 256), Some(300));
        // a ubatch of 48 cuts too, and a pass never crosses one of its multiples
        assert_eq!(t.pass_end(1000, 48), Some(48));
        assert_eq!(task(300, 48, 256).pass_end(1000, 48), Some(96));
        // a chunk that is not a multiple of 64 is its own granule
        assert_eq!(task(100, 0, 32).pass_end(1000, 256), Some(32));
        // from 64: the cut at 96 would leave 4 tokens, so the rest is one pass
        assert_eq!(task(100, 64, 32).pass_end(1000, 256), Some(100));
        assert_eq!(task(140, 64, 32).pass_end(1000, 256), Some(96));
    }

    #[test]
    fn no_cut_leaves_a_tail_under_min_tail() {
        // 64 would leave 6 tokens: skipped, so the whole prompt is the smallest pass
        let t = task(70, 0, 256);
        assert_eq!(t.smallest_pass(256), 70);
        assert_eq!(t.pass_end(64, 256), None);
        // 128 + 20: the cut at 128 stays (a tail of 20 ≥ MIN_TAIL)
        assert_eq!(task(148, 0, 256).pass_end(130, 256), Some(128));
        // a multiple of ubatch cuts whatever the tail
        assert_eq!(task(260, 0, 256).pass_end(1000, 256), Some(256));
    }
}
