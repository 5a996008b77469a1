//! GetRows, MatMul and MoeExperts on the device: activation quantization + `mm_<fmt>`.

use crate::device::{go, grid1, DevWeight, Device};
use crate::formats::{act_format, suffix};
use crate::CudaError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use pn_ops::{GgmlType, Tensor, TensorMeta, Value};

/// Warps per block and pairs per warp of the `mm_*` kernels (kernels/matmul.cu).
const MM_WARPS: usize = 4;
const MM_NT_QUANT: usize = 8;
const MM_NT_FLOAT: usize = 4;

pub(crate) fn bad(msg: impl Into<String>) -> CudaError {
    CudaError::Unsupported(msg.into())
}

pub(crate) fn act<'a>(v: &Value<'a>) -> Result<&'a Tensor, CudaError> {
    match v {
        Value::Act(t) => Ok(t),
        Value::Weight(w) => Err(bad(format!(
            "expected an activation, found weight {}",
            w.name
        ))),
    }
}

pub(crate) fn up_f32(d: &Device, v: &Value<'_>) -> Result<CudaSlice<f32>, CudaError> {
    match &act(v)?.data {
        pn_ops::TensorData::F32(x) => d.upload(x),
        pn_ops::TensorData::I32(_) => Err(bad("expected an f32 activation")),
    }
}

pub(crate) fn host_i32<'a>(v: &Value<'a>) -> Result<&'a [i32], CudaError> {
    match &act(v)?.data {
        pn_ops::TensorData::I32(x) => Ok(x),
        pn_ops::TensorData::F32(_) => Err(bad("expected an i32 activation")),
    }
}

pub(crate) fn weight<'a>(v: &Value<'a>) -> Result<pn_ops::WeightView<'a>, CudaError> {
    match v {
        Value::Weight(w) => Ok(*w),
        Value::Act(_) => Err(bad("expected a weight")),
    }
}

/// Download `n` f32 into a tensor of `out`'s shape.
pub(crate) fn out_f32(
    d: &Device,
    buf: &CudaSlice<f32>,
    out: &TensorMeta,
) -> Result<Tensor, CudaError> {
    let n = out.shape.numel();
    Ok(Tensor::f32(out.shape, d.download(buf, n)?))
}

fn check_ids(ids: &[i32], limit: usize, what: &str) -> Result<(), CudaError> {
    match ids.iter().find(|&&i| i < 0 || i as usize >= limit) {
        Some(i) => Err(CudaError::Driver(format!(
            "{what} {i} out of range ({limit})"
        ))),
        None => Ok(()),
    }
}

/// Activation rows on the device in a weight's vec-dot format.
pub(crate) enum Act {
    /// F32 weights dot f32 activations directly.
    F32,
    Q(CudaSlice<u8>),
}

/// Convert `rows` rows of `k` f32 (on the device) to the vec-dot format of `wty`:
/// returns the converted rows and the bytes of one row.
pub(crate) fn quantize(
    d: &Device,
    x: &CudaSlice<f32>,
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
    let nblocks = (n / qk) as i64;
    let n_el = n as i64;
    let name = match at {
        GgmlType::F32 => return Ok((Act::F32, rb)),
        GgmlType::F16 => "quantize_f16",
        GgmlType::BF16 => "quantize_bf16",
        GgmlType::Q8_0 => "quantize_q8_0",
        GgmlType::Q8_1 => "quantize_q8_1",
        _ => "quantize_q8_k",
    };
    let mut buf = d.alloc::<u8>(rows * rb)?;
    let mut b = d.launch(name)?;
    b.arg(x).arg(&mut buf);
    let cfg = if qk == 1 {
        b.arg(&n_el);
        grid1(n, 256)
    } else {
        b.arg(&nblocks);
        grid1(nblocks as usize * 32, 128) // one warp per block, 4 per thread block
    };
    go(b, cfg)?;
    Ok((Act::Q(buf), rb))
}

