//! GetRows and MatMul: quantized weights × activations converted to the vec-dot type,
//! parallel over weight rows (each output is one `vec_dot`, as in the reference).

use crate::par;
use crate::scratch::Shared;
use pn_ops::quant;
use pn_ops::reference::common::{act_f32, act_format, act_i32, out_f32, qerr, weight};
use pn_ops::{GgmlType, OpError, Tensor, TensorMeta, Value, WeightView};
use rayon::prelude::*;

/// Rows of weights per one-token task at most ([`row_block_one`]).
const ROW_BLOCK_MAX: usize = 256;
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

/// Converted activations, one per process (`crate::scratch`).
static XQ: Shared<Vec<u8>> = Shared::new(Vec::new());

/// Runs `f` with the scratch byte buffer.
pub(crate) fn with_xq<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    XQ.with(f)
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
        let rbo = row_block_one(n);
        let run = |b: usize, ys: &mut [f32]| dot_rows(w, k, b * rbo, ys.len(), xq, rb, 1, ys, 1);
        if n * work < par::SERIAL_WORK || par::outside_pool() {
            y.chunks_mut(rbo).enumerate().for_each(|(b, ys)| run(b, ys));
        } else {
            y.par_chunks_mut(rbo)
                .enumerate()
                .with_min_len((par::SERIAL_WORK / (rbo * work)).max(1))
                .for_each(|(b, ys)| run(b, ys));
        }
        return;
    }
    // Each task: a block of weight rows × every token, written token-major into its
    // columns of y ([t][n]) by `dot_rows_tokens`. Before, the whole product went out as
    // [n][t] and a second pass transposed it (Q4_K 2048 × 8192, 512 tokens, 1 thread:
    // 10% of the call).
    let rbb = row_block_batch(w.ty);
    let sink = crate::transpose::ColumnSink::new(y, t, n);
    let block = |b: usize| {
        let (r0, nr) = (b * rbb, rbb.min(n - b * rbb));
        // SAFETY: block b owns weight rows r0..r0 + nr, i.e. those columns of every
        // token row of y (the sink's), and y stays borrowed until every task is done
        unsafe { dot_rows_tokens(w, k, r0, nr, xq, rb, t, sink.column(r0), n) };
    };
    let blocks = n.div_ceil(rbb);
    if n * t * work < par::SERIAL_WORK || par::outside_pool() {
        (0..blocks).for_each(block);
    } else {
        (0..blocks).into_par_iter().for_each(block);
    }
}

/// Rows `r0..r0 + nr` of `w` · the `t` activation rows of `xq`, token-major: row r,
/// token j at `dst[j·tstride + r]`. Directly where the kernel writes that way (the 16-row
/// AVX-512 kernels on the `rows16` copy), else as an `[nr][t]` block in the thread's
/// scratch ([`dot_rows`]) written transposed while in cache. The same values either way.
///
/// # Safety
/// `dst` is valid for writes at every `j·tstride + r` (`r < nr`, `j < t`), which no one
/// else reads or writes meanwhile; `nr ≤ tstride`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_rows_tokens(w: &WeightView<'_>, k: usize, r0: usize, nr: usize, xq: &[u8], rb: usize, t: usize, dst: *mut f32, tstride: usize) {
    if nr == 0 || t == 0 {
        return;
    }
    if let Some((p, lead)) = rows16_block(w, k, r0, nr) {
        // SAFETY: the caller's contract on dst
        if unsafe { quant::rows16::vec_dot_block_tokens(w.ty, k, p, lead, xq, rb, t, dst, tstride) } {
            // the rows past the copy (a matrix's last `rows % 16`) from the plain bytes
            // SAFETY: rows lead.. of the caller's block, at their columns of dst
            return unsafe { dot_rows_tokens(w, k, r0 + lead, nr - lead, xq, rb, t, dst.add(lead), tstride) };
        }
    }
    if t == 1 {
        // one token: token-major is row-major
        // SAFETY: dst holds nr floats (the caller's contract, j = 0)
        let out = unsafe { std::slice::from_raw_parts_mut(dst, nr) };
        return dot_rows(w, k, r0, nr, xq, rb, 1, out, 1);
    }
    BLOCK.with(|blk| {
        let mut blk = blk.borrow_mut();
        if blk.len() < nr * t {
            blk.resize(nr * t, 0.0);
        }
        let blk = &mut blk[..nr * t];
        dot_rows(w, k, r0, nr, xq, rb, t, blk, t);
        // SAFETY: the caller's contract on dst
        unsafe { crate::transpose::scatter_transposed(blk, nr, t, dst, tstride) };
    });
}

