//! The `rows16` layout: a Q4_K, Q5_K, Q6_K or IQ4_XS weight (or a Q8_0, Q4_0, IQ4_NL or
//! MXFP4 one) with its rows interleaved 16 at a time, block by block, as the AVX-512 VNNI
//! 16-row kernels read them (`x86_rows16`, `x86_pack_q8`). A host backend makes it once
//! at load, for the weights its matmuls stream every step; the plain bytes stay the
//! weight's (`WeightView::bytes`), this is a second copy (`WeightView::rows16`) whose dots
//! are bitwise the plain rows' `vec_dot`. The same size as the plain rows it holds.
//!
//! On a CPU with AVX2 but not AVX-512 VNNI the copy (every format above) is
//! the 8-row layout of the AVX2 kernels instead (`x86_rows8`, `x86_rows8_q8`: each 16-row
//! group as two 8-row groups): the same contract, the same size.

use crate::GgmlType;

/// Whether a `[n, rows]` weight (or a stack of such matrices) of `ty` takes the
/// `rows16` layout on this CPU: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q4_0, IQ4_NL or MXFP4,
/// whole blocks, rows in whole 16-row groups, on AVX-512 VNNI or (the 8-row layout) on
/// plain AVX2, and `PN_NO_REPACK=1` not set.
/// The loader makes the copy wherever it can: measured (`moe_bench matmul_few_tokens`,
/// Intel Xeon 6/207, 2 threads, calls alternated, GB/s of weights plain → `rows16`): one
/// token Q4_K 2048×4096 14.7 → 25.7, Q6_K 2048×8192 18.0 → 20.6; 2 tokens 15.4 → 20.3 /
/// 13.4 → 17.6; 16 tokens 4.2 → 4.3 / 4.4 → 4.8; Q8_0 2048×4096 one token 10.0 → 18.6.
pub fn available(ty: GgmlType, n: usize, rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        enabled() && kind_here(ty).is_some() && n > 0 && n.is_multiple_of(ty.block_size()) && rows > 0 && rows.is_multiple_of(16)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, n, rows);
        false
    }
}

/// The CPU can run the `rows16` kernels (AVX-512 VNNI) or the 8-row ones (AVX2) and
/// `PN_NO_REPACK` is not set (detected once).
#[cfg(target_arch = "x86_64")]
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::x86::has_avx2() && std::env::var_os("PN_NO_REPACK").is_none_or(|v| v.is_empty() || v == "0"))
}

/// This CPU's layout of `ty`: `(true, kind)` the 16-row one (AVX-512 VNNI), `(false,
/// kind)` the 8-row one (plain AVX2), None when `ty` has none here.
#[cfg(target_arch = "x86_64")]
fn kind_here(ty: GgmlType) -> Option<(bool, u8)> {
    if super::x86::has_vnni() {
        super::x86_rows16::kind(ty).map(|k| (true, k))
    } else {
        super::x86_rows8::kind(ty).map(|k| (false, k))
    }
}

