//! GetRows and MatMul (spec §4.1, §8): weights stay in their GGUF blocks.

use super::common::{act_f32, act_format, act_i32, out_f32, qerr, weight};
use crate::quant;
use crate::{OpError, Tensor, TensorMeta, Value};

/// Embedding lookup: each id's table row, dequantized.
pub fn get_rows(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    const OP: &str = "GetRows";
    let table = weight(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let k = table.shape.0[0];
    let vocab = table.shape.rows();
    let mut y = vec![0.0f32; k * ids.len()];
    for (t, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= vocab {
            return Err(OpError::Invalid {
                op: OP,
                msg: format!("token id {id} out of range (vocab size {vocab})"),
            });
        }
        quant::dequantize_row(table.ty, table.row(id as usize), &mut y[t * k..(t + 1) * k])
            .map_err(|e| qerr(OP, e))?;
    }
    out_f32(OP, out, y)
}

/// y[t][n] = vec_dot(W row n, x_t converted to the weight's vec-dot type).
pub fn matmul(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    const OP: &str = "MatMul";
    let w = weight(OP, &ins[0])?;
    let x = act_f32(OP, &ins[1])?;
    let k = w.shape.0[0];
    let n = w.shape.0[1];
    let t = out.shape.0[1];
    if x.len() != k * t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("x has {} elements, expected {k}×{t}", x.len()),
        });
    }
    let (at, rb) = act_format(OP, w.ty, k)?;
    let mut buf = vec![0u8; rb];
    let mut y = vec![0.0f32; n * t];
    for ti in 0..t {
        quant::quantize_row(at, &x[ti * k..(ti + 1) * k], &mut buf);
        for r in 0..n {
            y[ti * n + r] = quant::vec_dot(w.ty, k, w.row(r), &buf);
        }
    }
    out_f32(OP, out, y)
}
