//! GetRows and MatMul: quantized weights × activations converted to the vec-dot type,
//! parallel over weight rows (each output is one `vec_dot`, as in the reference).

use crate::par;
use crate::scratch::Shared;
use pn_ops::quant;
use pn_ops::reference::common::{act_f32, act_format, act_i32, out_f32, qerr, weight};
use pn_ops::{GgmlType, OpError, Tensor, TensorMeta, Value, WeightView};
use rayon::prelude::*;

/// Rows of weights per parallel task.
const ROW_BLOCK: usize = 16;
/// Rows of weights per parallel task with several tokens (8-row groups of the packed
/// kernels; the next group's rows are prefetched inside a task).
const ROW_BLOCK_BATCH: usize = 64;

pub fn get_rows(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    get_rows_into(ins, out, &mut y)?;
    out_f32("GetRows", out, y)
}

/// `get_rows` into `y` (every element written).
pub fn get_rows_into(ins: &[Value<'_>], _out: &TensorMeta, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "GetRows";
    let table = weight(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let k = table.shape.0[0];
    let vocab = table.shape.rows();
    if let Some(&id) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("token id {id} out of range (vocab size {vocab})"),
        });
    }
    crate::norm::len_check(OP, k * ids.len(), y.len())?;
    let err = std::sync::Mutex::new(None);
    par::rows(y, k, 4 * k, |t, row| {
        if let Err(e) = quant::dequantize_row(table.ty, table.row(ids[t] as usize), row) {
            *err.lock().unwrap() = Some(qerr(OP, e));
        }
    });
    if let Some(e) = err.into_inner().unwrap() {
        return Err(e);
    }
    Ok(())
}

/// Convert `t` activation rows of `k` floats to `at` (`rb` bytes each) into `q` (resized;
/// its allocation reused), in parallel.
pub fn quantize_rows_to(at: GgmlType, x: &[f32], k: usize, rb: usize, q: &mut Vec<u8>) {
    let t = x.len().checked_div(k).unwrap_or(0);
    q.clear();
    q.resize(t * rb, 0);
    if rb == 0 {
        return;
    }
    if t <= 1 || t * k < par::SERIAL_WORK || par::outside_pool() {
        for (i, r) in q.chunks_mut(rb).enumerate() {
            quant::quantize_row(at, &x[i * k..(i + 1) * k], r);
        }
    } else {
        q.par_chunks_mut(rb)
            .enumerate()
            .for_each(|(i, r)| quant::quantize_row(at, &x[i * k..(i + 1) * k], r));
    }
}

/// Converted activations and the `[n][t]` result block, one each per process
/// (`crate::scratch`).
static XQ: Shared<Vec<u8>> = Shared::new(Vec::new());
static TMP: Shared<Vec<f32>> = Shared::new(Vec::new());

/// Runs `f` with the scratch byte buffer.
pub(crate) fn with_xq<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    XQ.with(f)
}

/// Largest scratch kept between calls (floats): bigger ones (a long prefill's logits)
/// are freed after the call, so they do not add to the resident set for good. 8 M (32
/// MB) keeps a 512-token pass's widest projection (8192 rows: 4.2 M floats); at 4 M that
/// buffer was freed and faulted in again (zeroed pages) at every such call: full-dims
/// pp512 median 219 → 244 tok/s (AVX-512 + AMX), 142 → 156 (AVX2), four rounds
/// alternated, Intel Xeon 6/207 (docs/perf.md "Session 23").
const TMP_KEEP: usize = 1 << 23;

/// Runs `f` with the scratch float buffer.
pub(crate) fn with_tmp<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    TMP.with(|v| {
        let r = f(v);
        if v.capacity() > TMP_KEEP {
            *v = Vec::new();
        }
        r
    })
}

