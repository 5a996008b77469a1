//! Row normalizations: RmsNorm (spec §4.2), L2Norm (§4.4.3), Softmax (§5).

use super::common::{act_f32, f32_any, out_f32};
use crate::{OpError, Tensor, TensorMeta, Value};

/// y = x * (1/sqrtf(mean(x²) + eps)) [* w], mean accumulated in f64.
pub fn rms_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    const OP: &str = "RmsNorm";
    let x = act_f32(OP, &ins[0])?;
    let w = match ins.get(1) {
        Some(v) => Some(f32_any(OP, v)?.0),
        None => None,
    };
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    if n == 0 {
        return out_f32(OP, out, y);
    }
    for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
        let mut sum = 0.0f64;
        for &v in xr {
            sum += (v as f64) * (v as f64);
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        match &w {
            Some(w) => {
                for i in 0..n {
                    yr[i] = xr[i] * scale * w[i];
                }
            }
            None => {
                for i in 0..n {
                    yr[i] = xr[i] * scale;
                }
            }
        }
    }
    out_f32(OP, out, y)
}

/// y = x * (1/sqrtf(mean + eps/n)) * (1/sqrtf(n)) ≡ x / sqrt(Σx² + eps).
pub fn l2_norm(ins: &[Value<'_>], out: &TensorMeta, eps: f32) -> Result<Tensor, OpError> {
    const OP: &str = "L2Norm";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    if n == 0 {
        return out_f32(OP, out, y);
    }
    let eps_n = eps / n as f32;
    let s2 = 1.0f32 / (n as f32).sqrt();
    for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
        let mut sum = 0.0f64;
        for &v in xr {
            sum += (v as f64) * (v as f64);
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps_n).sqrt();
        for i in 0..n {
            yr[i] = xr[i] * scale * s2;
        }
    }
    out_f32(OP, out, y)
}

/// Per row: e = expf(x − max), sum in f64, y = e * (float)(1/sum).
pub fn softmax(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    const OP: &str = "Softmax";
    let x = act_f32(OP, &ins[0])?;
    let n = out.shape.0[0];
    let mut y = vec![0.0f32; x.len()];
    if n == 0 {
        return out_f32(OP, out, y);
    }
    for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
        let mut m = f32::NEG_INFINITY;
        for &v in xr {
            if v > m {
                m = v;
            }
        }
        let mut sum = 0.0f64;
        for i in 0..n {
            let e = (xr[i] - m).exp();
            yr[i] = e;
            sum += e as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in yr.iter_mut() {
            *v *= inv;
        }
    }
    out_f32(OP, out, y)
}
