//! RmsNorm, L2Norm, Softmax: parallel over rows; each row computed as in the reference.

use crate::par;
use pn_ops::reference::common::{act_f32, f32_any, out_f32};
use pn_ops::{OpError, Tensor, TensorMeta, Value};

#[inline]
fn sum_sq(x: &[f32]) -> f64 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v as f64) * (v as f64);
    }
    sum
}

pub fn rms_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    const OP: &str = "RmsNorm";
    let x = act_f32(OP, &ins[0])?;
    let w = match ins.get(1) {
        Some(v) => Some(f32_any(OP, v)?.0),
        None => None,
    };
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    par::rows(&mut y, n, 4 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        let mean = (sum_sq(xr) / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        match &w {
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
    out_f32(OP, out, y)
}

pub fn l2_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    const OP: &str = "L2Norm";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    let eps_n = eps / n as f32;
    let s2 = 1.0f32 / (n as f32).sqrt();
    par::rows(&mut y, n, 4 * n, |r, yr| {
        let xr = &x[r * n..(r + 1) * n];
        let mean = (sum_sq(xr) / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps_n).sqrt();
        for (y, &x) in yr.iter_mut().zip(xr) {
            *y = x * scale * s2;
        }
    });
    out_f32(OP, out, y)
}

pub fn softmax(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    const OP: &str = "Softmax";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    par::rows(&mut y, n, 16 * n, |r, yr| {
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
    out_f32(OP, out, y)
}
