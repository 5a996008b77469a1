//! Decode slots: up to `PN_MAX_SLOTS` (default 16) sequences stepped in ONE forward pass
//! (docs/serving.md).
//!
//! A step of K slots runs the graph of geometry "K tokens, all logits" (cached like any
//! other): every matmul streams its weights once for the K tokens and the MoE groups the
//! K tokens by expert; each stateful op (those with [`Op::state`]: Attention,
//! Conv1dCausal, DeltaRule) runs ONCE for all sequences ([`crate::HostKernels::kernel_seqs`] on the CPU:
//! a sequence table of each one's tokens on the token axis, and each one's layer state;
//! the CPU runs one parallel loop over the (sequence, head) rows of all of them).
//! Positions are per token, each sequence's own, and every row is bitwise what the
//! sequence gives alone (tests/tests/slots.rs). [`Slots::step_mixed`] adds prefill
//! chunks of other sequences to a step.
//!
//! Each slot owns a row: a `SeqState` whose id, and so the layer states a device backend
//! keeps under it, stays with the slot for the table's life (the per-layer state pool, a
//! row per slot). Binding moves a sequence's content into its slot's row, unbinding
//! moves it out into a new state, moving or compacting copies row to row: on the host
//! each is a move of the layer buffers, on a device a copy into the row's own copies in
//! place (`SeqState::take_content`), never through the host. So a step of the same
//! slots runs on the same device states whichever sequences they hold, and a device
//! replays one captured step across requests that come and go
//! (`slot_rows_keep_their_device_states_across_rebinding`, tests/tests/resident_state.rs).
//! A [`SlotHandle`] names a binding: it carries
//! the slot table's generation (bumped by [`Slots::resize`]) and a binding serial, so a
//! handle used after an unbind, a move or a resize is an error, never another sequence.

use crate::model::Model;
use crate::runner::{Logits, Observer, RunError, Runner, Taps};
use crate::state::kv::{state_bytes, StateConfig};
use crate::state::SeqState;
#[cfg(doc)]
use pn_ops::Op;
use thiserror::Error;

/// Default and largest slot counts.
pub const DEFAULT_MAX_SLOTS: usize = 16;
pub const MAX_SLOTS: usize = 256;

/// A bound sequence: slot index, slot-table generation, binding serial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotHandle {
    slot: u32,
    generation: u32,
    binding: u64,
}

impl SlotHandle {
    pub fn slot(&self) -> usize {
        self.slot as usize
    }
    pub fn generation(&self) -> u32 {
        self.generation
    }
}

