//! Layer-state residency: one owner per layer, explicit moves.
//!
//! Every [`SeqState`] has a process-unique id. Each layer is owned by the host (its
//! `LayerState` in the sequence is current) or by one device backend, which keeps its
//! copy under [`StateKey`] `{ seq: id, layer }`; the host copy is then stale (keeps its
//! shape; a test backend fills it with NaN). Moves:
//! - the runner places each layer on the backend of the die whose ops use it before a
//!   pass (`SeqState::place`: upload; from another backend: home first);
//! - host readers (snapshot, clone, `==`) copy from the owner without moving it (a
//!   snapshot only the part it holds, where the owner can: [`StateOp::Snapshot`]);
//! - host writers bring the layer home ([`SeqState::sync`], `layers_mut`, `set_overflow`)
//!   or drop the device copy when they overwrite everything (`restore`; `reset` resets
//!   it in place where the owner can, [`StateOp::Reset`]);
//! - dropping the state releases its device copies.
//!
//! Moving a `SeqState` value (slots bind / unbind / move / compact / resize, the async
//! step worker) moves no data: the key travels with it.

use super::SeqState;
use crate::backend::{Backend, StateKey, StateOp, StateReply};
use crate::planner::debug::Counters;
use pn_ops::{LayerSnapshot, LayerState, OpError};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A layer-state move between the host and a device backend failed.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("layer state {layer}: {action} on backend {backend}: {msg}")]
pub struct MoveError {
    pub layer: usize,
    pub action: &'static str,
    pub backend: String,
    pub msg: String,
}

fn move_err(layer: usize, action: &'static str, b: &dyn Backend, e: OpError) -> MoveError {
    MoveError { layer, action, backend: b.name().to_string(), msg: e.to_string() }
}

fn same(a: &Arc<dyn Backend>, b: &Arc<dyn Backend>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

pub(crate) struct Residency {
    id: u64,
    /// Backends owning some layer (one per resident die in practice).
    owners: Vec<Arc<dyn Backend>>,
    /// Per layer: 0 = host, i + 1 = `owners[i]`. Empty while the host owns every layer
    /// (a host-only sequence never allocates here).
    at: Vec<u8>,
}

impl Residency {
    pub fn new() -> Residency {
        Residency { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), owners: Vec::new(), at: Vec::new() }
    }
    pub fn any(&self) -> bool {
        self.at.iter().any(|&a| a != 0)
    }
    fn owner(&self, l: usize) -> Option<&Arc<dyn Backend>> {
        match self.at.get(l) {
            Some(&a) if a != 0 => Some(&self.owners[a as usize - 1]),
            _ => None,
        }
    }
    fn set(&mut self, l: usize, n_layers: usize, b: Option<&Arc<dyn Backend>>) {
        let Some(b) = b else {
            if let Some(a) = self.at.get_mut(l) {
                *a = 0;
            }
            return;
        };
        let i = match self.owners.iter().position(|o| same(o, b)) {
            Some(i) => i,
            None => {
                self.owners.push(b.clone());
                self.owners.len() - 1
            }
        };
        if self.at.len() < n_layers {
            self.at.resize(n_layers, 0);
        }
        self.at[l] = u8::try_from(i + 1).expect("fewer than 255 device backends per sequence");
    }
}

impl SeqState {
    /// The process-unique id device backends key this sequence's layers by.
    pub fn id(&self) -> u64 {
        self.res.id
    }
    /// Whether a device backend owns any layer.
    pub fn is_resident(&self) -> bool {
        self.res.any()
    }
    /// The name of the backend owning layer `l` (None: the host).
    pub fn owner(&self, l: usize) -> Option<&str> {
        self.res.owner(l).map(|b| b.name())
    }
    pub(crate) fn key(&self, l: usize) -> StateKey {
        StateKey { seq: self.res.id, layer: l as u32 }
    }

    /// Brings every layer home: afterwards the host copies are current and owned by the
    /// host (the next pass uploads them again). `Runner::sync_state` does the same.
    pub fn sync(&mut self) -> Result<(), MoveError> {
        for l in 0..self.res.at.len() {
            self.bring_home(l, None)?;
        }
        self.res.at.clear();
        Ok(())
    }

    /// Moves layer `l` home from its owner (no-op when the host owns it).
    pub(crate) fn bring_home(&mut self, l: usize, moves: Option<&mut Counters>) -> Result<(), MoveError> {
        let Some(b) = self.res.owner(l).cloned() else { return Ok(()) };
        let key = self.key(l);
        b.state(StateOp::Download(key, &mut self.layers[l])).map_err(|e| move_err(l, "download", &*b, e))?;
        let _ = b.state(StateOp::Release(key));
        self.res.set(l, self.layers.len(), None);
        if let Some(m) = moves {
            m.state_downloads += 1;
            m.state_bytes += self.layers[l].bytes() as u64;
        }
        Ok(())
    }