/// y[ti·n + r] = vec_dot(wty, k, row r of `w`, xq[ti]) for r < n, ti < t, where `w` holds
/// `n` weight rows of `wty` (`w.rows16`: the same rows interleaved, when made) and `xq`
/// holds `t` converted activation rows of `rb` bytes. Parallel over blocks of weight rows
/// (whole 16-row groups); inside a block, [`dot_rows`] dots the rows with all the tokens,
/// each decoded weight block shared by a tile of tokens (bitwise equal to `vec_dot`
/// whatever the tiling, so results do not depend on the batch or the thread count).
pub fn gemm(w: &WeightView<'_>, k: usize, n: usize, xq: &[u8], rb: usize, t: usize, y: &mut [f32]) {
    debug_assert_eq!(y.len(), n * t);
    if n == 0 || t == 0 {
        return;
    }
    let work = k.max(1);
    if t == 1 {
        // y is [n]: split it by row blocks directly.
        let run = |b: usize, ys: &mut [f32]| dot_rows(w, k, b * ROW_BLOCK, ys.len(), xq, rb, 1, ys, 1);
        if n * work < par::SERIAL_WORK || par::outside_pool() {
            y.chunks_mut(ROW_BLOCK).enumerate().for_each(|(b, ys)| run(b, ys));
        } else {
            y.par_chunks_mut(ROW_BLOCK)
                .enumerate()
                .with_min_len((par::SERIAL_WORK / (ROW_BLOCK * work)).max(1))
                .for_each(|(b, ys)| run(b, ys));
        }
        return;
    }
    // Compute [n][t] blocks (rows × tokens, tiled), then transpose into [t][n].
    with_tmp(|tmp| {
    // (grown only: every element of the first n·t is written below, so no zeroing
    // pass over the block each call)
    if tmp.len() < n * t {
        tmp.resize(n * t, 0.0);
    }
    let tmp = &mut tmp[..n * t];
    let rbb = row_block_batch(w.ty);
    let block = |b: usize, ys: &mut [f32]| dot_rows(w, k, b * rbb, ys.len() / t, xq, rb, t, ys, t);
    if n * t * work < par::SERIAL_WORK || par::outside_pool() {
        tmp.chunks_mut(rbb * t)
            .enumerate()
            .for_each(|(b, ys)| block(b, ys));
    } else {
        tmp.par_chunks_mut(rbb * t)
            .enumerate()
            .for_each(|(b, ys)| block(b, ys));
    }
    par::transpose(tmp, n, t, y);
    })
}

/// `out[r·ostride + j]` = row `r0 + r` of `w` (`k` elements a row) · activation row `j`
/// of `xq` (`rb` bytes apart), for `r < nr`, `j < t`: from the `rows16` copy when there
/// is one and the block starts on a 16-row group, else from the plain rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows(w: &WeightView<'_>, k: usize, r0: usize, nr: usize, xq: &[u8], rb: usize, t: usize, out: &mut [f32], ostride: usize) {
    let wrb = w.ty.row_bytes(k).unwrap_or(0);
    match w.rows16 {
        Some(p) if r0 % 16 == 0 && nr % 16 == 0 && rows16_on() => {
            quant::rows16::vec_dot_block(w.ty, k, p.get(r0 * wrb..).unwrap_or(&[]), nr, xq, rb, t, out, ostride)
        }
        _ => quant::vec_dot_block(w.ty, k, w.bytes.get(r0 * wrb..).unwrap_or(&[]), wrb, nr, xq, rb, t, out, ostride),
    }
}

/// Rows a batched matmul task takes: `ROW_BLOCK_BATCH`; the Q8_0-activation formats 256
/// (their kernels prepare every token's per-block corrections and AMX tiles once a call:
/// Q8_0 2048×4096 at 32 / 128 tokens 1.74 / 6.18 → 1.49 / 5.44 ms, `moe_bench
/// matmul_few_tokens`, Xeon 6/207, 2 threads, calls alternated); a benchmark's knob
/// (`pn_ops::quant::KNOB_ROW_BLOCK_BATCH`) overrides both.
#[inline]
fn row_block_batch(ty: GgmlType) -> usize {
    use GgmlType::*;
    let rows = if matches!(ty, Q8_0 | Q4_0 | IQ4NL | MXFP4) { 256 } else { ROW_BLOCK_BATCH };
    tuned!(KNOB_ROW_BLOCK_BATCH, rows).max(16) / 16 * 16
}

/// Whether the `rows16` copies are read (a benchmark's A/B may turn them off:
/// `pn_ops::quant::KNOB_ROWS16`).
#[inline]
fn rows16_on() -> bool {
    tuned!(KNOB_ROWS16, 1) != 0
}

pub fn matmul(ins: &[Value<'_>], out: &TensorMeta) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    matmul_into(ins, out, &mut y)?;
    out_f32("MatMul", out, y)
}

/// `matmul` into `y` (every element written).
pub fn matmul_into(ins: &[Value<'_>], out: &TensorMeta, y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "MatMul";
    let w = weight(OP, &ins[0])?;
    let x = act_f32(OP, &ins[1])?;
    let k = w.shape.0[0];
    let n = w.shape.0[1];
    let t = out.shape.0[1];
    if x.len() != k * t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("x has {} elements, expected {k}×{t}", x.len()),
        });
    }
    let (at, rb) = act_format(OP, w.ty, k)?;
    crate::norm::len_check(OP, n * t, y.len())?;
    with_xq(|xq| {
        quantize_rows_to(at, x, k, rb, xq);
        gemm(&w, k, n, xq, rb, t, y);
    });
    Ok(())
}
