//! Norms, softmax, RoPE, routing, element-wise ops and slices on the device.

use crate::device::{go, grid1, Device};
use crate::ops_linear::{act, bad, host_i32, out_f32, up_f32};
use crate::CudaError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use pn_ops::{BinaryOp, RopeMode, Tensor, TensorMeta, UnaryOp, Value};

fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// An f32 operand that may be an activation or a (small, cached) weight.
enum Operand {
    Act(CudaSlice<f32>),
    Weight(std::sync::Arc<crate::device::DevWeight>),
}

impl Operand {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        match self {
            Operand::Act(x) => b.arg(x),
            Operand::Weight(w) => b.arg(&w.buf),
        };
    }
}

fn f32_any(d: &Device, v: &Value<'_>) -> Result<(Operand, pn_ops::Shape), CudaError> {
    match v {
        Value::Act(t) => Ok((Operand::Act(up_f32(d, v)?), t.shape)),
        Value::Weight(w) => Ok((Operand::Weight(d.weight_f32(w)?), w.shape)),
    }
}

/// RmsNorm (`rms`) or L2Norm over each ne0 row.
pub fn norm(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    eps: f32,
    rms: bool,
) -> Result<Tensor, CudaError> {
    let n = out.shape.0[0];
    let rows = out.shape.rows();
    if n == 0 || rows == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<f32>(n * rows)?;
    let ni = n as i32;
    if rms {
        let w = match ins.get(1) {
            Some(v) => Some(f32_any(d, v)?.0),
            None => None,
        };
        let null = 0u64;
        let mut b = d.launch("rms_norm")?;
        b.arg(&x);
        match &w {
            Some(w) => w.push(&mut b),
            None => {
                b.arg(&null);
            }
        };
        b.arg(&mut y).arg(&ni).arg(&eps);
        go(b, rows_cfg(rows, 256))?;
    } else {
        let mut b = d.launch("l2_norm")?;
        b.arg(&x).arg(&mut y).arg(&ni).arg(&eps);
        go(b, rows_cfg(rows, 256))?;
    }
    out_f32(d, &y, out)
}

