//! The backend trait: something that can execute graph nodes.
//!
//! Two execution protocols (docs/cuda.md):
//! - **host** (the default; CPU, reference): `execute` / `execute_into` take host tensors
//!   and the host `LayerState`; the runner owns every buffer.
//! - **resident** (`resident() == true`; a device backend such as CUDA): the backend keeps
//!   the runner's buffer slots and the sequences' layer states in its own memory. The
//!   runner reserves the slots once ([`Backend::reserve_slots`], worst-case bytes, so
//!   buffers never move and a segment can be captured), uploads the graph inputs and
//!   the values crossing into the die ([`Backend::upload`]), downloads what leaves it
//!   (transfers to a host die, the graph output, observer copies: [`Backend::download`]),
//!   runs ops on slot ids ([`Backend::execute_resident`]) and moves layer states
//!   explicitly ([`Backend::state_upload`] / [`Backend::state_download`] /
//!   [`Backend::state_release`], keyed by [`StateKey`]; crate::state::resident), resets
//!   them in place ([`Backend::state_reset`]) and copies out only what a snapshot needs
//!   ([`Backend::state_snapshot`]).

use crate::graph::Node;
use pn_ops::{DType, LayerSnapshot, LayerState, Op, OpError, SeqSpan, Tensor, TensorData, TensorMeta, Value, WeightView};
use std::any::Any;

/// A buffer slot of the runner's memory plan on one die. `arena` is unique per (runner,
/// die); `class` / `slot` are the plan's (planner::program::CLASS_*, slot index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    pub arena: u64,
    pub class: u32,
    pub slot: u32,
}

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "slot {}/{}#{}", self.arena, self.class, self.slot)
    }
}

/// A slot to reserve: its element type and the most bytes any geometry writes there.
/// Reserved once for the worst case (`ubatch` tokens, all logits); a later call with a
/// larger size for the same id means a geometry outgrew it (counted by the runner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSpec {
    pub id: SlotId,
    pub dtype: DType,
    pub bytes: usize,
}

/// One layer state held by a resident backend: the sequence's [`crate::SeqState::id`]
/// (unique per state, never reused in a process) and the layer index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    pub seq: u64,
    pub layer: u32,
}

/// An input of a resident op: a slot holding a value of `meta`, or a weight (zero-copy
/// GGUF bytes; a device backend uploads and caches it once).
#[derive(Clone, Copy, Debug)]
pub enum ResidentInput<'a> {
    Slot(SlotId, TensorMeta),
    Weight(WeightView<'a>),
}

/// A segment about to run (or just run) on a resident die: hooks for CUDA graph capture.
/// (`arena`, `n_tokens`, `all_logits`, `segment`) names one op list over fixed slots;
/// `replay`: it ran before (`stable`: its geometry is fixed step to step, e.g. decode);
/// the state keys and the uploaded inputs may differ between runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRun {
    pub arena: u64,
    pub segment: usize,
    pub n_tokens: usize,
    pub all_logits: bool,
    pub stable: bool,
    pub replay: bool,
}

/// The error of a resident-protocol method a backend does not implement.
pub fn not_resident(backend: &str, what: &'static str) -> OpError {
    OpError::Invalid { op: what, msg: format!("backend {backend} is not resident") }
}

/// Whether a backend can run a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Support {
    Yes,
    No(String),
}

