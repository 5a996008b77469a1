//! Prefix cache: when a new request shares a token prefix with a cached sequence, restore
//! that sequence's state snapshot ([`SeqState::snapshot`]: KV cells + conv + delta-rule
//! state at the end of the prefix) and prefill only the rest (docs/serving.md).
//!
//! Recurrent state cannot be trimmed back, so snapshots are taken where a later request
//! may branch off: at every multiple of `interval` tokens (default 256) during a
//! prefill, and at the end of each turn ([`PrefixCache::insert_state`], or the end of a
//! prompt with `snapshot_end`). Entries are evicted least-recently-used first to stay
//! under a byte budget.
//!
//! Exactness: [`PrefixCache::prefill`] evaluates a prompt in passes cut at the absolute
//! multiples of `interval` (and of the runner's `ubatch`), except that a cut leaving a
//! last pass shorter than [`MIN_TAIL`] tokens is skipped (unless `ubatch` cuts there
//! anyway). A hit is only taken at a cut this prompt's own prefill would make, so the
//! rest is evaluated in exactly the passes of a cold prefill: the logits are bitwise
//! those of the full prefill. With `interval` a multiple of 64 (the delta rule's chunk)
//! dividing `ubatch` (or a multiple of it), the passes also compute exactly what one
//! `Runner::forward` of the whole prompt computes (`pn run`), bitwise. A hit at an
//! end-of-turn snapshot (not on an interval boundary) equals a prefill split at that
//! point bitwise, and a one-pass prefill to within float reassociation (1e-4).

use crate::runner::{RunError, Runner};
use crate::state::{SeqState, StateSnapshot};
use std::sync::Arc;

/// Default snapshot interval in tokens (a multiple of the delta rule's 64-token chunk).
pub const DEFAULT_INTERVAL: usize = 256;
/// Shortest last pass a boundary cut may leave: the CPU delta rule switches between its
/// recurrent form (below) and chunked form (from) at 16 tokens (pn-cpu `CHUNKED_FROM_T`),
/// which agree only to float reassociation.
pub const MIN_TAIL: usize = 16;
/// Default byte budget (`PN_PREFIX_CACHE_MB`).
pub const DEFAULT_BUDGET_MB: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Bytes of snapshots kept at most (0: the cache is off).
    pub budget_bytes: usize,
    /// Snapshot every `interval` tokens of a prefill (0: only at turn ends).
    pub interval: usize,
    /// Snapshot at the end of every prompt [`PrefixCache::prefill`] evaluates.
    pub snapshot_end: bool,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig { budget_bytes: DEFAULT_BUDGET_MB << 20, interval: DEFAULT_INTERVAL, snapshot_end: true }
    }
}

impl PrefixCacheConfig {
    /// The default, with `PN_PREFIX_CACHE_MB` (budget in MiB, 0 = off) and
    /// `PN_PREFIX_INTERVAL` (tokens) from the environment.
    pub fn from_env() -> Result<PrefixCacheConfig, String> {
        let mut c = PrefixCacheConfig::default();
        let num = |name: &str| -> Result<Option<usize>, String> {
            match std::env::var(name).ok().filter(|s| !s.trim().is_empty()) {
                None => Ok(None),
                Some(s) => s.trim().parse().map(Some).map_err(|_| format!("{name}: expected a number, found {s:?}")),
            }
        };
        if let Some(mb) = num("PN_PREFIX_CACHE_MB")? {
            c.budget_bytes = mb << 20;
        }
        if let Some(i) = num("PN_PREFIX_INTERVAL")? {
            c.interval = i;
        }
        Ok(c)
    }
}

/// Counters of a cache's use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Prompt tokens restored instead of evaluated.
    pub reused_tokens: u64,
    pub inserted: u64,
    pub evicted: u64,
}

/// Every token's hidden row (`result_norm`) of a cached prefix, when asked for and held.
type HiddenRows = Option<Arc<[f32]>>;

