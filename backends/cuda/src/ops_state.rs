//! Causal conv with its window state (attention: ops_attn.rs; delta rule: ops_delta.rs).
//!
//! The layer state lives in host memory (`pn_ops::LayerState`) under today's Backend
//! trait, and stays the source of truth: each call uploads the part of the state it
//! reads, runs on the device, and writes the updated state back (docs/cuda.md).

use crate::device::{go, grid1, Device};
use crate::ops_linear::{up_f32, weight};
use crate::CudaError;
use cudarc::driver::PushKernelArg;
use pn_ops::{LayerState, OpError, Tensor, TensorMeta, Value};

pub(crate) fn cuda(op: &'static str) -> impl Fn(CudaError) -> OpError {
    move |e| OpError::Invalid {
        op,
        msg: format!("cuda: {e}"),
    }
}

/// Depthwise causal conv with its window state: state and x uploaded, output and the
/// new state (the last d_conv−1 window rows) computed on the device and downloaded.
pub fn conv1d(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    d_conv: usize,
) -> Result<Tensor, OpError> {
    const OP: &str = "Conv1dCausal";
    let c = out.shape.0[0];
    let t = out.shape.rows();
    let st = pn_ops::reference::common::conv_state(OP, state, d_conv, c)?;
    let ns = d_conv - 1;
    let run = || -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let w = d.weight_f32(&weight(&ins[1])?)?;
        let s0 = d.upload(&st.conv)?;
        let x = up_f32(d, &ins[0])?;
        let mut y = d.alloc::<f32>(c * t)?;
        let mut s1 = d.alloc::<f32>(ns * c)?;
        let (ci, ti, di) = (c as i32, t as i32, d_conv as i32);
        let mut b = d.launch("conv1d_causal")?;
        b.arg(&s0)
            .arg(&x)
            .arg(&w.buf)
            .arg(&mut y)
            .arg(&ci)
            .arg(&ti)
            .arg(&di);
        go(b, grid1(c * t, 256))?;
        let mut b = d.launch("conv_state_update")?;
        b.arg(&s0).arg(&x).arg(&mut s1).arg(&ci).arg(&ti).arg(&di);
        go(b, grid1(ns * c, 256))?;
        Ok((d.download(&y, c * t)?, d.download(&s1, ns * c)?))
    };
    let (y, s1) = run().map_err(cuda(OP))?;
    st.conv.copy_from_slice(&s1);
    Ok(Tensor::f32(out.shape, y))
}
