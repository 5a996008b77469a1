//! Naive f32 reference kernels, one per op: the oracle every backend is tested against.
//! Written for clarity, single-threaded; each follows the math of spec §4–5 exactly.

use crate::{LayerState, Op, OpError, Tensor, TensorMeta, Value};

/// Execute one op on its inputs. `state` is the layer state for stateful ops.
pub fn execute(op: &Op, ins: &[Value<'_>], out: &TensorMeta, state: Option<&mut LayerState>) -> Result<Tensor, OpError> {
    let _ = (op, ins, out, state);
    todo!("kernels helper")
}
