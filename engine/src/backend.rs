//! The backend trait: something that can execute graph nodes.

use crate::graph::Node;
use pn_ops::{LayerState, Op, OpError, Tensor, TensorMeta, Value};

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
