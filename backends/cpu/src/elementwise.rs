//! Element-wise ops and data movement, parallel over rows. Each `*_into` writes every
//! element of `y` (`out.shape.numel()` floats, a reused buffer); the plain forms wrap it.

use crate::norm::len_check;
use crate::par;
use crate::norm::with_f32;
use pn_ops::reference::common::{act_f32, out_f32, unary as un};
use pn_ops::{BinaryOp, OpError, Tensor, TensorMeta, UnaryOp, Value};

/// Elements per parallel row for flat element-wise loops.
const FLAT: usize = 4096;

/// A fresh output for `out`, filled by `f` (the `Backend::execute` path).
fn fresh(
    op: &'static str,
    out: &TensorMeta,
    f: impl FnOnce(&mut [f32]) -> Result<(), OpError>,
) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    f(&mut y)?;
    out_f32(op, out, y)
}

pub fn unary(ins: &[Value<'_>], out: &TensorMeta, op: UnaryOp) -> Result<Tensor, OpError> {
    fresh("Unary", out, |y| unary_into(ins, out, op, y))
}

pub fn unary_into(ins: &[Value<'_>], _out: &TensorMeta, op: UnaryOp, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "Unary";
    let x = act_f32(OP, &ins[0])?;
    len_check(OP, x.len(), y.len())?;
    // each chunk copied where it is mapped (in cache; one serial copy of a prefill's
    // 16 MB took half the op)
    par::rows(y, FLAT, 8 * FLAT, |i, r| {
        r.copy_from_slice(&x[i * FLAT..i * FLAT + r.len()]);
        match op {
            // vectorized, the same bits as the scalar functions (pn_ops::math)
            UnaryOp::Silu => pn_ops::math::silu_in_place(r),
            UnaryOp::Sigmoid => pn_ops::math::sigmoid_in_place(r),
            UnaryOp::Exp => pn_ops::math::exp_in_place(r),
            _ => r.iter_mut().for_each(|v| *v = un(op, *v)),
        }
    });
    Ok(())
}

pub fn binary(ins: &[Value<'_>], out: &TensorMeta, op: BinaryOp) -> Result<Tensor, OpError> {
    fresh("Binary", out, |y| binary_into(ins, out, op, y))
}

pub fn binary_into(ins: &[Value<'_>], out: &TensorMeta, op: BinaryOp, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "Binary";
    with_f32(OP, &ins[1], |b, bs| binary_rows(&ins[0], b, bs, out, op, y))
}

fn binary_rows(
    a: &Value<'_>,
    b: &[f32],
    bs: pn_ops::Shape,
    out: &TensorMeta,
    op: BinaryOp,
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Binary";
    let a = act_f32(OP, a)?;
    let [a0, a1, a2, _] = out.shape.0;
    let [b0, b1, b2, b3] = bs.0;
    len_check(OP, a.len(), y.len())?;
    par::rows(y, a0, 4 * a0, |row, yr| {
        let i1 = row % a1;
        let i2 = (row / a1) % a2;
        let i3 = row / (a1 * a2);
        let brow = ((i3 % b3) * b2 + i2 % b2) * b1 + i1 % b1;
        let bb = &b[brow * b0..(brow + 1) * b0];
        let ar = &a[row * a0..(row + 1) * a0];
        match op {
            BinaryOp::Add => zip_row(yr, ar, bb, |x, w| x + w),
            BinaryOp::Mul => zip_row(yr, ar, bb, |x, w| x * w),
            BinaryOp::SwiGlu => swiglu_row(yr, ar, bb),
        }
    });
    Ok(())
}

/// `y[i] = f(a[i], b[i mod b.len()])` over one row (`b` repeats along it), with the two
/// common shapes (`b` one value, or as long as the row) as plain loops the compiler
/// vectorizes.
#[inline(always)]
fn zip_row(y: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    if let [w] = *b {
        for (y, &x) in y.iter_mut().zip(a) {
            *y = f(x, w);
        }
    } else if b.len() == a.len() {
        for ((y, &x), &w) in y.iter_mut().zip(a).zip(b) {
            *y = f(x, w);
        }
    } else {
        for (yc, ac) in y.chunks_mut(b.len()).zip(a.chunks(b.len())) {
            for ((y, &x), &w) in yc.iter_mut().zip(ac).zip(b) {
                *y = f(x, w);
            }
        }
    }
}

/// `y[i] = silu(g[i]) · u[i mod u.len()]`: the vectorized silu (`pn_ops::math`, the same
/// bits as the scalar one), then the product — one rounding each, as the reference's
/// `silu(a) * b` (Binary SwiGlu, the MoE hidden rows).
pub fn swiglu_row(y: &mut [f32], g: &[f32], u: &[f32]) {
    y.copy_from_slice(g);
    pn_ops::math::silu_in_place(y);
    mul_row_in_place(y, u);
}

/// `y[i] *= b[i mod b.len()]`, shaped as [`zip_row`].
fn mul_row_in_place(y: &mut [f32], b: &[f32]) {
    if let [w] = *b {
        y.iter_mut().for_each(|v| *v *= w);
    } else {
        for yc in y.chunks_mut(b.len()) {
            yc.iter_mut().zip(b).for_each(|(v, &w)| *v *= w);
        }
    }
}

pub fn slice_cols(
    ins: &[Value<'_>],
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
) -> Result<Tensor, OpError> {
    fresh("SliceCols", out, |y| slice_cols_into(ins, out, group, offset, len, y))
}

pub fn slice_cols_into(
    ins: &[Value<'_>],
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "SliceCols";
    let x = act_f32(OP, &ins[0])?;
    let n_out = out.shape.0[0];
    let n_in = ins[0].act().shape.0[0];
    par::rows(y, n_out, n_out, |r, yr| {
        let xr = &x[r * n_in..(r + 1) * n_in];
        for (yc, xc) in yr.chunks_mut(len).zip(xr.chunks(group)) {
            yc.copy_from_slice(&xc[offset..offset + len]);
        }
    });
    Ok(())
}

pub fn slice_rows(ins: &[Value<'_>], out: &TensorMeta, start: usize) -> Result<Tensor, OpError> {
    fresh("SliceRows", out, |y| slice_rows_into(ins, out, start, y))
}

pub fn slice_rows_into(ins: &[Value<'_>], out: &TensorMeta, start: usize, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "SliceRows";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let len = out.shape.0[1];
    let src = x.get(start * n..(start + len) * n).ok_or_else(|| OpError::Invalid {
        op: OP,
        msg: format!("rows {start}..{} of {} rows of {n}", start + len, x.len() / n.max(1)),
    })?;
    len_check(OP, src.len(), y.len())?;
    par::copy(y, src);
    Ok(())
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
