//! Element-wise ops (spec §5) and pure data movement (slices, reshape).

use super::common::{act_f32, binary as bin, f32_any, out_f32, unary as un};
use crate::{BinaryOp, OpError, Tensor, TensorMeta, UnaryOp, Value};

pub fn unary(ins: &[Value<'_>], out: &TensorMeta, op: UnaryOp) -> Result<Tensor, OpError> {
    const OP: &str = "Unary";
    let x = act_f32(OP, &ins[0])?;
    out_f32(OP, out, x.iter().map(|&v| un(op, v)).collect())
}

/// out[i0,i1,i2,i3] = f(a[i0,i1,i2,i3], b[i0 % b0, i1 % b1, i2 % b2, i3 % b3]).
pub fn binary(ins: &[Value<'_>], out: &TensorMeta, op: BinaryOp) -> Result<Tensor, OpError> {
    const OP: &str = "Binary";
    let a = act_f32(OP, &ins[0])?;
    let (b, bs) = f32_any(OP, &ins[1])?;
    let [a0, a1, a2, a3] = out.shape.0;
    let [b0, b1, b2, b3] = bs.0;
    let mut y = vec![0.0f32; a.len()];
    for i3 in 0..a3 {
        for i2 in 0..a2 {
            for i1 in 0..a1 {
                for i0 in 0..a0 {
                    let ia = ((i3 * a2 + i2) * a1 + i1) * a0 + i0;
                    let ib = (((i3 % b3) * b2 + i2 % b2) * b1 + i1 % b1) * b0 + i0 % b0;
                    y[ia] = bin(op, a[ia], b[ib]);
                }
            }
        }
    }
    out_f32(OP, out, y)
}

/// Keep elements [offset, offset+len) of every group of `group` in each row.
pub fn slice_cols(
    ins: &[Value<'_>],
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
) -> Result<Tensor, OpError> {
    const OP: &str = "SliceCols";
    let x = act_f32(OP, &ins[0])?;
    let mut y = Vec::with_capacity(out.shape.numel());
    for grp in x.chunks(group) {
        y.extend_from_slice(&grp[offset..offset + len]);
    }
    out_f32(OP, out, y)
}

/// Rows [start, start+len) along ne1.
pub fn slice_rows(ins: &[Value<'_>], out: &TensorMeta, start: usize) -> Result<Tensor, OpError> {
    const OP: &str = "SliceRows";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let len = out.shape.0[1];
    out_f32(OP, out, x[start * n..(start + len) * n].to_vec())
}

/// Same data, the inferred shape.
pub fn reshape(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    match &ins[0] {
        Value::Act(t) => Ok(Tensor {
            shape: out.shape,
            data: t.data.clone(),
        }),
        Value::Weight(_) => Err(OpError::Invalid {
            op: "Reshape",
            msg: "cannot reshape a weight".into(),
        }),
    }
}
