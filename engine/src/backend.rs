//! The backend protocol: ONE for every backend (docs/serving.md, docs/cuda.md).
//!
//! A backend owns the buffers of the runner's memory plan on its die and the layer states
//! it holds. Per runner it reserves the buffer slots once for the worst-case geometry
//! ([`Backend::reserve`]: buffers never move, so a segment can be captured); per pass
//! the runner uploads the graph inputs and the values arriving from another die
//! ([`Backend::upload`], [`Backend::copy_from`] die to die), runs each segment through the
//! [`Executable`] the backend compiled for it (once per geometry, [`Backend::compile`];
//! CUDA graph capture is that executable's own business) and downloads the logits and the
//! values leaving the die ([`Backend::download`]). Layer states move with a small set of
//! [`StateOp`]s (new from a host copy / download / copy / reset / snapshot / release).
//!
//! Where a backend's memory is host memory ([`Memory::Host`]: CPU, reference, see
//! [`host::HostKernels`]), uploads and downloads are plain copies and stateful ops compute
//! on the sequences' host layer copies, handed over in the pass's sequence table
//! ([`PassIo::layers`]); a device backend holds its own copies under [`StateKey`].

pub mod host;
pub mod op;

pub use host::{HostKernels, HostMem};
pub use op::{execute_op, new_arena};

use crate::graph::Node;
use pn_ops::{DType, LayerSnapshot, LayerState, Op, OpError, SeqSpan, Tensor, TensorData, TensorMeta, WeightView};
use smallvec::SmallVec;
use std::any::Any;
use std::sync::Arc;

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

/// One layer state held by a device backend: the sequence's [`crate::SeqState::id`]
/// (unique per state, never reused in a process) and the layer index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    pub seq: u64,
    pub layer: u32,
}

/// Where a backend's buffers and layer states live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (CPU, reference): a copy to or from it is no host ↔ device traffic,
    /// and stateful ops compute on the host layer copies ([`PassIo::layers`]).
    Host,
    /// The backend's own memory (a GPU): layer states are uploaded to it and stay there.
    Device,
}

/// An input of an op on slots: a slot holding a value of `meta`, or a weight (zero-copy
/// GGUF bytes; a device backend uploads and caches it once).
#[derive(Clone, Copy, Debug)]
pub enum ResidentInput<'a> {
    Slot(SlotId, TensorMeta),
    Weight(WeightView<'a>),
}

/// An input of an [`OpCode`]: a slot, or weight `i` of the pass ([`PassIo::weights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpInput {
    Slot(SlotId, TensorMeta),
    Weight(u32),
}

/// One op of a segment: its inputs, the slot its result of `meta` goes to (never an
/// input), and the layer whose state it reads and updates (stateful ops).
#[derive(Clone, Debug)]
pub struct OpCode {
    pub op: Op,
    pub inputs: SmallVec<[OpInput; 6]>,
    pub meta: TensorMeta,
    pub out: SlotId,
    pub state: Option<usize>,
}

impl OpCode {
    /// The inputs with the pass's weights resolved.
    pub fn resolve<'w>(&self, weights: &[WeightView<'w>]) -> SmallVec<[ResidentInput<'w>; 6]> {
        self.inputs
            .iter()
            .map(|i| match *i {
                OpInput::Slot(id, m) => ResidentInput::Slot(id, m),
                OpInput::Weight(w) => ResidentInput::Weight(weights[w as usize]),
            })
            .collect()
    }
}

/// A segment to compile: its ops over fixed slots of `arena`, for one geometry
/// (`n_tokens` of `seqs` sequences, `all_logits`); `stable`: the geometry is fixed step to
/// step (decode), so a device may capture it once and replay it (the state keys and
/// inputs change).
#[derive(Clone, Debug)]
pub struct SegmentCode {
    pub arena: u64,
    pub segment: usize,
    pub n_tokens: usize,
    pub seqs: usize,
    pub all_logits: bool,
    pub stable: bool,
    pub ops: Vec<OpCode>,
}