thread_local! {
    /// A task's `[rows][t]` result block (≤ `ROW_BLOCK_BATCH`-ish rows × the batch's
    /// tokens: 128 KB at 64 rows × 512 tokens), one per thread.
    static BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out[r·ostride + j]` = row `r0 + r` of `w` (`k` elements a row) · activation row `j`
/// of `xq` (`rb` bytes apart), for `r < nr`, `j < t`: from the `rows16` copy when there
/// is one and the block starts on a 16-row group, else from the plain rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows(w: &WeightView<'_>, k: usize, r0: usize, nr: usize, xq: &[u8], rb: usize, t: usize, out: &mut [f32], ostride: usize) {
    let lead = match rows16_block(w, k, r0, nr) {
        Some((p, lead)) => {
            quant::rows16::vec_dot_block(w.ty, k, p, lead, xq, rb, t, out, ostride);
            lead
        }
        None => 0,
    };
    if lead < nr {
        // the plain rows: every row, or those past the copy (a matrix's last `rows % 16`)
        let wrb = w.ty.row_bytes(k).unwrap_or(0);
        let out = out.get_mut(lead * ostride..).unwrap_or(&mut []);
        quant::vec_dot_block(w.ty, k, w.bytes.get((r0 + lead) * wrb..).unwrap_or(&[]), wrb, nr - lead, xq, rb, t, out, ostride)
    }
}

/// Rows `r0..` of `w`'s `rows16` copy and how many of the block's `nr` rows it serves
/// (whole 16-row groups: all `nr`, or those before the copy ends), where there is a copy,
/// the block starts on a 16-row group and the copies are read (`rows16_on`); else None
/// (the plain rows).
fn rows16_block<'a>(w: &WeightView<'a>, k: usize, r0: usize, nr: usize) -> Option<(&'a [u8], usize)> {
    let p = w.rows16.filter(|_| r0.is_multiple_of(16) && rows16_on())?;
    let rb = w.ty.row_bytes(k).filter(|&rb| rb > 0)?;
    let lead = (p.len() / rb).saturating_sub(r0).min(nr) / 16 * 16;
    (lead > 0).then(|| (&p[r0 * rb..], lead))
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

/// Rows a one-token matmul task takes: as many as leave each thread 4 tasks (the end of
/// a product balanced to a task's share), in 16-row groups, 16 to `ROW_BLOCK_MAX`. Each
/// task is one kernel call, and a call has its fixed costs (the activations' corrections
/// and scales made again, the scratch borrowed, the weight stream's prefetch started):
/// 16-row tasks, as before, left 7–10% of a one-token Q8_0 2048×4096 / 4096×2048 or
/// Q6_K 512×16384 product on the table against 256 (`moe_bench matmul_few_tokens`, knob
/// 25, Xeon 6/207, 2 threads, calls alternated). A benchmark's knob
/// (`pn_ops::quant::KNOB_ROW_BLOCK`) overrides it.
#[inline]
fn row_block_one(n: usize) -> usize {
    let share = n / (4 * rayon::current_num_threads().max(1));
    tuned!(KNOB_ROW_BLOCK, share.clamp(16, ROW_BLOCK_MAX)).max(16) / 16 * 16
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
