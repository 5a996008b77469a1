//! Element-wise ops and data movement, parallel over rows.

use crate::par;
use pn_ops::reference::common::{act_f32, binary as bin, f32_any, out_f32, unary as un};
use pn_ops::{BinaryOp, OpError, Tensor, TensorMeta, UnaryOp, Value};

/// Elements per parallel row for flat element-wise loops.
const FLAT: usize = 4096;

pub fn unary(ins: &[Value<'_>], out: &TensorMeta, op: UnaryOp) -> Result<Tensor, OpError> {
    const OP: &str = "Unary";
    let x = act_f32(OP, &ins[0])?;
    let mut y = x.to_vec();
    par::rows(&mut y, FLAT, 8 * FLAT, |_, r| {
        for v in r.iter_mut() {
            *v = un(op, *v);
        }
    });
    out_f32(OP, out, y)
}

pub fn binary(ins: &[Value<'_>], out: &TensorMeta, op: BinaryOp) -> Result<Tensor, OpError> {
    const OP: &str = "Binary";
    let a = act_f32(OP, &ins[0])?;
    let (b, bs) = f32_any(OP, &ins[1])?;
    let [a0, a1, a2, _] = out.shape.0;
    let [b0, b1, b2, b3] = bs.0;
    let mut y = vec![0.0f32; a.len()];
    let b = &b[..];
    par::rows(&mut y, a0, 4 * a0, |row, yr| {
        let i1 = row % a1;
        let i2 = (row / a1) % a2;
        let i3 = row / (a1 * a2);
        let brow = ((i3 % b3) * b2 + i2 % b2) * b1 + i1 % b1;
        let bb = &b[brow * b0..(brow + 1) * b0];
        let ar = &a[row * a0..(row + 1) * a0];
        for (yc, ac) in yr.chunks_mut(b0).zip(ar.chunks(b0)) {
            for ((y, &x), &w) in yc.iter_mut().zip(ac).zip(bb) {
                *y = bin(op, x, w);
            }
        }
    });
    out_f32(OP, out, y)
}

pub fn slice_cols(
    ins: &[Value<'_>],
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
) -> Result<Tensor, OpError> {
    const OP: &str = "SliceCols";
    let x = act_f32(OP, &ins[0])?;
    let mut y = vec![0.0f32; out.shape.numel()];
    let n_out = out.shape.0[0];
    let n_in = ins[0].act().shape.0[0];
    par::rows(&mut y, n_out, n_out, |r, yr| {
        let xr = &x[r * n_in..(r + 1) * n_in];
        for (yc, xc) in yr.chunks_mut(len).zip(xr.chunks(group)) {
            yc.copy_from_slice(&xc[offset..offset + len]);
        }
    });
    out_f32(OP, out, y)
}

pub fn slice_rows(ins: &[Value<'_>], out: &TensorMeta, start: usize) -> Result<Tensor, OpError> {
    const OP: &str = "SliceRows";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let len = out.shape.0[1];
    out_f32(OP, out, x[start * n..(start + len) * n].to_vec())
}

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