/// A segment run on a device, for its capture hooks (CUDA, the mock): (`arena`,
/// `n_tokens`, `all_logits`, `segment`) names one op list over fixed slots; `replay`: it
/// ran before and is `stable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRun {
    pub arena: u64,
    pub segment: usize,
    pub n_tokens: usize,
    pub all_logits: bool,
    pub stable: bool,
    pub replay: bool,
}

impl SegmentCode {
    pub fn run_info(&self, replay: bool) -> SegmentRun {
        SegmentRun {
            arena: self.arena,
            segment: self.segment,
            n_tokens: self.n_tokens,
            all_logits: self.all_logits,
            stable: self.stable,
            replay,
        }
    }
}

/// What one run of an [`Executable`] gets: the weights its ops name, the pass's sequence
/// table (sequence `i` owns tokens `spans[i]`, token axis outermost; its state id
/// `ids[i]`, its host layer copies `layers[i]`) and the per-op callbacks.
pub struct PassIo<'p, 'l> {
    pub weights: &'p [WeightView<'p>],
    pub spans: &'p [SeqSpan],
    pub ids: &'p [u64],
    /// Host-memory backends compute stateful ops on these (the runner brought the layers
    /// of this die home); a device backend uses `StateKey { seq: ids[i], layer }`.
    pub layers: &'p mut [&'l mut [LayerState]],
    /// After op `i` (PN_DEBUG=2 timings); may run on the backend's pass thread.
    pub timing: Option<&'p mut (dyn FnMut(usize) + Send)>,
    /// After op `i`, with its output as a host tensor (observers, PN_DEBUG=3); the
    /// caller's thread.
    pub observe: Option<Observer<'p>>,
}

/// A pass's observer: op `i`'s output as a host tensor ([`PassIo::observe`]).
pub type Observer<'a> = &'a mut dyn FnMut(usize, &Tensor);

/// An executable's failure: at op `op` of its segment (None: the segment as a whole).
#[derive(Debug)]
pub struct ExecError {
    pub op: Option<usize>,
    pub source: OpError,
}

impl ExecError {
    pub fn at(op: usize) -> impl FnOnce(OpError) -> ExecError {
        move |source| ExecError { op: Some(op), source }
    }
    pub fn segment(source: OpError) -> ExecError {
        ExecError { op: None, source }
    }
}

/// A compiled segment. Results must be bitwise the reference kernels' and independent of
/// the backend's thread count; each sequence's rows bitwise what it gives alone.
pub trait Executable: Send + Sync {
    fn run(&self, io: &mut PassIo<'_, '_>) -> Result<(), ExecError>;
}

/// A layer-state operation ([`Backend::state`]); only for a [`Memory::Device`] backend.
pub enum StateOp<'a> {
    /// Host → backend (a new state, or a restored one): from now on the backend's copy is
    /// authoritative. The backend may overwrite the host copy's contents (a test backend
    /// poisons it) but keeps its shape (`SeqState::bytes` reads it).
    Upload(StateKey, &'a mut LayerState),
    /// Backend → host copy (same shape); the backend's copy stays.
    Download(StateKey, &'a mut LayerState),
    /// A fork: state `.0` copied to a new key `.1` on the backend.
    Copy(StateKey, StateKey),
    /// In place, to what a fresh `LayerState` of its geometry holds (modes kept).
    Reset(StateKey),
    /// Only what [`LayerState::snapshot`]`(pos)` holds, bitwise that snapshot.
    Snapshot(StateKey, usize),
    /// Drop the backend's copy.
    Release(StateKey),
}

/// A [`StateOp`]'s answer.
#[derive(Debug)]
pub enum StateReply {
    Done,
    /// Not supported (copy / reset / snapshot): the caller goes through the host.
    Unsupported,
    Snapshot(LayerSnapshot),
}

/// A value moved by [`Backend::transfer`].
pub enum Transfer<'a> {
    /// Host → slot.
    Upload(SlotId, &'a Tensor),
    /// Slot → host: `out` gets the value of `meta` the slot holds (its buffer reused when
    /// it has room). Synchronous: the data is in `out` when it returns.
    Download(SlotId, &'a TensorMeta, &'a mut Tensor),
    /// Die to die: slot `from` of `src` into slot `to` of this backend, without the host
    /// (`Ok(false)`: not possible, e.g. another backend type).
    Copy { src: &'a dyn Backend, from: SlotId, to: SlotId, meta: &'a TensorMeta },
}

impl dyn Backend {
    /// Host → slot ([`Transfer::Upload`]).
    pub fn upload(&self, slot: SlotId, t: &Tensor) -> Result<(), OpError> {
        self.transfer(Transfer::Upload(slot, t)).map(|_| ())
    }
    /// Slot → host ([`Transfer::Download`]).
    pub fn download(&self, slot: SlotId, meta: &TensorMeta, out: &mut Tensor) -> Result<(), OpError> {
        self.transfer(Transfer::Download(slot, meta, out)).map(|_| ())
    }
    /// Die to die ([`Transfer::Copy`]); `Ok(false)`: not possible.
    pub fn copy_from(&self, src: &dyn Backend, from: SlotId, to: SlotId, meta: &TensorMeta) -> Result<bool, OpError> {
        self.transfer(Transfer::Copy { src, from, to, meta })
    }
}

/// Whether a backend can run a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Support {
    Yes,
    No(String),
}

