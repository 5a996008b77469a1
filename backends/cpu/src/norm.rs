//! RmsNorm, L2Norm, Softmax: parallel over rows; each row computed as in the reference.

use crate::par;
use pn_ops::reference::common::{act_f32, out_f32, weight_f32};
use pn_ops::{GgmlType, OpError, Shape, Tensor, TensorMeta, Value};
use std::cell::Cell;

thread_local! {
    /// Small weights (norm gains, biases) decoded to f32, reused from call to call.
    static WBUF: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` with an f32 view of `v`: an activation's data, or a weight decoded into a
/// per-thread buffer (F32 weights without an allocation once the buffer is large
/// enough) — the same values as `f32_any`.
pub(crate) fn with_f32<R>(
    op: &'static str,
    v: &Value<'_>,
    f: impl FnOnce(&[f32], Shape) -> Result<R, OpError>,
) -> Result<R, OpError> {
    match v {
        Value::Act(t) => f(act_f32(op, v)?, t.shape),
        Value::Weight(w) => {
            let mut buf = WBUF.with(Cell::take);
            let n = w.shape.numel();
            let r = if w.ty == GgmlType::F32 && w.bytes.len() >= 4 * n {
                buf.clear();
                buf.extend(
                    w.bytes[..4 * n]
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                f(&buf, w.shape)
            } else {
                f(&weight_f32(op, w)?, w.shape)
            };
            WBUF.with(|c| c.set(buf));
            r
        }
    }
}

#[inline]
fn sum_sq(x: &[f32]) -> f64 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v as f64) * (v as f64);
    }
    sum
}

pub fn rms_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    rms_norm_into(ins, out, eps, &mut y)?;
    out_f32("RmsNorm", out, y)
}

/// `rms_norm` into `y` (`out.shape.numel()` floats; every element written).
pub fn rms_norm_into(ins: &[Value<'_>], out: &TensorMeta, eps: f32, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "RmsNorm";
    match ins.get(1) {
        Some(v) => with_f32(OP, v, |w, _| rms_norm_rows(&ins[0], out, eps, Some(w), y)),
        None => rms_norm_rows(&ins[0], out, eps, None, y),
    }
}

fn rms_norm_rows(x: &Value<'_>, out: &TensorMeta, eps: f32, w: Option<&[f32]>, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "RmsNorm";
    let x = act_f32(OP, x)?;
    let n = out.shape.0[0];
    len_check(OP, x.len(), y.len())?;
    par::rows(y, n, 4 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        let mean = (sum_sq(xr) / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        match w {
            Some(w) => {
                for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w.iter()) {
                    *y = x * scale * w;
                }
            }
            None => {
                for (y, &x) in yr.iter_mut().zip(xr) {
                    *y = x * scale;
                }
            }
        }
    });
    Ok(())
}

/// `x.len() == y.len()` (the output is the input's shape).
pub(crate) fn len_check(op: &'static str, x: usize, y: usize) -> Result<(), OpError> {
    if x == y {
        return Ok(());
    }
    Err(OpError::Invalid {
        op,
        msg: format!("input has {x} elements, output {y}"),
    })
}

pub fn l2_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    l2_norm_into(ins, out, eps, &mut y)?;
    out_f32("L2Norm", out, y)
}

/// `l2_norm` into `y`.
pub fn l2_norm_into(ins: &[Value<'_>], out: &TensorMeta, eps: f32, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "L2Norm";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    len_check(OP, x.len(), y.len())?;
    let eps_n = eps / n as f32;
    let s2 = 1.0f32 / (n as f32).sqrt();
    par::rows(y, n, 4 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        let mean = (sum_sq(xr) / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps_n).sqrt();
        for (y, &x) in yr.iter_mut().zip(xr) {
            *y = x * scale * s2;
        }
    });
    Ok(())
}

pub fn softmax(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    softmax_into(ins, out, &mut y)?;
    out_f32("Softmax", out, y)
}

/// `softmax` into `y` (every element written).
pub fn softmax_into(ins: &[Value<'_>], out: &TensorMeta, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "Softmax";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    len_check(OP, x.len(), y.len())?;
    par::rows(y, n, 16 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        let mut m = f32::NEG_INFINITY;
        for &v in xr {
            if v > m {
                m = v;
            }
        }
        let mut sum = 0.0f64;
        for (y, &x) in yr.iter_mut().zip(xr) {
            let e = (x - m).exp();
            *y = e;
            sum += e as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in yr.iter_mut() {
            *v *= inv;
        }
    });
    Ok(())
}