    /// Makes the device backend `b` own layer `l` (home from another owner first, then
    /// uploaded). No-op when `b` owns it already or the layer does not exist.
    pub(crate) fn place(&mut self, l: usize, b: &Arc<dyn Backend>, moves: &mut Counters) -> Result<(), MoveError> {
        if l >= self.layers.len() {
            return Ok(());
        }
        if let Some(o) = self.res.owner(l) {
            if same(o, b) {
                return Ok(());
            }
            self.bring_home(l, Some(moves))?;
        }
        b.state(StateOp::Upload(self.key(l), &mut self.layers[l])).map_err(|e| move_err(l, "upload", &**b, e))?;
        self.res.set(l, self.layers.len(), Some(b));
        moves.state_uploads += 1;
        moves.state_bytes += self.layers[l].bytes() as u64;
        Ok(())
    }

    /// Layer `l`'s current contents: the host copy, or a copy from its owner (which
    /// keeps it).
    pub(crate) fn current(&self, l: usize) -> Result<Cow<'_, LayerState>, MoveError> {
        match self.res.owner(l) {
            None => Ok(Cow::Borrowed(&self.layers[l])),
            Some(b) => {
                let mut c = self.layers[l].clone();
                b.state(StateOp::Download(self.key(l), &mut c)).map_err(|e| move_err(l, "download", &**b, e))?;
                Ok(Cow::Owned(c))
            }
        }
    }

    /// Resets every device-owned layer in place on its backend
    /// ([`StateOp::Reset`]); a layer whose backend cannot (or fails) is released to
    /// the host. Returns, per layer, whether it is still device-owned (reset there): the
    /// caller resets the others' host copies.
    pub(crate) fn reset_device_copies(&mut self) -> Vec<bool> {
        let mut kept = vec![false; self.res.at.len()];
        for (l, k) in kept.iter_mut().enumerate() {
            let Some(b) = self.res.owner(l).cloned() else { continue };
            let key = self.key(l);
            if matches!(b.state(StateOp::Reset(key)), Ok(StateReply::Done)) {
                *k = true;
            } else {
                let _ = b.state(StateOp::Release(key));
                self.res.set(l, self.layers.len(), None);
            }
        }
        if !kept.iter().any(|&k| k) {
            self.res.at.clear();
        }
        kept
    }

    /// Layer `l`'s snapshot at the current position: from the host copy, or from its
    /// owner (ranged where it can, [`StateOp::Snapshot`], else a whole download).
    pub(crate) fn layer_snapshot(&self, l: usize) -> Result<LayerSnapshot, MoveError> {
        if let Some(b) = self.res.owner(l) {
            let key = self.key(l);
            if let StateReply::Snapshot(s) = b.state(StateOp::Snapshot(key, self.pos)).map_err(|e| move_err(l, "snapshot", &**b, e))? {
                if !self.layers[l].accepts(&s) {
                    let e = OpError::Invalid { op: "state_snapshot", msg: "snapshot of another geometry than the layer's".into() };
                    return Err(move_err(l, "snapshot", &**b, e));
                }
                return Ok(s);
            }
        }
        Ok(self.current(l)?.snapshot(self.pos))
    }

    /// Drops every device copy: the host is about to overwrite all layers.
    pub(crate) fn drop_device_copies(&mut self) {
        for l in 0..self.res.at.len() {
            if let Some(b) = self.res.owner(l) {
                let _ = b.state(StateOp::Release(self.key(l)));
            }
        }
        self.res.at.clear();
    }

    /// Moves `src`'s content (position, mode, layer states) into this state, which keeps
    /// its id and so the device copies it holds: a slot's row (slots.rs) stays at the
    /// same device addresses whatever sequence it holds, so a device replays one captured
    /// step. Per layer: a device-owned one is copied on its backend into this state's key
    /// (in place where this state holds one there, [`StateOp::Copy`]); a host one goes
    /// into this state's device copy where it holds one ([`StateOp::Upload`], in place),
    /// else stays a host copy. `release_src`: drop `src`'s device copies after (a
    /// sequence being bound); else they stay (a row moved out keeps its buffers). Left in
    /// `src`: this state's old host copies (for a free row, none). On an error neither
    /// state's bookkeeping changed and the device copies this call made are dropped
    /// again; a host layer already uploaded holds what the backend left in it after the
    /// upload (its content on a real device; a test backend poisons it).
    pub(crate) fn take_content(&mut self, src: &mut SeqState, release_src: bool) -> Result<(), MoveError> {
        let n = src.layers.len();
        let mut owners = Vec::with_capacity(n);
        for l in 0..n {
            match self.layer_in(src, l) {
                Ok(o) => owners.push(o),
                Err(e) => {
                    // the keys this call created go again (a row's own stay)
                    for (l, b) in owners.iter().enumerate().filter_map(|(l, o)| Some((l, o.as_ref()?))) {
                        if !self.res.owner(l).is_some_and(|m| same(m, b)) {
                            let _ = b.state(StateOp::Release(self.key(l)));
                        }
                    }
                    return Err(e);
                }
            }
        }
        // device copies of this state's that no longer hold its content are dropped
        for l in 0..self.res.at.len().max(n) {
            let new = owners.get(l).cloned().flatten();
            if let Some(m) = self.res.owner(l).filter(|m| !new.as_ref().is_some_and(|o| same(o, m))) {
                let _ = m.state(StateOp::Release(self.key(l)));
            }
            self.res.set(l, n, new.as_ref());
        }
        self.res.at.truncate(n);
        if !self.res.any() {
            self.res.at.clear();
        }
        std::mem::swap(&mut self.layers, &mut src.layers);
        (self.pos, self.max_seq, self.overflow) = (src.pos, src.max_seq, src.overflow);
        if release_src {
            src.drop_device_copies();
        }
        Ok(())
    }

    /// Layer `l`'s content of `src` into this state's key ([`SeqState::take_content`]):
    /// the backend that then owns it (None: the host copy src holds has it).
    fn layer_in(&self, src: &mut SeqState, l: usize) -> Result<Option<Arc<dyn Backend>>, MoveError> {
        let Some(b) = src.res.owner(l).cloned() else {
            let Some(m) = self.res.owner(l).cloned() else { return Ok(None) };
            m.state(StateOp::Upload(self.key(l), &mut src.layers[l])).map_err(|e| move_err(l, "upload", &*m, e))?;
            return Ok(Some(m));
        };
        if let StateReply::Done = b.state(StateOp::Copy(src.key(l), self.key(l))).map_err(|e| move_err(l, "copy", &*b, e))? {
            return Ok(Some(b));
        }
        // no copy on that backend: home into src's host copy, which this state takes
        b.state(StateOp::Download(src.key(l), &mut src.layers[l])).map_err(|e| move_err(l, "download", &*b, e))?;
        Ok(None)
    }

    /// A fork with a new id. A device-owned layer is copied on its backend where it can
    /// ([`StateOp::Copy`]: the fork's layer stays there), else through the host.
    pub fn try_clone(&self) -> Result<SeqState, MoveError> {
        let mut c = SeqState {
            pos: self.pos,
            max_seq: self.max_seq,
            layers: self.layers.clone(),
            overflow: self.overflow,
            res: Residency::new(),
        };
        for l in 0..self.res.at.len() {
            let Some(b) = self.res.owner(l) else { continue };
            let (from, to) = (self.key(l), c.key(l));
            if matches!(b.state(StateOp::Copy(from, to)).map_err(|e| move_err(l, "copy", &**b, e))?, StateReply::Done) {
                c.res.set(l, c.layers.len(), Some(b));
            } else {
                b.state(StateOp::Download(from, &mut c.layers[l])).map_err(|e| move_err(l, "download", &**b, e))?;
            }
        }
        Ok(c)
    }
}

impl Clone for SeqState {
    /// [`SeqState::try_clone`]; panics if a device copy cannot be read (use `try_clone`
    /// to handle that).
    fn clone(&self) -> SeqState {
        self.try_clone().unwrap_or_else(|e| panic!("SeqState::clone: {e}"))
    }
}

impl PartialEq for SeqState {
    /// Same positions, mode and layer contents (device copies read; a read error: unequal).
    fn eq(&self, o: &SeqState) -> bool {
        self.pos == o.pos
            && self.max_seq == o.max_seq
            && self.overflow == o.overflow
            && self.layers.len() == o.layers.len()
            && (0..self.layers.len()).all(|l| match (self.current(l), o.current(l)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            })
    }
}

impl std::fmt::Debug for SeqState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let owners: Vec<Option<&str>> = (0..self.res.at.len()).map(|l| self.owner(l)).collect();
        f.debug_struct("SeqState")
            .field("id", &self.res.id)
            .field("pos", &self.pos)
            .field("max_seq", &self.max_seq)
            .field("overflow", &self.overflow)
            .field("owners", &owners)
            .field("layers", &self.layers)
            .finish()
    }
}

impl Drop for SeqState {
    fn drop(&mut self) {
        self.drop_device_copies();
    }
}