/// A backend: its buffers, its layer states, compiled segments. (`Any`: a backend
/// downcasts the source of a die-to-die copy to its own type.)
pub trait Backend: Any + Send + Sync {
    fn name(&self) -> &str;
    fn supports(&self, node: &Node) -> Support;
    /// Where its buffers and states live.
    fn memory(&self) -> Memory;
    /// Reserve (or grow) buffer slots: before the first pass every slot of the
    /// worst-case geometry, later only a slot a geometry outgrows.
    fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError>;
    /// Free every slot of `arena` (its runner is dropped).
    fn release(&self, arena: u64);
    /// A value into, out of or between slots ([`Transfer`]); `Ok(false)`: a die-to-die
    /// copy this backend cannot make (the runner then downloads and uploads).
    fn transfer(&self, t: Transfer<'_>) -> Result<bool, OpError>;
    /// Compiles a segment's ops (checked, bound to their slots) into what runs them.
    fn compile(self: Arc<Self>, seg: SegmentCode) -> Result<Box<dyn Executable>, OpError>;
    /// A layer-state operation (a [`Memory::Device`] backend).
    fn state(&self, op: StateOp<'_>) -> Result<StateReply, OpError>;
    /// Runs `f` (several passes and the host work between them: a speculative round) on
    /// the backend's threads, so the passes it runs start there without a hand-over
    /// each. Default: inline (host backends: [`HostKernels::run_pass`]).
    fn enter(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }
}

/// The pn-ops reference kernels as a backend (single-threaded; the oracle for parity
/// tests), through the same protocol as every backend ([`HostKernels`]). Its buffers are
/// in one process-wide [`HostMem`] (arena ids are unique per process).
pub struct ReferenceBackend;

static REFERENCE_MEM: HostMem = HostMem::new();

impl HostKernels for ReferenceBackend {
    fn label(&self) -> &str {
        "reference"
    }
    fn can_run(&self, _node: &Node) -> Support {
        Support::Yes
    }
    fn mem(&self) -> &HostMem {
        &REFERENCE_MEM
    }
    fn execute(&self, op: &Op, ins: &[pn_ops::Value<'_>], meta: &TensorMeta, state: Option<&mut LayerState>) -> Result<Tensor, OpError> {
        pn_ops::reference::execute(op, ins, meta, state)
    }
    fn kernel_into(
        &self,
        op: &Op,
        ins: &[pn_ops::Value<'_>],
        meta: &TensorMeta,
        state: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        store_into(out, pn_ops::reference::execute(op, ins, meta, state)?);
        Ok(())
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

/// `dst` = `src` in `dst`'s buffer when the element type matches (no reallocation within
/// its capacity), else `src`'s data cloned.
pub fn copy_tensor(dst: &mut Tensor, src: &Tensor) {
    dst.shape = src.shape;
    match (&mut dst.data, &src.data) {
        (TensorData::F32(a), TensorData::F32(b)) => {
            a.clear();
            a.extend_from_slice(b);
        }
        (TensorData::I32(a), TensorData::I32(b)) => {
            a.clear();
            a.extend_from_slice(b);
        }
        (d, s) => *d = s.clone(),
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