#[derive(Debug, Error)]
pub enum SlotError {
    #[error("stale slot handle: slot {slot} of generation {theirs}, but the slot count changed (generation {ours}): rebind the sequence")]
    StaleGeneration { slot: usize, theirs: u32, ours: u32 },
    #[error("stale slot handle: slot {slot} no longer holds that sequence (unbound or moved)")]
    Unbound { slot: usize },
    #[error("slot {slot} is out of range: there are {n} slots")]
    OutOfRange { slot: usize, n: usize },
    #[error("all {n} slots are bound: unbind one first")]
    Full { n: usize },
    #[error("slot {slot} is already bound")]
    Occupied { slot: usize },
    #[error("slot {slot} appears twice in one step")]
    Duplicate { slot: usize },
    #[error("slot {slot} is in the step in flight: poll it first")]
    Busy { slot: usize },
    #[error("a step is already in flight: poll it first")]
    InFlight,
    #[error("no step in flight")]
    NothingInFlight,
    #[error("no slots to step")]
    EmptyStep,
    #[error("a mixed pass of {decode} decode tokens and {chunk} prefill tokens exceeds the {max} tokens of a pass (ubatch): use shorter chunks")]
    ChunkTooLong { decode: usize, chunk: usize, max: usize },
    #[error("{0}")]
    Memory(String),
    #[error("step worker: {0}")]
    Worker(String),
    #[error(transparent)]
    Run(#[from] RunError),
}

pub(crate) struct Slot {
    /// The slot's row: a state whose id (so its device copies) stays with the slot for the
    /// table's life; a bound sequence's content lives in it (no layers while free). Out
    /// of the table only while a step runs on it.
    pub(crate) state: Option<SeqState>,
    /// Serial of the binding in this slot (0: free).
    pub(crate) binding: u64,
    /// Part of the step in flight (its state is with the worker).
    pub(crate) busy: bool,
}

/// The slot table. Stepping: [`Slots::step`], or [`Slots::step_begin`] /
/// [`Slots::step_poll`] (crate::async_step).
pub struct Slots {
    pub(crate) slots: Vec<Slot>,
    generation: u32,
    next_binding: u64,
    pub(crate) inflight: Option<crate::async_step::InFlight>,
    pub(crate) worker: Option<crate::async_step::Worker>,
}

fn new_table(n: usize) -> Vec<Slot> {
    (0..n).map(|_| Slot { state: Some(SeqState::empty()), binding: 0, busy: false }).collect()
}

impl Slots {
    /// `n` free slots (1..=MAX_SLOTS).
    pub fn new(n: usize) -> Slots {
        let n = n.clamp(1, MAX_SLOTS);
        Slots { slots: new_table(n), generation: 1, next_binding: 1, inflight: None, worker: None }
    }
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }
    pub fn generation(&self) -> u32 {
        self.generation
    }
    /// Bound slots (including those in a step in flight).
    pub fn n_bound(&self) -> usize {
        self.slots.iter().filter(|s| s.binding != 0).count()
    }
    /// The lowest free slot.
    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.binding == 0)
    }
    /// Handles of every bound slot, in slot order.
    pub fn bound(&self) -> Vec<SlotHandle> {
        (0..self.slots.len()).filter_map(|i| self.handle(i)).collect()
    }
    fn handle(&self, i: usize) -> Option<SlotHandle> {
        let s = &self.slots[i];
        (s.binding != 0).then_some(SlotHandle { slot: i as u32, generation: self.generation, binding: s.binding })
    }

    /// The slot index of a live handle, or why it is not one.
    pub(crate) fn check(&self, h: SlotHandle) -> Result<usize, SlotError> {
        let slot = h.slot();
        if h.generation != self.generation {
            return Err(SlotError::StaleGeneration { slot, theirs: h.generation, ours: self.generation });
        }
        let s = self.slots.get(slot).ok_or(SlotError::OutOfRange { slot, n: self.slots.len() })?;
        if s.binding != h.binding || s.binding == 0 {
            return Err(SlotError::Unbound { slot });
        }
        if s.busy {
            return Err(SlotError::Busy { slot });
        }
        Ok(slot)
    }

    /// Bind a (prefilled) sequence to the lowest free slot: its content moves into the
    /// slot's row (on the host a move; a device copies it into the row's own copies, in
    /// place: the row keeps its device addresses), where it stays until unbind.
    pub fn bind(&mut self, st: SeqState) -> Result<SlotHandle, SlotError> {
        self.try_bind(st).map_err(|(e, _)| e)
    }
    /// Bind to slot `slot`, which must be free.
    pub fn bind_at(&mut self, slot: usize, st: SeqState) -> Result<SlotHandle, SlotError> {
        self.try_bind_at(slot, st).map_err(|(e, _)| e)
    }
    /// [`Slots::bind`], handing the sequence back with the error when it cannot be bound
    /// (no free slot, or its content could not move into the row): a prefilled sequence
    /// is not lost, it can be bound again once a slot frees.
    // the state rides back in the error so a caller loses nothing (a rare path: boxing
    // it would cost every caller an allocation to read)
    #[allow(clippy::result_large_err)]
    pub fn try_bind(&mut self, st: SeqState) -> Result<SlotHandle, (SlotError, SeqState)> {
        match self.free_slot() {
            Some(slot) => self.try_bind_at(slot, st),
            None => Err((SlotError::Full { n: self.slots.len() }, st)),
        }
    }
    /// [`Slots::bind_at`], handing the sequence back with the error. After a failed move
    /// its host layers hold what they held (a layer a device took in part holds what the
    /// device left in it: its content on a real device).
    #[allow(clippy::result_large_err)]
    pub fn try_bind_at(&mut self, slot: usize, mut st: SeqState) -> Result<SlotHandle, (SlotError, SeqState)> {
        let n = self.slots.len();
        let Some(s) = self.slots.get_mut(slot) else { return Err((SlotError::OutOfRange { slot, n }, st)) };
        if s.binding != 0 {
            return Err((SlotError::Occupied { slot }, st));
        }
        match s.state.as_mut().expect("a free slot holds its row").take_content(&mut st, true) {
            Ok(()) => Ok(self.new_binding(slot)),
            Err(e) => Err((RunError::from(e).into(), st)),
        }
    }
    /// Marks `slot` bound under a new serial; its handle.
    fn new_binding(&mut self, slot: usize) -> SlotHandle {
        self.slots[slot].binding = self.next_binding;
        self.next_binding += 1;
        self.handle(slot).expect("just bound")
    }
    /// Free the slot and hand its sequence back (the handle becomes stale): the row's
    /// content moves into a new state (a device copies it there; the row keeps its own).
    pub fn unbind(&mut self, h: SlotHandle) -> Result<SeqState, SlotError> {
        let i = self.check(h)?;
        let mut out = SeqState::empty();
        out.take_content(self.row_mut(i), false).map_err(RunError::from)?;
        self.slots[i].binding = 0;
        Ok(out)
    }
    fn row_mut(&mut self, i: usize) -> &mut SeqState {
        self.slots[i].state.as_mut().expect("a slot holds its row unless a step runs on it")
    }
    pub fn state(&self, h: SlotHandle) -> Result<&SeqState, SlotError> {
        let i = self.check(h)?;
        Ok(self.slots[i].state.as_ref().expect("a bound slot holds its state"))
    }
    pub fn state_mut(&mut self, h: SlotHandle) -> Result<&mut SeqState, SlotError> {
        let i = self.check(h)?;
        Ok(self.slots[i].state.as_mut().expect("a bound slot holds its state"))
    }
    /// Move a sequence to the free slot `dst`: a row copy (on the host a move; a device
    /// copies it between the rows' own copies, nothing goes through the host). Returns
    /// the new handle; the old one becomes stale.
    pub fn move_to(&mut self, h: SlotHandle, dst: usize) -> Result<SlotHandle, SlotError> {
        let i = self.check(h)?;
        if dst == i {
            return Ok(h);
        }
        if self.slots.get(dst).ok_or(SlotError::OutOfRange { slot: dst, n: self.slots.len() })?.binding != 0 {
            return Err(SlotError::Occupied { slot: dst });
        }
        let mut from = self.slots[i].state.take().expect("checked: not in a step");
        let moved = self.row_mut(dst).take_content(&mut from, false);
        self.slots[i].state = Some(from);
        moved.map_err(RunError::from)?;
        self.slots[i].binding = 0;
        Ok(self.new_binding(dst))
    }
    /// Copy a sequence's state into the free slot `dst` (a fork: both continue
    /// independently from the same point; a device backend copies its layers on the
    /// device where it can, `SeqState::try_clone`).
    pub fn copy_to(&mut self, h: SlotHandle, dst: usize) -> Result<SlotHandle, SlotError> {
        let st = self.state(h)?.try_clone().map_err(RunError::from)?;
        self.bind_at(dst, st)
    }
    /// Move every bound sequence to the lowest slots, keeping their order. Returns
    /// (old handle, new handle) for each sequence that moved.
    pub fn compact(&mut self) -> Result<Vec<(SlotHandle, SlotHandle)>, SlotError> {
        if self.inflight.is_some() {
            return Err(SlotError::InFlight);
        }
        let mut moved = Vec::new();
        for h in self.bound() {
            let dst = self.free_slot().expect("a bound slot exists, so does a free one below or at it");
            if dst < h.slot() {
                moved.push((h, self.move_to(h, dst)?));
            }
        }
        Ok(moved)
    }
    /// Change the slot count. Every binding is invalidated (the generation changes, old
    /// handles are errors); the bound sequences are handed back in slot order to rebind.
    /// On an error (a device copy failed) the table stays as it was.
    pub fn resize(&mut self, n: usize) -> Result<Vec<SeqState>, SlotError> {
        if self.inflight.is_some() {
            return Err(SlotError::InFlight);
        }
        let mut out = Vec::new();
        for h in self.bound() {
            match self.unbind(h) {
                Ok(st) => out.push((h, st)),
                Err(e) => {
                    // back into their rows under their old bindings: nothing lost, every
                    // handle still good, the table as it was
                    for (h, st) in out {
                        if self.bind_at(h.slot(), st).is_ok() {
                            self.slots[h.slot()].binding = h.binding;
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.slots = new_table(n.clamp(1, MAX_SLOTS));
        self.generation = self.generation.wrapping_add(1).max(1);
        Ok(out.into_iter().map(|(_, st)| st).collect())
    }

    /// Take the states of a step's slots (checked: live, distinct) out of the table.
    pub(crate) fn take_batch(&mut self, batch: &[(SlotHandle, u32)]) -> Result<(Vec<usize>, Vec<SeqState>), SlotError> {
        if batch.is_empty() {
            return Err(SlotError::EmptyStep);
        }
        let mut idx = Vec::with_capacity(batch.len());
        for (h, _) in batch {
            let i = self.check(*h)?;
            if idx.contains(&i) {
                return Err(SlotError::Duplicate { slot: i });
            }
            idx.push(i);
        }
        let states = idx.iter().map(|&i| self.slots[i].state.take().expect("checked")).collect();
        Ok((idx, states))
    }
    pub(crate) fn put_back(&mut self, idx: &[usize], states: Vec<SeqState>) {
        for (&i, st) in idx.iter().zip(states) {
            self.slots[i].state = Some(st);
            self.slots[i].busy = false;
        }
    }

    /// One decode step: `batch[i]` = (slot, its next token). Returns one logits row per
    /// entry, in `batch` order; each slot's position advances by one.
    pub fn step(&mut self, runner: &Runner, batch: &[(SlotHandle, u32)]) -> Result<Logits, SlotError> {
        let (idx, mut states) = self.take_batch(batch)?;
        let res = run_step(runner, &mut states, batch);
        self.put_back(&idx, states);
        Ok(res?)
    }
}

impl Slots {
    /// A mixed pass: the decode step of `batch` (as [`Slots::step`]; may be empty) and
    /// prefill chunks of sequences not in a slot, `chunks[j]` = (its state, its next
    /// tokens), in ONE forward pass (chunked prefill interleaved with decode: the slots
    /// keep streaming while new prompts come in, and the weights stream once for all).
    /// Bounded: batch + chunk tokens ≤ the runner's `ubatch`. Returns one row per batch
    /// entry, then one per chunk (the logits after its last token; the head runs for
    /// those rows only, [`Runner::forward_multi_last`]). Every row is bitwise what the
    /// sequence gives alone (tests/tests/slots.rs).
    pub fn step_mixed(&mut self, runner: &Runner, batch: &[(SlotHandle, u32)], chunks: &mut [(&mut SeqState, &[u32])]) -> Result<Logits, SlotError> {
        let max = runner.ubatch.max(1);
        let chunk: usize = chunks.iter().map(|c| c.1.len()).sum();
        if batch.len() + chunk > max {
            return Err(SlotError::ChunkTooLong { decode: batch.len(), chunk, max });
        }
        if batch.is_empty() {
            return Ok(runner.forward_multi_last(chunks)?);
        }
        let (idx, mut states) = self.take_batch(batch)?;
        let toks: Vec<[u32; 1]> = batch.iter().map(|&(_, t)| [t]).collect();
        let mut parts: Vec<(&mut SeqState, &[u32])> = states.iter_mut().zip(&toks).map(|(s, t)| (s, &t[..])).collect();
        parts.extend(chunks.iter_mut().map(|(s, t)| (&mut **s, *t)));
        let res = runner.forward_multi_last(&mut parts);
        drop(parts);
        self.put_back(&idx, states);
        Ok(res?)
    }
}

/// The forward pass of a step over taken-out states.
pub(crate) fn run_step(runner: &Runner, states: &mut [SeqState], batch: &[(SlotHandle, u32)]) -> Result<Logits, RunError> {
    let toks: Vec<[u32; 1]> = batch.iter().map(|&(_, t)| [t]).collect();
    let mut parts: Vec<(&mut SeqState, &[u32])> = states.iter_mut().zip(&toks).map(|(s, t)| (s, &t[..])).collect();
    runner.forward_multi(&mut parts)
}

impl Runner {
    /// Several sequences in ONE forward pass: `parts[i]` is a sequence's state and its
    /// new tokens (appended at its own positions). Returns every token's logits row,
    /// sequence after sequence. The graph is the one of geometry `Σ tokens` with all
    /// logits (cached per geometry), so weights stream once and the MoE groups all tokens
    /// by expert; each stateful op runs for all the sequences in one backend call
    /// ([`crate::HostKernels::kernel_seqs`] on the CPU, a table of each one's tokens, its own state).
    /// Batch-invariant: a row is bitwise what [`Runner::forward`]
    /// gives for that sequence alone. No ubatch split: one pass holds all the tokens.
    pub fn forward_multi(&self, parts: &mut [(&mut SeqState, &[u32])]) -> Result<Logits, RunError> {
        self.forward_multi_observed(parts, None)
    }

    /// [`Runner::forward_multi`] with an observer that sees every evaluated node's value.
    pub fn forward_multi_observed(&self, parts: &mut [(&mut SeqState, &[u32])], observer: Option<Observer<'_>>) -> Result<Logits, RunError> {
        self.forward_multi_with(parts, Taps::observer(observer))
    }

    /// [`Runner::forward_multi`] handing out `taps` (e.g. every row's hidden state).
    pub fn forward_multi_with(&self, parts: &mut [(&mut SeqState, &[u32])], taps: Taps<'_>) -> Result<Logits, RunError> {
        self.multi(parts, true, taps)
    }

    /// [`Runner::forward_multi`] returning only each sequence's last row (the logits after
    /// it; the pass's LM head runs for those rows alone): one row per part, in order,
    /// bitwise the matching rows of `forward_multi`. What a prefill of several prompts
    /// needs: with a real vocabulary (~250k entries) the head costs about a fifth of a
    /// token's work and writes 1 MB of logits per row.
    pub fn forward_multi_last(&self, parts: &mut [(&mut SeqState, &[u32])]) -> Result<Logits, RunError> {
        self.multi(parts, false, Taps::observer(None))
    }

    pub(crate) fn multi(&self, parts: &mut [(&mut SeqState, &[u32])], all_logits: bool, mut taps: Taps<'_>) -> Result<Logits, RunError> {
        let n_vocab = self.model().n_vocab();
        if parts.is_empty() {
            return Err(RunError::Empty);
        }
        let mut lens = Vec::with_capacity(parts.len());
        for (st, t) in parts.iter() {
            if t.is_empty() {
                return Err(RunError::Empty);
            }
            if let Some(&id) = t.iter().find(|&&x| x as usize >= n_vocab) {
                return Err(RunError::BadToken { id, n_vocab });
            }
            if !st.fits(t.len()) {
                return Err(RunError::ContextFull { have: st.pos, adding: t.len(), max_seq: st.max_seq });
            }
            lens.push(t.len());
        }
        // lanes hand out logits and hidden rows (an observer sees one pass)
        if let Some(lanes) = self.lanes.as_ref().filter(|_| parts.len() > 1 && taps.observer.is_none()) {
            return self.multi_lanes(lanes, parts, &lens, all_logits, taps.hidden);
        }
        let tokens: Vec<u32> = parts.iter().flat_map(|(_, t)| t.iter().copied()).collect();
        let mut seqs: Vec<&mut SeqState> = parts.iter_mut().map(|(s, _)| &mut **s).collect();
        let t = self.eval(&mut seqs, &lens, &tokens, all_logits, &mut taps)?;
        Ok(Logits { n_vocab, data: t.into_f32() })
    }
}

/// `PN_MAX_SLOTS` (default 16), or `flag` when given; 1..=MAX_SLOTS.
pub fn resolve_max_slots(flag: Option<usize>) -> Result<usize, String> {
    let (n, src) = match flag {
        Some(n) => (n, "--slots"),
        None => match std::env::var("PN_MAX_SLOTS").ok().filter(|s| !s.trim().is_empty()) {
            Some(s) => (s.trim().parse().map_err(|_| format!("PN_MAX_SLOTS: expected a slot count, found {s:?}"))?, "PN_MAX_SLOTS"),
            None => (DEFAULT_MAX_SLOTS, "default"),
        },
    };
    if n == 0 || n > MAX_SLOTS {
        return Err(format!("{src}: expected 1..={MAX_SLOTS} slots, found {n}"));
    }
    Ok(n)
}

/// The memory ladder for slots: `want` slots if `want` sequence states of `cfg` plus
/// `reserve` bytes fit in `avail` (MemAvailable), else halve (16 → 8 → 4 → 2 → 1) with a
/// note saying so; an error with the numbers if even one does not fit. `avail` None:
/// no check.
pub fn slot_ladder(model: &dyn Model, cfg: &StateConfig, want: usize, reserve: u64, avail: Option<u64>) -> Result<(usize, Option<String>), SlotError> {
    let per = state_bytes(model, cfg.max_seq, cfg.kv).total();
    let Some(avail) = avail else { return Ok((want, None)) };
    let mut n = want.max(1);
    while n > 1 && (n as u64) * per + reserve > avail {
        n /= 2;
    }
    if per + reserve > avail {
        return Err(SlotError::Memory(format!(
            "not enough memory for one decode slot: a sequence state of max_seq {} with {} KV needs {per} bytes (+ {reserve} reserved) but {avail} bytes are available (lower --max-seq or use --kv-type q4_0)",
            cfg.max_seq, cfg.kv
        )));
    }
    let note = (n < want).then(|| {
        format!("note: {want} decode slots need {} bytes of sequence state ({per} each) but {avail} bytes are available: using {n} slots", want as u64 * per + reserve)
    });
    Ok((n, note))
}