/// A backend executes nodes of a segment placed on its die.
///
/// `execute` gets the node's op, its inputs (activations or zero-copy weight views), the
/// output meta from shape inference, and the layer state for stateful ops. Results must be
/// bitwise independent of the backend's thread count.
pub trait Backend: Send + Sync {
    fn name(&self) -> &str;
    fn supports(&self, node: &Node) -> Support;
    fn execute(
        &self,
        op: &Op,
        inputs: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError>;

    /// Like [`Backend::execute`], but writes the result into `out`, a buffer the runner
    /// keeps from step to step (a slot of the memory plan, reserved for the worst-case
    /// geometry): a backend that writes there directly allocates nothing per op. `out`
    /// never aliases an input. Default: `execute`, then [`store_into`].
    fn execute_into(
        &self,
        op: &Op,
        inputs: &[Value<'_>],
        meta: &TensorMeta,
        state: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        store_into(out, self.execute(op, inputs, meta, state)?);
        Ok(())
    }

    /// Runs `f` — the ops of one segment, each through `execute` / `execute_into` — as
    /// one pass on this backend's threads (CPU: one `pool.install` for the segment
    /// instead of a hand-off per op). Default: `f` on the caller's thread.
    fn run_pass(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }

    /// Runs the stateful `op` for every sequence of a pass in ONE call (decode slots,
    /// mixed passes: crate::slots): `ins` hold all tokens, sequence `i` owns tokens
    /// `seqs[i]` (the token axis outermost) and updates `states[i]`; every token's
    /// output goes into `out` (`meta`: all tokens). Each row must be bitwise what
    /// `execute` gives for that sequence alone. Default: one `execute` per sequence on
    /// its slice ([`pn_ops::reference::seqs::per_sequence`]); the CPU runs all
    /// sequences' (sequence, head) rows in one parallel loop.
    fn execute_seqs(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        seqs: &[SeqSpan],
        states: &mut [&mut LayerState],
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        let exec = &mut |ins: &[Value<'_>], m: &TensorMeta, st: &mut LayerState| self.execute(op, ins, m, Some(st));
        store_into(out, pn_ops::reference::seqs::per_sequence(op, ins, meta, seqs, states, exec)?);
        Ok(())
    }

    // ---- resident protocol: the defaults say "not resident"; the runner calls the
    // methods below only on a backend whose `resident()` is true. ----

    /// Whether this backend keeps slots and layer states in its own memory.
    fn resident(&self) -> bool {
        false
    }
    /// `Some(self)` for a backend that can copy die-to-die from another instance of its
    /// own type ([`Backend::copy_from`] downcasts the source with it).
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
    /// Reserve (or grow) buffer slots. Called before the first pass with every slot of
    /// the worst-case geometry, later only for a slot a geometry outgrows.
    fn reserve_slots(&self, _specs: &[SlotSpec]) -> Result<(), OpError> {
        Err(not_resident(self.name(), "reserve_slots"))
    }
    /// Free every slot of `arena` (the runner is dropped).
    fn release_slots(&self, _arena: u64) {}
    /// Host → slot (graph inputs, values arriving from a host die).
    fn upload(&self, _slot: SlotId, _t: &Tensor) -> Result<(), OpError> {
        Err(not_resident(self.name(), "upload"))
    }
    /// Slot → host: `out` gets the value of `meta` the slot holds (its buffer reused when
    /// it has room). Synchronous: the data is in `out` when it returns.
    fn download(&self, _slot: SlotId, _meta: &TensorMeta, _out: &mut Tensor) -> Result<(), OpError> {
        Err(not_resident(self.name(), "download"))
    }
    /// Die-to-die copy of slot `from` of `src` (another die's backend) into `to`, without
    /// the host. `Ok(false)`: not possible (e.g. another backend type); the runner then
    /// downloads and uploads.
    fn copy_from(&self, _src: &dyn Backend, _from: SlotId, _to: SlotId, _meta: &TensorMeta) -> Result<bool, OpError> {
        Ok(false)
    }
    /// Runs `op` on slots: inputs from their slots (or weights), the result of `meta`
    /// into slot `out` (never an input), `state` for stateful ops (held by this backend
    /// since a [`Backend::state_upload`]). Results must be bitwise those of `execute`.
    fn execute_resident(
        &self,
        _op: &Op,
        _inputs: &[ResidentInput<'_>],
        _meta: &TensorMeta,
        _state: Option<StateKey>,
        _out: SlotId,
    ) -> Result<(), OpError> {
        Err(not_resident(self.name(), "execute_resident"))
    }
    /// The stateful `op` once per sequence (decode slots, crate::slots): sequence `i` owns
    /// the next `lens[i]` tokens of every activation input (token axis outermost) and the
    /// state `states[i]`; the outputs are concatenated into `out` (`meta`: all tokens).
    /// Each row bitwise what the sequence gives alone ([`Backend::execute_seqs`] is the
    /// host reference).
    fn execute_multi_resident(
        &self,
        _op: &Op,
        _inputs: &[ResidentInput<'_>],
        _meta: &TensorMeta,
        _states: &[StateKey],
        _lens: &[usize],
        _out: SlotId,
    ) -> Result<(), OpError> {
        Err(not_resident(self.name(), "execute_multi_resident"))
    }
    /// Host → backend: from now on the backend's copy of `key` is authoritative. `st` is
    /// the host copy; the backend may overwrite its contents (a test backend poisons it)
    /// but must keep its shape (buffer lengths: `SeqState::bytes` reads them).
    fn state_upload(&self, _key: StateKey, _st: &mut LayerState) -> Result<(), OpError> {
        Err(not_resident(self.name(), "state_upload"))
    }
    /// Backend → host: copies the backend's `key` into `st` (same shape). The backend's
    /// copy stays; the caller releases it when the host becomes the owner.
    fn state_download(&self, _key: StateKey, _st: &mut LayerState) -> Result<(), OpError> {
        Err(not_resident(self.name(), "state_download"))
    }
    /// Copies state `from` to a new key `to` on the backend (a fork, `SeqState::clone`).
    /// `Ok(false)`: not supported; the fork then goes through the host.
    fn state_copy(&self, _from: StateKey, _to: StateKey) -> Result<bool, OpError> {
        Ok(false)
    }
    /// Drops the backend's copy of `key` (the host owns it again, or the state is gone).
    fn state_release(&self, _key: StateKey) {}
    /// Resets the backend's copy of `key` in place to what a fresh `LayerState` of its
    /// geometry holds (KV cells and shadows zero, conv window and ssm state zero; modes
    /// kept): `SeqState::reset` without a host round trip, the backend stays the owner.
    /// `Ok(false)`: not supported; the caller releases the copy and resets the host one.
    fn state_reset(&self, _key: StateKey) -> Result<bool, OpError> {
        Ok(false)
    }
    /// Copies out of the backend's `key` only what [`LayerState::snapshot`]`(pos)` holds
    /// (the used KV cells `min(pos, capacity)` per head, the sink / window shadows a
    /// later query can read, the whole recurrent state), bitwise that snapshot. The
    /// backend's copy stays. `Ok(None)`: not supported; the caller downloads the whole
    /// state ([`Backend::state_download`]) and snapshots the host copy.
    fn state_snapshot(&self, _key: StateKey, _pos: usize) -> Result<Option<LayerSnapshot>, OpError> {
        Ok(None)
    }
    /// Before a segment's ops on this die (CUDA: begin capture, or replay).
    fn begin_segment(&self, _seg: &SegmentRun) -> Result<(), OpError> {
        Ok(())
    }
    /// After a segment's ops (CUDA: end capture / launch the graph, record an event).
    fn end_segment(&self, _seg: &SegmentRun) -> Result<(), OpError> {
        Ok(())
    }
}

/// The pn-ops reference kernels as a backend (single-threaded; the oracle for parity tests).
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    fn name(&self) -> &str {
        "reference"
    }
    fn supports(&self, _node: &Node) -> Support {
        Support::Yes
    }
    fn execute(
        &self,
        op: &Op,
        inputs: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        pn_ops::reference::execute(op, inputs, out, state)
    }
}

/// Puts `t` into `out`: copied into `out`'s buffer when it has the same element type and
/// room enough (the buffer keeps its address), else moved there.
pub fn store_into(out: &mut Tensor, t: Tensor) {
    let Tensor { shape, data } = t;
    out.shape = shape;
    match (&mut out.data, data) {
        (TensorData::F32(a), TensorData::F32(b)) if a.capacity() >= b.len() => {
            a.clear();
            a.extend_from_slice(&b);
        }
        (TensorData::I32(a), TensorData::I32(b)) if a.capacity() >= b.len() => {
            a.clear();
            a.extend_from_slice(&b);
        }
        (_, data) => out.data = data,
    }
}

/// `out` as an F32 tensor of `meta`'s shape, its buffer resized in place (no allocation
/// when its capacity suffices); the contents are unspecified.
pub fn f32_out<'t>(out: &'t mut Tensor, meta: &TensorMeta) -> &'t mut [f32] {
    out.shape = meta.shape;
    if !matches!(out.data, TensorData::F32(_)) {
        out.data = TensorData::F32(Vec::new());
    }
    match &mut out.data {
        TensorData::F32(v) => {
            v.resize(meta.shape.numel(), 0.0);
            v
        }
        TensorData::I32(_) => unreachable!("set to F32 above"),
    }
}

/// `out` as an I32 tensor of `meta`'s shape (see [`f32_out`]).
pub fn i32_out<'t>(out: &'t mut Tensor, meta: &TensorMeta) -> &'t mut [i32] {
    out.shape = meta.shape;
    if !matches!(out.data, TensorData::I32(_)) {
        out.data = TensorData::I32(Vec::new());
    }
    match &mut out.data {
        TensorData::I32(v) => {
            v.resize(meta.shape.numel(), 0);
            v
        }
        TensorData::F32(_) => unreachable!("set to I32 above"),
    }
}
