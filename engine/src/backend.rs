//! The backend trait: something that can execute graph nodes.

use crate::graph::Node;
use pn_ops::{LayerState, Op, OpError, Tensor, TensorData, TensorMeta, Value};

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

    /// Runs the stateful op `op` once per sequence (decode slots, crate::slots): sequence
    /// `i` has inputs `inputs[i]`, output meta `outs[i]` and layer state `states[i]`.
    /// Each result must be bitwise what `execute` gives for that sequence alone; a backend
    /// may run the sequences concurrently. Default: one `execute` after another.
    fn execute_multi(
        &self,
        op: &Op,
        inputs: &[Vec<Value<'_>>],
        outs: &[TensorMeta],
        states: &mut [Option<&mut LayerState>],
    ) -> Result<Vec<Tensor>, OpError> {
        inputs
            .iter()
            .zip(outs)
            .zip(states.iter_mut())
            .map(|((ins, out), st)| self.execute(op, ins, out, st.as_deref_mut()))
            .collect()
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
