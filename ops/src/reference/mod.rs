//! Naive f32 reference kernels, one per op: the oracle every backend is tested against.
//! Written for clarity, single-threaded; each follows the math of spec §4–5 exactly.
//!
//! [`common`] holds the validation, input access and scalar helpers backends share.

#![allow(clippy::needless_range_loop)] // index loops mirror the spec's formulas

pub mod attention;
pub mod common;
pub mod delta;
pub mod elementwise;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod seqs;

use crate::{LayerState, Op, OpError, Tensor, TensorMeta, Value};

/// Execute one op on its inputs. `state` is the layer state for stateful ops.
///
/// Leaves (Tokens, Positions, Weight) are provided by the runner: `OpError::Invalid`.
/// Malformed calls (inputs that `Op::infer` rejects, an `out` that differs from the
/// inferred meta, missing or mismatched state, out-of-range ids) give an `OpError`.
pub fn execute(
    op: &Op,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    common::validate(op, ins, out)?;
    common::validate_state(op, ins, state.as_deref())?;
    match op {
        Op::Tokens | Op::Positions | Op::Weight { .. } => Err(OpError::Invalid {
            op: op.kind(),
            msg: "leaves are provided by the runner, not executed".into(),
        }),
        Op::GetRows => matmul::get_rows(ins, out),
        Op::MatMul => matmul::matmul(ins, out),
        Op::RmsNorm { eps } => norm::rms_norm(ins, out, *eps),
        Op::L2Norm { eps } => norm::l2_norm(ins, out, *eps),
        Op::Rope {
            n_rot,
            mode,
            freq_base,
            freq_scale,
        } => rope::rope(ins, out, *n_rot, *mode, *freq_base, *freq_scale),
        Op::Attention {
            n_head,
            n_head_kv,
            head_dim,
            scale,
            state: _,
        } => attention::attention(ins, out, state, *n_head, *n_head_kv, *head_dim, *scale),
        Op::Conv1dCausal { d_conv, state: _ } => delta::conv1d_causal(ins, out, state, *d_conv),
        Op::DeltaRule { state: _ } => delta::delta_rule(ins, out, state),
        Op::Softmax => norm::softmax(ins, out),
        Op::TopK { k } => moe::topk(ins, out, *k),
        Op::MoeWeights { normalize } => moe::moe_weights(ins, out, *normalize),
        Op::MoeExperts { merged_gate_up } => moe::moe_experts(ins, out, *merged_gate_up),
        Op::Unary(u) => elementwise::unary(ins, out, *u),
        Op::Binary(b) => elementwise::binary(ins, out, *b),
        Op::SliceCols { group, offset, len } => {
            elementwise::slice_cols(ins, out, *group, *offset, *len)
        }
        Op::SliceRows { start, len: _ } => elementwise::slice_rows(ins, out, *start),
        Op::LastRows { .. } => Err(OpError::Invalid {
            op: op.kind(),
            msg: "needs the pass's sequence table (run by an executor: seqs::last_rows)".into(),
        }),
        Op::Reshape(_) => elementwise::reshape(ins, out),
    }
}
