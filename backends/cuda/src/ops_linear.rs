//! GetRows, MatMul and MoeExperts on the device: activation quantization + `mm_<fmt>`.
//! Written against [`Cx`] (exec.rs): the host and resident protocols share them.

use crate::device::{grid1, DevWeight};
use crate::exec::{Buf, Cx};
use crate::formats::{act_format, suffix};
use crate::opnd::{bad, check_ids, Opnd};
use crate::CudaError;
use cudarc::driver::LaunchConfig;
use pn_ops::{GgmlType, TensorMeta};

/// Warps per block and pairs per warp of the `mm_*` kernels (kernels/matmul.cu).
const MM_WARPS: usize = 4;
const MM_NT_QUANT: usize = 8;
const MM_NT_FLOAT: usize = 4;

/// Activation rows on the device in a weight's vec-dot format: `None` for f32 weights
/// (they dot the f32 activations directly), else the converted rows.
pub(crate) type Act = Option<Buf>;

/// Convert `rows` rows of `k` f32 (on the device) to the vec-dot format of `wty`:
/// returns the converted rows and the bytes of one row.
pub(crate) fn quantize(
    cx: &mut Cx<'_>,
    x: Buf,
    rows: usize,
    k: usize,
    wty: GgmlType,
) -> Result<(Act, usize), CudaError> {
    let (at, qk, bb) = act_format(wty);
    if !k.is_multiple_of(qk) {
        return Err(bad(format!(
            "row of {k} elements cannot be converted to {} (block {qk})",
            at.name()
        )));
    }
    let rb = k / qk * bb;
    let n = rows * k;
    let nblocks = n / qk;
    let name = match at {
        GgmlType::F32 => return Ok((None, rb)),
        GgmlType::F16 => "quantize_f16",
        GgmlType::BF16 => "quantize_bf16",
        GgmlType::Q8_0 => "quantize_q8_0",
        GgmlType::Q8_1 => "quantize_q8_1",
        _ => "quantize_q8_k",
    };
    let buf = cx.tmp(rows * rb)?;
    let b = cx.d.k(name)?.p(x).p(buf);
    let c = if qk == 1 {
        b.l(n as i64).cfg(grid1(n, 256))
    } else {
        b.l(nblocks as i64).cfg(grid1(nblocks * 32, 128)) // one warp per block, 4 per thread block
    };
    cx.go(c)?;
    Ok((Some(buf), rb))
}

/// One `mm_<fmt>` launch: Y[p·n_out + r] = row r of matrix (ids ? ids[p] : 0) of `w`
/// (starting `row_off` rows in) · activation row p / act_div.
#[derive(Clone, Copy)]
pub(crate) struct Mm<'a> {
    pub w: &'a DevWeight,
    pub row_off: usize,
    pub n_out: usize,
    pub k: usize,
    pub estride: usize,
    pub ids: Option<(Buf, usize)>,
    pub x: Buf,
    pub act: Act,
    pub a_rb: usize,
    pub act_div: usize,
    pub pairs: usize,
}