pub fn softmax(d: &Device, ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, CudaError> {
    let n = out.shape.0[0];
    let rows = out.shape.rows();
    if n == 0 || rows == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<f32>(n * rows)?;
    let ni = n as i32;
    let mut b = d.launch("softmax_rows")?;
    b.arg(&x).arg(&mut y).arg(&ni);
    go(b, rows_cfg(rows, 256))?;
    out_f32(d, &y, out)
}

pub fn rope(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    n_rot: usize,
    mode: RopeMode,
    freq_base: f32,
    freq_scale: f32,
) -> Result<Tensor, CudaError> {
    let pos = host_i32(&ins[1])?;
    let [dd, h, t, bb] = out.shape.0;
    if pos.len() != t {
        return Err(bad(format!("{} positions for {t} tokens", pos.len())));
    }
    let (imrope, s) = match mode {
        RopeMode::Neox => (0i32, [0u32; 4]),
        RopeMode::IMRope { sections } => {
            if sections.iter().sum::<u32>() == 0 {
                return Err(bad("IMRope sections sum to 0"));
            }
            (1, sections)
        }
    };
    // the same expression as pn_ops::reference::common::rope_angles
    let theta_scale = freq_base.powf(-2.0f32 / n_rot as f32);
    let mut x = up_f32(d, &ins[0])?;
    let dpos = d.upload(pos)?;
    let n = n_rot / 2 * h * t * bb;
    if n > 0 {
        let (di, hi, ti, bi, nr) = (dd as i32, h as i32, t as i32, bb as i32, n_rot as i32);
        let (s0, s1, s2, s3) = (s[0] as i32, s[1] as i32, s[2] as i32, s[3] as i32);
        let mut b = d.launch("rope_neox")?;
        b.arg(&mut x)
            .arg(&dpos)
            .arg(&di)
            .arg(&hi)
            .arg(&ti)
            .arg(&bi)
            .arg(&nr);
        b.arg(&theta_scale)
            .arg(&freq_scale)
            .arg(&imrope)
            .arg(&s0)
            .arg(&s1)
            .arg(&s2)
            .arg(&s3);
        go(b, grid1(n, 256))?;
    }
    out_f32(d, &x, out)
}

pub fn topk(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    k: usize,
) -> Result<Tensor, CudaError> {
    let n = act(&ins[0])?.shape.0[0];
    let rows = out.shape.rows();
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<i32>(k * rows)?;
    let (ni, ki) = (n as i32, k as i32);
    let mut b = d.launch("topk_rows")?;
    b.arg(&x).arg(&mut y).arg(&ni).arg(&ki);
    go(b, rows_cfg(rows, 256))?;
    Ok(Tensor::i32(out.shape, d.download(&y, k * rows)?))
}

pub fn moe_weights(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    normalize: bool,
) -> Result<Tensor, CudaError> {
    let e = act(&ins[0])?.shape.0[0];
    let ids_h = host_i32(&ins[1])?;
    let (k, t) = (out.shape.0[0], out.shape.rows());
    if act(&ins[0])?.shape.numel() < e * t || ids_h.len() < k * t {
        return Err(bad(format!("probs / ids too short for {t} tokens")));
    }
    if let Some(i) = ids_h.iter().find(|&&i| i < 0 || i as usize >= e) {
        return Err(CudaError::Driver(format!(
            "expert id {i} out of range ({e} experts)"
        )));
    }
    let p = up_f32(d, &ins[0])?;
    let ids = d.upload(ids_h)?;
    let mut y = d.alloc::<f32>(k * t)?;
    let (ei, ki, ti, ni) = (e as i32, k as i32, t as i32, normalize as i32);
    let mut b = d.launch("moe_weights")?;
    b.arg(&p)
        .arg(&ids)
        .arg(&mut y)
        .arg(&ei)
        .arg(&ki)
        .arg(&ti)
        .arg(&ni);
    go(b, grid1(t, 128))?;
    out_f32(d, &y, out)
}

pub fn unary(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    op: UnaryOp,
) -> Result<Tensor, CudaError> {
    let n = out.shape.numel();
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<f32>(n)?;
    let (code, s) = match op {
        UnaryOp::Silu => (0i32, 0.0f32),
        UnaryOp::Sigmoid => (1, 0.0),
        UnaryOp::Softplus => (2, 0.0),
        UnaryOp::Exp => (3, 0.0),
        UnaryOp::Scale(s) => (4, s),
    };
    let ni = n as i64;
    let mut b = d.launch("unary_f32")?;
    b.arg(&x).arg(&mut y).arg(&ni).arg(&code).arg(&s);
    go(b, grid1(n, 256))?;
    out_f32(d, &y, out)
}

pub fn binary(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    op: BinaryOp,
) -> Result<Tensor, CudaError> {
    let n = out.shape.numel();
    let a = up_f32(d, &ins[0])?;
    let (bv, bs) = f32_any(d, &ins[1])?;
    let mut y = d.alloc::<f32>(n)?;
    let code = match op {
        BinaryOp::Add => 0i32,
        BinaryOp::Mul => 1,
        BinaryOp::SwiGlu => 2,
    };
    let ad: Vec<i32> = out.shape.0.iter().map(|&v| v as i32).collect();
    let bd: Vec<i32> = bs.0.iter().map(|&v| v as i32).collect();
    let mut b = d.launch("binary_f32")?;
    b.arg(&a);
    bv.push(&mut b);
    b.arg(&mut y);
    b.arg(&ad[0]).arg(&ad[1]).arg(&ad[2]).arg(&ad[3]);
    b.arg(&bd[0]).arg(&bd[1]).arg(&bd[2]).arg(&bd[3]).arg(&code);
    go(b, grid1(n, 256))?;
    out_f32(d, &y, out)
}

pub fn slice_cols(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
) -> Result<Tensor, CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<f32>(n)?;
    let (ni, gi, oi, li) = (n as i64, group as i32, offset as i32, len as i32);
    let mut b = d.launch("slice_cols")?;
    b.arg(&x).arg(&mut y).arg(&ni).arg(&gi).arg(&oi).arg(&li);
    go(b, grid1(n, 256))?;
    out_f32(d, &y, out)
}

pub fn slice_rows(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    start: usize,
) -> Result<Tensor, CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    let x = up_f32(d, &ins[0])?;
    let mut y = d.alloc::<f32>(n)?;
    let (s, ni) = ((start * out.shape.0[0]) as i64, n as i64);
    let mut b = d.launch("copy_f32")?;
    b.arg(&x).arg(&mut y).arg(&s).arg(&ni);
    go(b, grid1(n, 256))?;
    out_f32(d, &y, out)
}
