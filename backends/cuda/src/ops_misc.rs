//! Norms, softmax, RoPE, routing, element-wise ops and slices on the device, written
//! against [`Cx`] (exec.rs) for both protocols. RoPE reads the positions from device
//! memory (a slot the runner uploads each step), so its launch does not change between
//! decode steps.

use crate::device::grid1;
use crate::exec::{Buf, Cx};
use crate::opnd::{bad, check_ids, f32_any, Opnd};
use crate::CudaError;
use cudarc::driver::LaunchConfig;
use pn_ops::{BinaryOp, RopeMode, TensorMeta, UnaryOp};

fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// RmsNorm (`rms`) or L2Norm over each ne0 row.
pub fn norm(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    eps: f32,
    rms: bool,
) -> Result<(), CudaError> {
    let n = out.shape.0[0];
    let rows = out.shape.rows();
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let x = ins[0].f32()?;
    let d = cx.d;
    let c = if rms {
        let w = match ins.get(1) {
            Some(o) => f32_any(d, o)?.0,
            None => Buf::NULL,
        };
        d.k("rms_norm")?.p(x).p(w).p(y).i(n as i32).f(eps)
    } else {
        d.k("l2_norm")?.p(x).p(y).i(n as i32).f(eps)
    };
    cx.go(c.cfg(rows_cfg(rows, 256)))
}

pub fn softmax(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
) -> Result<(), CudaError> {
    let n = out.shape.0[0];
    let rows = out.shape.rows();
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let x = ins[0].f32()?;
    let c = cx.d.k("softmax_rows")?.p(x).p(y).i(n as i32);
    cx.go(c.cfg(rows_cfg(rows, 256)))
}

/// RoPE: x copied into y, rotated in place there (positions read on the device).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    n_rot: usize,
    mode: RopeMode,
    freq_base: f32,
    freq_scale: f32,
) -> Result<(), CudaError> {
    let (pos, pos_shape) = ins[1].act()?;
    ins[1].i32()?;
    let [dd, h, t, bb] = out.shape.0;
    if pos_shape.numel() != t {
        return Err(bad(format!(
            "{} positions for {t} tokens",
            pos_shape.numel()
        )));
    }
    let (imrope, s) = match mode {
        RopeMode::Normal | RopeMode::Neox => (0i32, [0u32; 4]),
        RopeMode::IMRope { sections } => {
            if sections.iter().sum::<u32>() == 0 {
                return Err(bad("IMRope sections sum to 0"));
            }
            (1, sections)
        }
    };
    // the same expression as pn_ops::reference::common::rope_angles
    let theta_scale = freq_base.powf(-2.0f32 / n_rot as f32);
    let factors = match ins.get(2) {
        Some(o) => f32_any(cx.d, o)?.0,
        None => Buf::NULL,
    };
    let x = ins[0].f32()?;
    let numel = out.shape.numel();
    cx.go(crate::exec::Cmd::Copy {
        dst: y.ptr,
        src: x.ptr,
        bytes: 4 * numel,
    })?;
    let n = n_rot / 2 * h * t * bb;
    if n == 0 {
        return Ok(());
    }
    let c =
        cx.d.k("rope_neox")?
            .p(y)
            .p(pos)
            .i(dd as i32)
            .i(h as i32)
            .i(t as i32)
            .i(bb as i32)
            .i(n_rot as i32)
            .f(theta_scale)
            .f(freq_scale)
            .i(imrope)
            .i(s[0] as i32)
            .i(s[1] as i32)
            .i(s[2] as i32)
            .i(s[3] as i32)
            .p(factors)
            .i((mode == RopeMode::Normal) as i32);
    cx.go(c.cfg(grid1(n, 256)))
}

pub fn topk(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    k: usize,
) -> Result<(), CudaError> {
    let (x, xs) = ins[0].act()?;
    ins[0].f32()?;
    let rows = out.shape.rows();
    if k * rows == 0 {
        return Ok(());
    }
    let c = cx.d.k("topk_rows")?.p(x).p(y).i(xs.0[0] as i32).i(k as i32);
    cx.go(c.cfg(rows_cfg(rows, 256)))
}