pub(crate) fn mm(cx: &mut Cx<'_>, m: &Mm<'_>, y: Buf) -> Result<(), CudaError> {
    let sfx =
        suffix(m.w.ty).ok_or_else(|| bad(format!("no matmul kernel for {}", m.w.ty.name())))?;
    let float = matches!(m.w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let nb = if float {
        m.k
    } else {
        m.k / m.w.ty.block_size()
    } as i32;
    let nt = if float { MM_NT_FLOAT } else { MM_NT_QUANT };
    let grid = (
        m.n_out.div_ceil(MM_WARPS) as u32,
        m.pairs.div_ceil(nt) as u32,
        1,
    );
    if grid.1 > 65535 {
        return Err(bad(format!(
            "{} rows in one matmul (at most {})",
            m.pairs,
            65535 * nt
        )));
    }
    let wview = m.w.ptr.from(m.row_off * m.w.row_bytes);
    let (ids, n_exp) = match m.ids {
        Some((ids, e)) => (ids, e as i32),
        None => (Buf::NULL, 1),
    };
    let c =
        cx.d.k(&format!("mm_{sfx}"))?
            .p(wview)
            .l(m.w.row_bytes as i64)
            .l(m.estride as i64)
            .p(ids)
            .i(n_exp)
            .p(m.act.unwrap_or(m.x))
            .l(m.a_rb as i64)
            .i(m.act_div as i32)
            .p(y)
            .i(m.n_out as i32)
            .i(nb)
            .i(m.pairs as i32)
            .cfg(LaunchConfig {
                grid_dim: grid,
                block_dim: (32 * MM_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            });
    cx.go(c)
}

/// y = W x: x f32 [K, T] -> [N, T].
pub fn matmul(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
) -> Result<(), CudaError> {
    let wv = ins[0].weight()?;
    let (k, n) = (wv.shape.0[0], wv.shape.0[1]);
    let t = out.shape.0[1];
    if n * t == 0 {
        return Ok(());
    }
    let w = cx.d.weight(&wv)?;
    let x = ins[1].f32()?;
    let (a, a_rb) = quantize(cx, x, t, k, w.ty)?;
    let m = Mm {
        w: &w,
        row_off: 0,
        n_out: n,
        k,
        estride: 0,
        ids: None,
        x,
        act: a,
        a_rb,
        act_div: 1,
        pairs: t,
    };
    mm(cx, &m, y)
}

/// Embedding lookup: rows of the table dequantized on the device.
pub fn get_rows(cx: &mut Cx<'_>, ins: &[Opnd<'_>], y: Buf) -> Result<(), CudaError> {
    let wv = ins[0].weight()?;
    let (ids, ids_shape) = ins[1].act()?;
    ins[1].i32()?;
    let (k, vocab) = (wv.shape.0[0], wv.shape.rows());
    check_ids(ins[1].host(), vocab, "token id")?;
    let t = ids_shape.numel();
    if k * t == 0 {
        return Ok(());
    }
    let w = cx.d.weight(&wv)?;
    let sfx = suffix(w.ty).ok_or_else(|| bad(format!("no get_rows kernel for {}", w.ty.name())))?;
    let c =
        cx.d.k(&format!("get_rows_{sfx}"))?
            .p(w.ptr)
            .l(w.row_bytes as i64)
            .p(ids)
            .i(t as i32)
            .i(k as i32)
            .p(y)
            .i(vocab as i32)
            .cfg(grid1(k * t, 256));
    cx.go(c)
}

/// Routed experts with SwiGLU, grouped by (token, selected expert) pair:
/// G = gate_e x, U = up_e x (mm with ids), H = silu(G) ⊙ U, D = down_e H,
/// out_t = Σ_r w[r,t] · D[t,r] in selection order.
pub fn moe_experts(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    merged: bool,
) -> Result<(), CudaError> {
    let (ids, ids_shape) = ins[1].act()?;
    ins[1].i32()?;
    let gate_v = ins[3].weight()?;
    let up_v = if merged { gate_v } else { ins[4].weight()? };
    let down_v = ins[if merged { 4 } else { 5 }].weight()?;
    let [f, kd, e, _] = down_v.shape.0;
    let top = ids_shape.0[0];
    let t = out.shape.0[1];
    let pairs = t * top;
    check_ids(ins[1].host(), e, "expert id")?;
    if kd * t == 0 {
        return Ok(());
    }
    let d = cx.d;
    let (gate, up, down) = (d.weight(&gate_v)?, d.weight(&up_v)?, d.weight(&down_v)?);
    let x = ins[0].f32()?;
    let wts = ins[2].f32()?;
    let (xg, g_rb) = quantize(cx, x, t, kd, gate.ty)?;
    let same_act = act_format(gate.ty).0 == act_format(up.ty).0;
    let (xu_act, u_rb) = if same_act {
        (xg, g_rb)
    } else {
        quantize(cx, x, t, kd, up.ty)?
    };
    let g = cx.tmp4(pairs * f)?;
    let u = cx.tmp4(pairs * f)?;
    let base = Mm {
        w: &gate,
        row_off: 0,
        n_out: f,
        k: kd,
        estride: gate.row_bytes * gate_v.shape.0[1],
        ids: Some((ids, e)),
        x,
        act: xg,
        a_rb: g_rb,
        act_div: top,
        pairs,
    };
    mm(cx, &base, g)?;
    let up_m = Mm {
        w: &up,
        row_off: if merged { f } else { 0 },
        estride: up.row_bytes * up_v.shape.0[1],
        act: xu_act,
        a_rb: u_rb,
        ..base
    };
    mm(cx, &up_m, u)?;
    // H = silu(G) ⊙ U (binary_f32 op 2 with identical shapes)
    let h = cx.tmp4(pairs * f)?;
    let (a0, p) = (f as i32, pairs as i32);
    let c = d
        .k("binary_f32")?
        .p(g)
        .p(u)
        .p(h)
        .i(a0)
        .i(p)
        .i(1)
        .i(1)
        .i(a0)
        .i(p)
        .i(1)
        .i(1)
        .i(2);
    cx.go(c.cfg(grid1(pairs * f, 256)))?;
    let (hq, h_rb) = quantize(cx, h, pairs, f, down.ty)?;
    let dd = cx.tmp4(pairs * kd)?;
    let down_m = Mm {
        w: &down,
        row_off: 0,
        n_out: kd,
        k: f,
        estride: down.row_bytes * down_v.shape.0[1],
        ids: Some((ids, e)),
        x: h,
        act: hq,
        a_rb: h_rb,
        act_div: 1,
        pairs,
    };
    mm(cx, &down_m, dd)?;
    let c = d
        .k("moe_combine")?
        .p(dd)
        .p(wts)
        .p(y)
        .i(kd as i32)
        .i(top as i32)
        .i(t as i32);
    cx.go(c.cfg(grid1(kd * t, 256)))
}