struct Entry {
    tokens: Vec<u32>,
    snap: Arc<StateSnapshot>,
    /// Every token's hidden row (`result_norm`), when the inserter had them: what an
    /// MTP drafter needs of a restored prefix (crate::spec::mtp).
    hidden: Option<Arc<[f32]>>,
    bytes: usize,
    last_use: u64,
}

pub struct PrefixCache {
    cfg: PrefixCacheConfig,
    entries: Vec<Entry>,
    bytes: usize,
    tick: u64,
    pub stats: CacheStats,
}

/// What [`PrefixCache::prefill`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefill {
    /// The last prompt token's logits.
    pub logits: Vec<f32>,
    /// Prompt tokens restored from a snapshot (0: a miss).
    pub reused: usize,
}

impl PrefixCache {
    pub fn new(cfg: PrefixCacheConfig) -> PrefixCache {
        PrefixCache { cfg, entries: Vec::new(), bytes: 0, tick: 0, stats: CacheStats::default() }
    }
    pub fn config(&self) -> &PrefixCacheConfig {
        &self.cfg
    }
    /// Bytes of the snapshots held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Whether a snapshot of exactly `tokens` is held.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.held(tokens).is_some()
    }
    /// The prefix lengths held, most recently used first.
    pub fn prefixes(&self) -> Vec<usize> {
        let mut v: Vec<(u64, usize)> = self.entries.iter().map(|e| (e.last_use, e.tokens.len())).collect();
        v.sort_by(|a, b| b.cmp(a));
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// The longest cached proper prefix of `tokens` (at least one token is left to
    /// evaluate): its length and snapshot. Marks the entry used.
    pub fn lookup(&mut self, tokens: &[u32]) -> Option<(usize, Arc<StateSnapshot>)> {
        self.lookup_where(tokens, |_| true)
    }

    /// `lookup` restricted to held prefixes whose length passes `ok` (e.g. only the
    /// lengths where the caller's own prefill would cut a pass).
    pub fn lookup_where(&mut self, tokens: &[u32], ok: impl Fn(usize) -> bool) -> Option<(usize, Arc<StateSnapshot>)> {
        self.find(tokens, ok, false).map(|(n, s, _)| (n, s))
    }

    /// `lookup_where` among the entries that hold every token's hidden row: also those
    /// rows (`n × n_embd`).
    pub fn lookup_hidden(&mut self, tokens: &[u32], ok: impl Fn(usize) -> bool) -> Option<(usize, Arc<StateSnapshot>, Arc<[f32]>)> {
        self.find(tokens, ok, true).map(|(n, s, h)| (n, s, h.expect("an entry with hidden rows")))
    }

    fn find(&mut self, tokens: &[u32], ok: impl Fn(usize) -> bool, hidden: bool) -> Option<(usize, Arc<StateSnapshot>, HiddenRows)> {
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < tokens.len() && ok(e.tokens.len()) && (!hidden || e.hidden.is_some()) && tokens.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len())?;
        self.tick += 1;
        best.last_use = self.tick;
        Some((best.tokens.len(), best.snap.clone(), best.hidden.clone()))
    }

    /// Keep `snap` as the state after `tokens`. Evicts least-recently-used entries to stay
    /// within the budget; a snapshot larger than the whole budget is not kept. Returns
    /// whether it was inserted (false: already held, or too large).
    pub fn insert(&mut self, tokens: &[u32], snap: StateSnapshot) -> bool {
        self.insert_with(tokens, snap, None)
    }

    /// [`PrefixCache::insert`] with every token's hidden row (`hidden`: `tokens.len()`
    /// rows); an entry already held without them gets them.
    pub fn insert_with(&mut self, tokens: &[u32], snap: StateSnapshot, hidden: Option<Arc<[f32]>>) -> bool {
        self.tick += 1;
        if let Some(i) = self.held(tokens) {
            self.entries[i].last_use = self.tick;
            if !self.takes(i, hidden.is_some()) {
                return false;
            }
            // held without hidden rows: replaced by the entry that has them
            let e = self.entries.swap_remove(i);
            self.bytes -= e.bytes;
        }
        let bytes = snap.bytes() + tokens.len() * 4 + hidden.as_ref().map_or(0, |h| h.len() * 4);
        if bytes > self.cfg.budget_bytes {
            return false;
        }
        while self.bytes + bytes > self.cfg.budget_bytes {
            self.evict_lru();
        }
        self.bytes += bytes;
        self.entries.push(Entry { tokens: tokens.to_vec(), snap: Arc::new(snap), hidden, bytes, last_use: self.tick });
        self.stats.inserted += 1;
        true
    }

    /// Snapshot `st`, the state after `tokens` (e.g. at the end of a turn). Layers a
    /// resident backend holds are copied from it (they stay there); a failed copy
    /// inserts nothing.
    pub fn insert_state(&mut self, tokens: &[u32], st: &SeqState) -> bool {
        self.insert_state_with(tokens, st, None)
    }

    /// The entry that holds the state after `tokens`, if any.
    fn held(&self, tokens: &[u32]) -> Option<usize> {
        self.entries.iter().position(|e| e.tokens == tokens)
    }

    /// Whether a new entry for held entry `i`'s tokens replaces it: only one with hidden
    /// rows (`hidden`) where the held entry has none.
    fn takes(&self, i: usize, hidden: bool) -> bool {
        hidden && self.entries[i].hidden.is_none()
    }

    /// [`PrefixCache::insert_state`] with every token's hidden row (`n_embd` floats per
    /// token of `tokens`, in order).
    pub fn insert_state_with(&mut self, tokens: &[u32], st: &SeqState, hidden: Option<&[f32]>) -> bool {
        // (the rule `insert_with` applies, checked before the snapshot is taken)
        let refused = self.held(tokens).is_some_and(|i| !self.takes(i, hidden.is_some()));
        if st.pos != tokens.len() || self.cfg.budget_bytes == 0 || refused {
            return false;
        }
        match st.snapshot() {
            Ok(snap) => self.insert_with(tokens, snap, hidden.map(Arc::from)),
            Err(_) => false,
        }
    }

    fn evict_lru(&mut self) {
        if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_use) {
            let e = self.entries.swap_remove(i);
            self.bytes -= e.bytes;
            self.stats.evicted += 1;
        }
    }

    /// Prefill `tokens` as a whole new sequence into `st` (its previous content is
    /// discarded): restore the longest cached prefix, evaluate the rest in segments that
    /// end at multiples of `interval` (snapshotting each boundary), and snapshot the end
    /// when `snapshot_end`. Returns the last token's logits.
    pub fn prefill(&mut self, runner: &Runner, st: &mut SeqState, tokens: &[u32]) -> Result<Prefill, RunError> {
        let reused = self.begin(runner, st, tokens)?;
        let (mut p, mut logits) = (reused, Vec::new());
        while p < tokens.len() {
            let next = self.next_cut(runner, tokens, p);
            let l = runner.forward(st, &tokens[p..next], false)?;
            p = next;
            if p == tokens.len() {
                logits = l.last().to_vec();
            }
            self.passed(tokens, st);
        }
        Ok(Prefill { logits, reused })
    }

    /// [`PrefixCache::prefill`] for a sequence whose drafter reads every token's hidden
    /// row (crate::spec::mtp): restores only a cached prefix that holds its rows,
    /// evaluates the rest keeping theirs, and snapshots the end with all of them (with
    /// `snapshot_end`). Returns the prefill and every token's hidden row.
    pub fn prefill_hidden(&mut self, runner: &Runner, st: &mut SeqState, tokens: &[u32]) -> Result<(Prefill, Vec<f32>), RunError> {
        let (p, rows) = self.begin_with(runner, st, tokens, true)?;
        let mut rows = rows.map_or_else(Vec::new, |h| h.to_vec());
        let mut new = Vec::new();
        let l = runner.forward_hidden(st, &tokens[p..], false, &mut new)?;
        rows.extend_from_slice(&new);
        if self.cfg.snapshot_end {
            self.insert_state_with(tokens, st, Some(&rows));
        }
        Ok((Prefill { logits: l.last().to_vec(), reused: p }, rows))
    }

    /// The first part of [`PrefixCache::prefill`], for a caller that evaluates the rest
    /// itself (`pn batch` feeds it in chunks of mixed passes, crate::slots): restores
    /// the longest usable cached prefix of `tokens` into `st` (else resets it) and
    /// returns its length. The caller then evaluates up to [`PrefixCache::next_cut`] (in
    /// any chunks: with the default recurrent delta rule a chunk's rows do not depend on
    /// how a pass is cut) and calls [`PrefixCache::passed`] after each pass.
    pub fn begin(&mut self, runner: &Runner, st: &mut SeqState, tokens: &[u32]) -> Result<usize, RunError> {
        self.begin_with(runner, st, tokens, false).map(|(p, _)| p)
    }

    /// [`PrefixCache::begin`], with `hidden` (an MTP drafter's prefill) only from an
    /// entry that holds every token's hidden row, and those rows.
    fn begin_with(&mut self, runner: &Runner, st: &mut SeqState, tokens: &[u32], hidden: bool) -> Result<(usize, HiddenRows), RunError> {
        if tokens.is_empty() {
            return Err(RunError::Empty);
        }
        let cut = self.cuts(runner, tokens.len());
        let iv = self.cfg.interval;
        Ok(self.restore_prefix(st, tokens, |n| !(iv > 0 && n.is_multiple_of(iv)) || cut(n), hidden))
    }

    /// The longest cached proper prefix of `tokens` whose length passes `ok` (where the
    /// caller's prefill may end a pass) restored into `st`, else `st` reset; counted as
    /// a hit or a miss. With `hidden`, only an entry that holds every token's hidden
    /// row, and those rows. Returns the prefix length (0: a miss).
    pub fn restore_prefix(&mut self, st: &mut SeqState, tokens: &[u32], ok: impl Fn(usize) -> bool, hidden: bool) -> (usize, HiddenRows) {
        let hit = if self.cfg.budget_bytes > 0 { self.find(tokens, ok, hidden) } else { None };
        // restore drops a resident backend's copies (the next pass uploads); reset
        // resets them in place where the backend can
        let (p, rows) = match hit {
            Some((n, snap, h)) if st.restore(&snap).is_ok() => (n, h),
            _ => (0, None),
        };
        if p == 0 {
            st.reset();
            self.stats.misses += 1;
        } else {
            self.stats.hits += 1;
            self.stats.reused_tokens += p as u64;
        }
        (p, rows)
    }

    /// Whether the prefill of a prompt of `end` tokens cuts a pass at position `b`
    /// (0 < b < end): a multiple of `ubatch`, or of `interval` leaving ≥ MIN_TAIL tokens.
    fn cuts(&self, runner: &Runner, end: usize) -> impl Fn(usize) -> bool {
        let (iv, ub) = (self.cfg.interval, runner.ubatch.max(1));
        move |b: usize| b.is_multiple_of(ub) || (iv > 0 && b.is_multiple_of(iv) && end - b >= MIN_TAIL)
    }

    /// Where the pass of a prefill at position `p` of `tokens` ends: the next cut, or
    /// the end.
    pub fn next_cut(&self, runner: &Runner, tokens: &[u32], p: usize) -> usize {
        let cut = self.cuts(runner, tokens.len());
        (p + 1..tokens.len()).find(|&b| cut(b)).unwrap_or(tokens.len())
    }

    /// After a prefill pass that left `st` at `st.pos` tokens of `tokens`: snapshots it
    /// when that is an interval boundary (or the end, with `snapshot_end`).
    pub fn passed(&mut self, tokens: &[u32], st: &SeqState) {
        let (p, iv) = (st.pos, self.cfg.interval);
        let on_iv = iv > 0 && p.is_multiple_of(iv);
        if self.cfg.budget_bytes > 0 && p <= tokens.len() && (on_iv || (p == tokens.len() && self.cfg.snapshot_end)) {
            self.insert_state(&tokens[..p], st);
        }
    }
}
