//! Every op on the device, one exhaustive `match` shared by both protocols: operands in
//! device buffers ([`Opnd`]), the output into a device buffer, stateful ops on a device
//! copy of their layer state ([`DevState`]), commands through [`Cx`].

use crate::devstate::DevState;
use crate::exec::{Buf, Cx};
use crate::opnd::Opnd;
use crate::{ops_attn, ops_delta, ops_linear, ops_misc, ops_state, CudaError};
use pn_ops::{Op, OpError, TensorMeta};

pub(crate) fn to_op_error(op: &'static str, e: CudaError) -> OpError {
    match e {
        CudaError::Unsupported(ty) => OpError::Invalid {
            op,
            msg: format!("unsupported on cuda: {ty}"),
        },
        e => OpError::Invalid {
            op,
            msg: format!("cuda: {e}"),
        },
    }
}

fn needs(op: &'static str, what: &str) -> OpError {
    OpError::Invalid {
        op,
        msg: format!("needs a {what} layer state"),
    }
}

/// Runs `op` on `ins` into `y` (a value of `out`); `st`: the layer state of a stateful op.
pub fn run(
    cx: &mut Cx<'_>,
    op: &Op,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    st: Option<&mut DevState>,
) -> Result<(), OpError> {
    let k = op.kind();
    let e = |r: Result<(), CudaError>| r.map_err(|e| to_op_error(k, e));
    match op {
        Op::Tokens | Op::Positions | Op::Weight { .. } => Err(OpError::Invalid {
            op: k,
            msg: "leaves are provided by the runner, not executed".into(),
        }),
        Op::GetRows => e(ops_linear::get_rows(cx, ins, y)),
        Op::MatMul => e(ops_linear::matmul(cx, ins, y, out)),
        Op::MoeExperts { merged_gate_up } => {
            e(ops_linear::moe_experts(cx, ins, y, out, *merged_gate_up))
        }
        Op::RmsNorm { eps } => e(ops_misc::norm(cx, ins, y, out, *eps, true)),
        Op::L2Norm { eps } => e(ops_misc::norm(cx, ins, y, out, *eps, false)),
        Op::Softmax => e(ops_misc::softmax(cx, ins, y, out)),
        Op::Rope {
            n_rot,
            mode,
            freq_base,
            freq_scale,
        } => e(ops_misc::rope(
            cx,
            ins,
            y,
            out,
            *n_rot,
            *mode,
            *freq_base,
            *freq_scale,
        )),
        Op::TopK { k: top } => e(ops_misc::topk(cx, ins, y, out, *top)),
        Op::MoeWeights { normalize } => e(ops_misc::moe_weights(cx, ins, y, out, *normalize)),
        Op::Unary(u) => e(ops_misc::unary(cx, ins, y, out, *u)),
        Op::Binary(b) => e(ops_misc::binary(cx, ins, y, out, *b)),
        Op::SliceCols { group, offset, len } => {
            e(ops_misc::slice_cols(cx, ins, y, out, *group, *offset, *len))
        }
        Op::SliceRows { start, len: _ } => e(ops_misc::slice_rows(cx, ins, y, out, *start)),
        Op::LastRows { .. } => Err(OpError::Invalid {
            op: k,
            msg: "needs the pass's sequence lengths (resident.rs runs it)".into(),
        }),
        Op::Reshape(_) => e(ops_misc::reshape(cx, ins, y, out)),
        Op::Attention {
            n_head,
            n_head_kv,
            head_dim,
            scale,
            state: _,
        } => {
            let Some(DevState::Kv(kv)) = st else {
                return Err(needs(k, "KV-cache"));
            };
            let g = ops_attn::AttnGeom {
                n_head: *n_head,
                n_head_kv: *n_head_kv,
                d: *head_dim,
                scale: *scale,
            };
            ops_attn::attention(cx, ins, y, out, &kv.geo, &kv.bufs(), g)
        }
        Op::Conv1dCausal { d_conv, state: _ } => match st {
            Some(DevState::Rec(r)) => ops_state::conv1d(cx, ins, y, out, &r.bufs(), *d_conv),
            _ => Err(needs(k, "recurrent")),
        },
        Op::DeltaRule { state: _ } => match st {
            Some(DevState::Rec(r)) => ops_delta::delta_rule(cx, ins, y, out, &r.bufs()),
            _ => Err(needs(k, "recurrent")),
        },
    }
}