/// `src` (`rows` plain rows of `n` elements of `ty`, as [`available`] allows) into `dst`
/// in the `rows16` layout. False (nothing written) when `available` says no or the
/// lengths are not `rows` rows.
pub fn repack(ty: GgmlType, n: usize, rows: usize, src: &[u8], dst: &mut [u8]) -> bool {
    let Some(rb) = ty.row_bytes(n) else { return false };
    if !available(ty, n, rows) || src.len() != rows * rb || dst.len() != src.len() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        match kind_here(ty).expect("available") {
            (true, kind) => super::x86_rows16::repack_into(kind, src, dst, rows, n / ty.block_size()),
            (false, kind) => super::x86_rows8::repack_into(kind, src, dst, rows, n / ty.block_size()),
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out[r·ostride + j] = vec_dot(ty, n, plain row r, &acts[j·astride..])` for `r < rows`,
/// `j < m`, where `w` holds the `rows` rows in the `rows16` layout (`rows` a multiple of
/// 16; a block of rows starts at a multiple of 16). Bitwise [`super::vec_dot`] of the
/// plain rows. Never panics: when the lengths do not fit or the layout is not available,
/// every output it can reach is NaN.
#[allow(clippy::too_many_arguments)]
pub fn vec_dot_block(ty: GgmlType, n: usize, w: &[u8], rows: usize, acts: &[u8], astride: usize, m: usize, out: &mut [f32], ostride: usize) {
    if m == 0 || rows == 0 {
        return;
    }
    let ok = inputs_fit(ty, n, w, rows, acts, astride, m) && m <= ostride && (rows - 1) * ostride + m <= out.len();
    #[cfg(target_arch = "x86_64")]
    if ok {
        // SAFETY: the inputs checked by `inputs_fit`, out's extent above.
        unsafe { block(ty, n, w, rows, acts, astride, m, super::x86_pack16::Out::rows(out, ostride)) };
        return;
    }
    let _ = ok;
    for r in 0..rows {
        if let Some(o) = out.get_mut(r * ostride..) {
            o.iter_mut().take(m).for_each(|v| *v = f32::NAN);
        }
    }
}

/// [`vec_dot_block`] written token-major: `out[j·tstride + r]` for `r < rows`, `j < m`
/// (a batch's `[t][n]` output in place, rows `r0..` of it at `out`), the kernels storing
/// each token's rows as one vector. Returns false, and writes nothing, where this CPU has
/// no layout for `ty`, the lengths do not fit, or knob 24 (`KNOB_TOKEN_MAJOR`) is 0: the
/// caller then takes `vec_dot_block` and transposes.
///
/// # Safety
/// `out` is valid for writes at every `j·tstride + r` (`r < rows`, `j < m`), which no
/// one else reads or writes meanwhile; `rows ≤ tstride`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn vec_dot_block_tokens(ty: GgmlType, n: usize, w: &[u8], rows: usize, acts: &[u8], astride: usize, m: usize, out: *mut f32, tstride: usize) -> bool {
    if m == 0 || rows == 0 {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if inputs_fit(ty, n, w, rows, acts, astride, m) && rows <= tstride && super::x86_block::knob(super::x86_block::KNOB_TOKEN_MAJOR, 1) != 0 {
        // SAFETY: the inputs checked by `inputs_fit`, `out`'s extent the caller's contract.
        unsafe { block(ty, n, w, rows, acts, astride, m, super::x86_pack16::Out::tokens(out, tstride)) };
        return true;
    }
    let _ = (ty, n, w, acts, astride, out, tstride);
    false
}

/// Whether this CPU has a layout for `ty` and `rows` rows of it at `w` and `m` activation
/// rows at `acts` (`astride` apart) hold what the kernels read.
fn inputs_fit(ty: GgmlType, n: usize, w: &[u8], rows: usize, acts: &[u8], astride: usize, m: usize) -> bool {
    let ab = super::vec_dot_type(ty).row_bytes(n);
    available(ty, n, rows)
        && ty.row_bytes(n).is_some_and(|rb| w.len() >= rows * rb)
        && ab.is_some_and(|ab| (m == 1 || ab <= astride) && (m - 1) * astride + ab <= acts.len())
}

/// The layout's kernels (16-row on AVX-512 VNNI, 8-row on plain AVX2) into `o`.
///
/// # Safety
/// `inputs_fit` holds; `o` holds every (row, token) of the block (`Out`'s contract).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(ty: GgmlType, n: usize, w: &[u8], rows: usize, acts: &[u8], astride: usize, m: usize, o: super::x86_pack16::Out) {
    // SAFETY: the layout's CPU features detected (`available`, in `inputs_fit`); the
    // lengths and `o` the caller's contract.
    unsafe {
        match kind_here(ty).expect("available") {
            (true, kind) => super::x86_rows16::block(kind, n, w, rows, acts, astride, m, o),
            (false, kind) => super::x86_rows8::block(kind, n, w, rows, acts, astride, m, o),
        }
    }
}