/// One `mm_<fmt>` launch: Y[p·n_out + r] = row r of matrix (ids ? ids[p] : 0) of `w`
/// (starting `row_off` rows in) · activation row p / act_div.
pub(crate) struct Mm<'a> {
    pub w: &'a DevWeight,
    pub row_off: usize,
    pub n_out: usize,
    pub k: usize,
    pub estride: usize,
    pub ids: Option<(&'a CudaSlice<i32>, usize)>,
    pub x: &'a CudaSlice<f32>,
    pub act: &'a Act,
    pub a_rb: usize,
    pub act_div: usize,
    pub pairs: usize,
}

pub(crate) fn mm(d: &Device, m: &Mm<'_>, y: &mut CudaSlice<f32>) -> Result<(), CudaError> {
    let sfx =
        suffix(m.w.ty).ok_or_else(|| bad(format!("no matmul kernel for {}", m.w.ty.name())))?;
    let float = matches!(m.w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let nb = if float {
        m.k
    } else {
        m.k / m.w.ty.block_size()
    } as i32;
    let nt = if float { MM_NT_FLOAT } else { MM_NT_QUANT };
    let name = format!("mm_{sfx}");
    let wview = m.w.buf.slice(m.row_off * m.w.row_bytes..);
    let (w_rb, estride) = (m.w.row_bytes as i64, m.estride as i64);
    let (a_rb, act_div, n_out, pairs) = (
        m.a_rb as i64,
        m.act_div as i32,
        m.n_out as i32,
        m.pairs as i32,
    );
    let null = 0u64;
    let n_exp = m.ids.map(|(_, e)| e as i32).unwrap_or(1);
    let mut b = d.launch(&name)?;
    b.arg(&wview).arg(&w_rb).arg(&estride);
    match m.ids {
        Some((ids, _)) => b.arg(ids),
        None => b.arg(&null),
    };
    b.arg(&n_exp);
    match m.act {
        Act::F32 => b.arg(m.x),
        Act::Q(q) => b.arg(q),
    };
    b.arg(&a_rb)
        .arg(&act_div)
        .arg(y)
        .arg(&n_out)
        .arg(&nb)
        .arg(&pairs);
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
    go(
        b,
        LaunchConfig {
            grid_dim: grid,
            block_dim: (32 * MM_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        },
    )
}

/// y = W x: x f32 [K, T] -> [N, T].
pub fn matmul(d: &Device, ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, CudaError> {
    let wv = weight(&ins[0])?;
    let (k, n) = (wv.shape.0[0], wv.shape.0[1]);
    let t = out.shape.0[1];
    let w = d.weight(&wv)?;
    let x = up_f32(d, &ins[1])?;
    let (a, a_rb) = quantize(d, &x, t, k, w.ty)?;
    let mut y = d.alloc::<f32>(n * t)?;
    let m = Mm {
        w: &w,
        row_off: 0,
        n_out: n,
        k,
        estride: 0,
        ids: None,
        x: &x,
        act: &a,
        a_rb,
        act_div: 1,
        pairs: t,
    };
    mm(d, &m, &mut y)?;
    out_f32(d, &y, out)
}

/// Embedding lookup: rows of the table dequantized on the device.
pub fn get_rows(d: &Device, ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, CudaError> {
    let wv = weight(&ins[0])?;
    let ids = host_i32(&ins[1])?;
    let (k, vocab) = (wv.shape.0[0], wv.shape.rows());
    check_ids(ids, vocab, "token id")?;
    let w = d.weight(&wv)?;
    let sfx = suffix(w.ty).ok_or_else(|| bad(format!("no get_rows kernel for {}", w.ty.name())))?;
    let t = ids.len();
    let dids = d.upload(ids)?;
    let mut y = d.alloc::<f32>(k * t)?;
    let (rb, ti, ki) = (w.row_bytes as i64, t as i32, k as i32);
    let mut b = d.launch(&format!("get_rows_{sfx}"))?;
    b.arg(&w.buf)
        .arg(&rb)
        .arg(&dids)
        .arg(&ti)
        .arg(&ki)
        .arg(&mut y);
    go(b, grid1(k * t, 256))?;
    out_f32(d, &y, out)
}

/// Routed experts with SwiGLU, grouped by (token, selected expert) pair:
/// G = gate_e x, U = up_e x (mm with ids), H = silu(G) ⊙ U, D = down_e H,
/// out_t = Σ_r w[r,t] · D[t,r] in selection order.
pub fn moe_experts(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    merged: bool,
) -> Result<Tensor, CudaError> {
    let ids_h = host_i32(&ins[1])?;
    let gate_v = weight(&ins[3])?;
    let up_v = if merged { gate_v } else { weight(&ins[4])? };
    let down_v = weight(&ins[if merged { 4 } else { 5 }])?;
    let [f, kd, e, _] = down_v.shape.0;
    let top = act(&ins[1])?.shape.0[0];
    let t = out.shape.0[1];
    let pairs = t * top;
    check_ids(ids_h, e, "expert id")?;
    let (gate, up, down) = (d.weight(&gate_v)?, d.weight(&up_v)?, d.weight(&down_v)?);
    let x = up_f32(d, &ins[0])?;
    let ids = d.upload(ids_h)?;
    let wts = up_f32(d, &ins[2])?;
    let (xg, g_rb) = quantize(d, &x, t, kd, gate.ty)?;
    let same_act = act_format(gate.ty).0 == act_format(up.ty).0;
    let xu = if same_act {
        None
    } else {
        Some(quantize(d, &x, t, kd, up.ty)?)
    };
    let (xu_act, u_rb) = match &xu {
        Some((a, rb)) => (a, *rb),
        None => (&xg, g_rb),
    };
    let gate_rows = gate_v.shape.0[1];
    let mut g = d.alloc::<f32>(pairs * f)?;
    let mut u = d.alloc::<f32>(pairs * f)?;
    let base = Mm {
        w: &gate,
        row_off: 0,
        n_out: f,
        k: kd,
        estride: gate.row_bytes * gate_rows,
        ids: Some((&ids, e)),
        x: &x,
        act: &xg,
        a_rb: g_rb,
        act_div: top,
        pairs,
    };
    mm(d, &base, &mut g)?;
    let up_m = Mm {
        w: &up,
        row_off: if merged { f } else { 0 },
        estride: up.row_bytes * up_v.shape.0[1],
        act: xu_act,
        a_rb: u_rb,
        ..base
    };
    mm(d, &up_m, &mut u)?;
    // H = silu(G) ⊙ U (binary_f32 op 2 with identical shapes)
    let mut h = d.alloc::<f32>(pairs * f)?;
    {
        let (a0, one, op) = (f as i32, 1i32, 2i32);
        let p = pairs as i32;
        let mut b = d.launch("binary_f32")?;
        b.arg(&g)
            .arg(&u)
            .arg(&mut h)
            .arg(&a0)
            .arg(&p)
            .arg(&one)
            .arg(&one);
        b.arg(&a0).arg(&p).arg(&one).arg(&one).arg(&op);
        go(b, grid1(pairs * f, 256))?;
    }
    let (hq, h_rb) = quantize(d, &h, pairs, f, down.ty)?;
    let mut dd = d.alloc::<f32>(pairs * kd)?;
    let down_m = Mm {
        w: &down,
        row_off: 0,
        n_out: kd,
        k: f,
        estride: down.row_bytes * down_v.shape.0[1],
        ids: Some((&ids, e)),
        x: &h,
        act: &hq,
        a_rb: h_rb,
        act_div: 1,
        pairs,
    };
    mm(d, &down_m, &mut dd)?;
    let mut y = d.alloc::<f32>(kd * t)?;
    let (ki, topi, ti) = (kd as i32, top as i32, t as i32);
    let mut b = d.launch("moe_combine")?;
    b.arg(&dd)
        .arg(&wts)
        .arg(&mut y)
        .arg(&ki)
        .arg(&topi)
        .arg(&ti);
    go(b, grid1(kd * t, 256))?;
    out_f32(d, &y, out)
}
