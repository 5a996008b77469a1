//! Matrix transposes (pure copies: no arithmetic, so any tiling gives the same bits):
//! a kernel's `[weight rows][tokens]` block into token rows, in place in a wider output.

/// A `[rows][cols]` f32 matrix that parallel tasks fill by disjoint column ranges (a
/// batched matmul's `[t][n]` output, each task owning its weight rows' columns in every
/// token row): the tasks share its raw pointer, never a `&mut` over the whole.
pub struct ColumnSink {
    p: *mut f32,
    cols: usize,
}

// SAFETY: tasks write disjoint columns only (the contract of the writes through
// `column`), so sharing the pointer across threads races on nothing; the borrow it came
// from outlives every task.
unsafe impl Send for ColumnSink {}
// SAFETY: as above.
unsafe impl Sync for ColumnSink {}

impl ColumnSink {
    /// The first `rows × cols` floats of `dst`.
    pub fn new(dst: &mut [f32], rows: usize, cols: usize) -> ColumnSink {
        assert!(dst.len() >= rows * cols, "ColumnSink: {} floats for {rows} × {cols}", dst.len());
        ColumnSink { p: dst.as_mut_ptr(), cols }
    }

    /// Row 0, column `c0`: where the writer of columns `c0..` starts (row r, column
    /// c0 + c at `+ r·cols + c`). Writing there is sound only for the one task that
    /// owns those columns, while the slice this sink was made from is still borrowed.
    pub fn column(&self, c0: usize) -> *mut f32 {
        assert!(c0 < self.cols);
        self.p.wrapping_add(c0)
    }
}

/// `dst[r·dstride + c] = src[c·rows + r]` for `r < rows`, `c < n`: the `[n][rows]` block
/// `src` written transposed into `n` columns of a wider matrix (a kernel's `[weight
/// rows][tokens]` block into token rows). Full 8 × 8 tiles by register transposes where
/// the CPU has AVX2, the edges element by element.
///
/// # Safety
/// `dst` is valid for writes at every `r·dstride + c` (`r < rows`, `c < n`), which no one
/// else reads or writes meanwhile.
pub unsafe fn scatter_transposed(src: &[f32], n: usize, rows: usize, dst: *mut f32, dstride: usize) {
    assert!(src.len() >= n * rows);
    let (mut r8, mut c8) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        (r8, c8) = (rows / 8 * 8, n / 8 * 8);
        // SAFETY: AVX2 checked; the tiles lie inside src (asserted) and the caller's dst
        unsafe { sink_tiles8(src, rows, (r8, c8), dst, dstride) };
    }
    for r in 0..rows {
        let from = if r < r8 { c8 } else { 0 };
        for c in from..n {
            // SAFETY: r < rows, c < n: the caller's extent
            unsafe { *dst.add(r * dstride + c) = src[c * rows + r] };
        }
    }
}

/// The full 8 × 8 tiles of [`scatter_transposed`]: rows `..r8`, columns `..c8`, row by
/// row of `dst` (each of its rows' columns written whole before the next: its rows can
/// be 32 KB apart, in the same L1 sets).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sink_tiles8(src: &[f32], rows: usize, (r8, c8): (usize, usize), dst: *mut f32, dstride: usize) {
    for r in (0..r8).step_by(8) {
        for c in (0..c8).step_by(8) {
            // SAFETY: the caller's bounds
            unsafe { transpose8(src.as_ptr().add(c * rows + r), rows, dst.add(r * dstride + c), dstride) };
        }
    }
}

/// `dst[i·dstride + c] = src[c·sstride + i]` for `i, c < 8`.
///
/// # Safety
/// The CPU has AVX2; the 8 rows of 8 floats at `src` (`sstride` apart) and at `dst`
/// (`dstride` apart) are in bounds.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn transpose8(src: *const f32, sstride: usize, dst: *mut f32, dstride: usize) {
    use std::arch::x86_64::*;
    // no closures here: they would not inherit the caller's AVX2 (the loads would not inline)
    let mut r = [_mm256_setzero_ps(); 8];
    for (c, x) in r.iter_mut().enumerate() {
        *x = _mm256_loadu_ps(src.add(c * sstride));
    }
    let (t0, t1) = (_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpackhi_ps(r[0], r[1]));
    let (t2, t3) = (_mm256_unpacklo_ps(r[2], r[3]), _mm256_unpackhi_ps(r[2], r[3]));
    let (t4, t5) = (_mm256_unpacklo_ps(r[4], r[5]), _mm256_unpackhi_ps(r[4], r[5]));
    let (t6, t7) = (_mm256_unpacklo_ps(r[6], r[7]), _mm256_unpackhi_ps(r[6], r[7]));
    let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
    let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
    let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
    let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
    let cols = [(u0, u4), (u1, u5), (u2, u6), (u3, u7)];
    for (i, &(lo, hi)) in cols.iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * dstride), _mm256_permute2f128_ps::<0x20>(lo, hi));
        _mm256_storeu_ps(dst.add((i + 4) * dstride), _mm256_permute2f128_ps::<0x31>(lo, hi));
    }
}

#[cfg(test)]
mod tests {
    /// Every element lands at its transposed place, tiles and edges alike, and nothing
    /// outside the block's columns is written (the other tasks' columns, row padding).
    #[test]
    fn scatter_transposed_writes_its_columns_only() {
        for (n, rows) in [(1, 1), (7, 9), (8, 8), (16, 16), (33, 17), (64, 4099), (5, 40)] {
            let src: Vec<f32> = (0..n * rows).map(|i| i as f32).collect();
            for (c0, dstride) in [(0, n), (3, n + 5), (n, 2 * n + 1)] {
                let mut dst = vec![f32::NAN; rows * dstride];
                // SAFETY: dst holds rows × dstride ≥ c0 + n columns
                unsafe { super::scatter_transposed(&src, n, rows, dst.as_mut_ptr().add(c0), dstride) };
                for r in 0..rows {
                    for c in 0..dstride {
                        let got = dst[r * dstride + c];
                        if (c0..c0 + n).contains(&c) {
                            assert_eq!(got, src[(c - c0) * rows + r], "{n}x{rows} c0 {c0} ({r}, {c})");
                        } else {
                            assert!(got.is_nan(), "{n}x{rows} c0 {c0}: wrote ({r}, {c}) outside the block");
                        }
                    }
                }
            }
        }
    }
}