pub fn moe_weights(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    normalize: bool,
) -> Result<(), CudaError> {
    let (p, ps) = ins[0].act()?;
    ins[0].f32()?;
    let (ids, is) = ins[1].act()?;
    ins[1].i32()?;
    let e = ps.0[0];
    let (k, t) = (out.shape.0[0], out.shape.rows());
    if ps.numel() < e * t || is.numel() < k * t {
        return Err(bad(format!("probs / ids too short for {t} tokens")));
    }
    check_ids(ins[1].host(), e, "expert id")?;
    if k * t == 0 {
        return Ok(());
    }
    let c =
        cx.d.k("moe_weights")?
            .p(p)
            .p(ids)
            .p(y)
            .i(e as i32)
            .i(k as i32)
            .i(t as i32)
            .i(normalize as i32);
    cx.go(c.cfg(grid1(t, 128)))
}

pub fn unary(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    op: UnaryOp,
) -> Result<(), CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(());
    }
    let x = ins[0].f32()?;
    let (code, s) = match op {
        UnaryOp::Silu => (0i32, 0.0f32),
        UnaryOp::Sigmoid => (1, 0.0),
        UnaryOp::Softplus => (2, 0.0),
        UnaryOp::Exp => (3, 0.0),
        UnaryOp::Scale(s) => (4, s),
    };
    let c = cx.d.k("unary_f32")?.p(x).p(y).l(n as i64).i(code).f(s);
    cx.go(c.cfg(grid1(n, 256)))
}

pub fn binary(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    op: BinaryOp,
) -> Result<(), CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(());
    }
    let a = ins[0].f32()?;
    let (bv, bs, _keep) = f32_any(cx.d, &ins[1])?;
    let code = match op {
        BinaryOp::Add => 0i32,
        BinaryOp::Mul => 1,
        BinaryOp::SwiGlu => 2,
    };
    let [a0, a1, a2, a3] = out.shape.0.map(|v| v as i32);
    let [b0, b1, b2, b3] = bs.0.map(|v| v as i32);
    let c =
        cx.d.k("binary_f32")?
            .p(a)
            .p(bv)
            .p(y)
            .i(a0)
            .i(a1)
            .i(a2)
            .i(a3)
            .i(b0)
            .i(b1)
            .i(b2)
            .i(b3)
            .i(code);
    cx.go(c.cfg(grid1(n, 256)))
}

pub fn slice_cols(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    group: usize,
    offset: usize,
    len: usize,
) -> Result<(), CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(());
    }
    let x = ins[0].f32()?;
    let c =
        cx.d.k("slice_cols")?
            .p(x)
            .p(y)
            .l(n as i64)
            .i(group as i32)
            .i(offset as i32)
            .i(len as i32);
    cx.go(c.cfg(grid1(n, 256)))
}

pub fn slice_rows(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    start: usize,
) -> Result<(), CudaError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(());
    }
    let x = ins[0].f32()?;
    let c =
        cx.d.k("copy_f32")?
            .p(x)
            .p(y)
            .l((start * out.shape.0[0]) as i64)
            .l(n as i64);
    cx.go(c.cfg(grid1(n, 256)))
}

/// `Op::LastRows`: the last row of each sequence (`lens` tokens each, back to back) of
/// `x` `[n, T]` into `y` `[n, lens.len()]`, one device copy per sequence.
pub fn last_rows(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    lens: &[usize],
) -> Result<(), CudaError> {
    let x = ins[0].f32()?;
    let n = out.shape.0[0];
    if lens.len() != out.shape.0[1] || lens.contains(&0) {
        return Err(crate::opnd::bad(format!("{} sequences for {} rows", lens.len(), out.shape.0[1])));
    }
    let mut end = 0;
    for (i, &len) in lens.iter().enumerate() {
        end += len;
        if 4 * n * end > x.bytes {
            return Err(crate::opnd::bad(format!("sequence {i} ends at token {end}, past x")));
        }
        cx.go(crate::exec::Cmd::Copy {
            dst: y.ptr + (4 * n * i) as u64,
            src: x.ptr + (4 * n * (end - 1)) as u64,
            bytes: 4 * n,
        })?;
    }
    Ok(())
}

/// Same data, new shape: a device copy into the output (the resident path's slots never
/// alias; the host path does no device work for it).
pub fn reshape(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
) -> Result<(), CudaError> {
    let (x, _) = ins[0].act()?;
    cx.go(crate::exec::Cmd::Copy {
        dst: y.ptr,
        src: x.ptr,
        bytes: 4 * out.shape.numel(),
    })
}
