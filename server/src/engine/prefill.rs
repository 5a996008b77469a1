//! A prompt's prefill in bounded chunks, so the engine loop can run decode steps between
//! them (a 4,000-token prompt does not freeze the other streams).
//!
//! It is [`PrefixCache::prefill`] cut open: the same hit rule, the same passes, the same
//! snapshots, so a sequence prefilled here is bitwise one prefilled there (and `pn run`'s
//! when `chunk` is the interval, the default). Passes are cut at the absolute multiples of
//! `chunk` and of the runner's `ubatch`, skipping a chunk cut that would leave a last pass
//! shorter than [`MIN_TAIL`]; `chunk` divides the snapshot interval, so every interval
//! boundary is a cut and a hit there evaluates the rest exactly as a cold prefill would.

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
}

/// The cut rule of a prompt of `end` tokens: whether a pass ends at `b` (0 < b < end).
fn cut(b: usize, end: usize, chunk: usize, ubatch: usize) -> bool {
    b.is_multiple_of(ubatch) || (b.is_multiple_of(chunk) && end - b >= MIN_TAIL)
}

impl PrefillTask {
    /// Start prefilling `tokens` into `st` (its content is discarded): restore the longest
    /// usable cached prefix. `chunk` ≥ 1 divides the cache's interval (checked by the
    /// caller).
    pub fn start(cache: &mut PrefixCache, runner: &Runner, mut st: SeqState, tokens: Vec<u32>, chunk: usize) -> PrefillTask {
        let (iv, ub, end) = (cache.config().interval, runner.ubatch.max(1), tokens.len());
        let on = cache.config().budget_bytes > 0;
        let on_iv = |b: usize| iv > 0 && b.is_multiple_of(iv);
        let mut done = 0;
        if on {
            if let Some((n, snap)) = cache.lookup_where(&tokens, |n| n > 0 && (!on_iv(n) || cut(n, end, chunk, ub))) {
                if st.restore(&snap).is_ok() {
                    done = n;
                }
            }
        }
        if done == 0 {
            st.reset();
            cache.stats.misses += 1;
        } else {
            cache.stats.hits += 1;
            cache.stats.reused_tokens += done as u64;
        }
        PrefillTask { tokens, done, reused: done, st, logits: None, chunk: chunk.max(1) }
    }

    pub fn is_done(&self) -> bool {
        self.logits.is_some()
    }

    /// Tokens still to evaluate.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.done
    }

    /// Evaluate the next pass (at most `max(chunk, ubatch)` tokens), snapshotting interval
    /// boundaries and, with `snapshot_end`, the end.
    pub fn step(&mut self, cache: &mut PrefixCache, runner: &Runner) -> Result<(), RunError> {
        if self.is_done() {
            return Ok(());
        }
        let (iv, ub, end) = (cache.config().interval, runner.ubatch.max(1), self.tokens.len());
        let on = cache.config().budget_bytes > 0;
        let p = self.done;
        let next = (p + 1..end).find(|&b| cut(b, end, self.chunk, ub)).unwrap_or(end);
        let l = runner.forward(&mut self.st, &self.tokens[p..next], false)?;
        self.done = next;
        if next == end {
            self.logits = Some(l.last().to_vec());
        }
        if on && ((iv > 0 && next.is_multiple_of(iv)) || (next == end && cache.config().snapshot_end)) {
            cache.insert_state(&self.tokens[..next], &self.st);
        }
        Ok(())
    }
}
