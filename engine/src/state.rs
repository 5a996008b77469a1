//! Per-sequence state: layer states (KV caches, conv + delta-rule states) and position,
//! with snapshots (the basis of prefix caching and speculative-decoding rollback).
//!
//! A layer's authoritative copy is on the host or on one resident backend
//! ([`resident`]): readers here take a copy from the owner, writers bring it home first.

pub mod kv;
pub mod resident;

pub use resident::MoveError;

use pn_ops::{KvType, LayerSnapshot, LayerState, Overflow};
use thiserror::Error;

/// The state of one sequence. A fresh sequence has zero recurrent state, an empty KV
/// cache and position 0 (spec §10.21). `Clone` forks it (a new [`SeqState::id`]);
/// equality compares positions and the authoritative layer contents.
pub struct SeqState {
    /// Number of tokens processed so far (the next token's position).
    pub pos: usize,
    /// KV capacity in positions.
    pub max_seq: usize,
    /// Host copies of the layer states (stale while a resident backend owns one; see
    /// [`SeqState::layers`]).
    layers: Vec<LayerState>,
    /// What a position ≥ max_seq does: an error (default) or ring (sliding window).
    pub overflow: Overflow,
    /// Which layers a resident backend owns (none: all on the host).
    res: resident::Residency,
}

/// A copy of a sequence's state: position, every recurrent state, and only the KV cells
/// written so far (`min(pos, max_seq)` per head), not all `max_seq`.
#[derive(Clone, Debug, PartialEq)]
pub struct StateSnapshot {
    pub pos: usize,
    pub max_seq: usize,
    pub overflow: Overflow,
    pub layers: Vec<LayerSnapshot>,
}

impl StateSnapshot {
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerSnapshot::bytes).sum()
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SnapshotError {
    #[error("snapshot of a sequence with {theirs} layers / max_seq {their_max} does not fit this one ({ours} layers, max_seq {our_max})")]
    Geometry { theirs: usize, ours: usize, their_max: usize, our_max: usize },
    #[error("snapshot layer {layer}: {msg}")]
    Layer { layer: usize, msg: String },
    #[error(transparent)]
    Move(#[from] MoveError),
}

impl SeqState {
    pub fn new(layers: Vec<LayerState>, max_seq: usize) -> SeqState {
        SeqState { pos: 0, max_seq, layers, overflow: Overflow::Error, res: resident::Residency::new() }
    }
    /// A state without layers: a slot's row while it is free, or what a row's content
    /// is moved into when its sequence leaves the slot ([`SeqState::take_content`]).
    pub(crate) fn empty() -> SeqState {
        SeqState::new(Vec::new(), 0)
    }
    /// Back to a fresh sequence (overflow mode and KV format are kept). A device-owned
    /// layer is reset in place where its backend can ([`crate::backend::StateOp::Reset`]:
    /// no host round trip, it stays there); otherwise its device copy is dropped, not
    /// read, and the host's fresh state is uploaded by the next pass.
    pub fn reset(&mut self) {
        self.pos = 0;
        let on_device = self.reset_device_copies();
        for (l, st) in self.layers.iter_mut().enumerate() {
            if !on_device.get(l).copied().unwrap_or(false) {
                st.reset();
            }
        }
    }
    /// Number of layer states.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
    /// The layer states, brought home first (a resident backend's copies move to the
    /// host, which owns them until the next pass).
    pub fn layers(&mut self) -> Result<&[LayerState], MoveError> {
        self.sync()?;
        Ok(&self.layers)
    }
    /// The host layer copies, for a host-memory die's ops (the runner brought that
    /// die's layers home; the others' copies are stale and not touched there).
    pub(crate) fn host_layers(&mut self) -> &mut [LayerState] {
        &mut self.layers
    }
    /// Like [`SeqState::layers`], to modify them.
    pub fn layers_mut(&mut self) -> Result<&mut [LayerState], MoveError> {
        self.sync()?;
        Ok(&mut self.layers)
    }
    /// Bytes of all layer states (KV cells + shadows + recurrent states; shapes only,
    /// which the host copies keep while a backend owns the contents).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::bytes).sum()
    }
    /// Bytes of the KV caches alone.
    pub fn kv_bytes(&self) -> usize {
        self.layers.iter().filter(|l| matches!(l, LayerState::Kv(_))).map(LayerState::bytes).sum()
    }
    /// The KV format of the first attention layer (all share one), if any.
    pub fn kv_type(&self) -> Option<KvType> {
        self.layers.iter().find_map(|l| match l {
            LayerState::Kv(k) => Some(k.ty),
            _ => None,
        })
    }
    /// Select the overflow behaviour (on the sequence and every KV cache). A resident KV
    /// layer whose mode changes is brought home first.
    pub fn set_overflow(&mut self, o: Overflow) -> Result<(), MoveError> {
        let ring = o == Overflow::Ring;
        for i in 0..self.layers.len() {
            if matches!(&self.layers[i], LayerState::Kv(k) if k.ring != ring) {
                self.bring_home(i, None)?;
                if let LayerState::Kv(k) = &mut self.layers[i] {
                    k.ring = ring;
                }
            }
        }
        self.overflow = o;
        Ok(())
    }
    /// Whether `n` more tokens can be evaluated (always, in ring mode).
    pub fn fits(&self, n: usize) -> bool {
        self.overflow == Overflow::Ring || self.pos + n <= self.max_seq
    }
    /// Copy of the state; costs the used cells, not `max_seq`. A layer a resident
    /// backend owns is copied from it (it stays there).
    /// Only the snapshot's part of a device-owned layer crosses to the host where its
    /// backend can ([`crate::backend::StateOp::Snapshot`]), else the whole layer.
    pub fn snapshot(&self) -> Result<StateSnapshot, MoveError> {
        let layers = (0..self.layers.len()).map(|i| self.layer_snapshot(i)).collect::<Result<_, MoveError>>()?;
        Ok(StateSnapshot { pos: self.pos, max_seq: self.max_seq, overflow: self.overflow, layers })
    }
    /// Put a snapshot of this sequence (or of one with the same geometry and KV format)
    /// back: evaluation continues exactly as it did after the snapshot was taken.
    pub fn restore(&mut self, s: &StateSnapshot) -> Result<(), SnapshotError> {
        if s.layers.len() != self.layers.len() || s.max_seq != self.max_seq {
            return Err(SnapshotError::Geometry { theirs: s.layers.len(), ours: self.layers.len(), their_max: s.max_seq, our_max: self.max_seq });
        }
        // check every layer first so a failed restore leaves the state untouched
        if let Some(i) = self.layers.iter().zip(&s.layers).position(|(l, ls)| !l.accepts(ls)) {
            return Err(SnapshotError::Layer { layer: i, msg: "snapshot of another layer kind, geometry or KV format".into() });
        }
        // the snapshot overwrites what a later query reads: device copies are dropped,
        // the host layers cleared (no stale or poisoned cell survives) and restored
        if self.res.any() {
            self.drop_device_copies();
            self.layers.iter_mut().for_each(LayerState::reset);
        }
        for (i, (l, ls)) in self.layers.iter_mut().zip(&s.layers).enumerate() {
            l.restore(ls).map_err(|msg| SnapshotError::Layer { layer: i, msg })?;
        }
        self.pos = s.pos;
        self.set_overflow(s.overflow)?;
        Ok(())
    }
}
