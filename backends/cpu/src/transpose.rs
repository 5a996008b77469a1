//! Matrix transposes (pure copies: no arithmetic, so any tiling gives the same bits).

/// `dst[c·rows + r] = src[r·cols + c]` for `r < rows`, `c < cols` of the `ncols` columns
/// starting at `c0` (`dst` holds those columns: `ncols × rows`). Full 8 × 8 tiles by
/// register transposes where the CPU has AVX2, the edges element by element.
pub fn columns(src: &[f32], rows: usize, cols: usize, c0: usize, ncols: usize, dst: &mut [f32]) {
    assert!(c0 + ncols <= cols && src.len() >= rows * cols && dst.len() >= ncols * rows);
    let (mut r8, mut c8) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        (r8, c8) = (rows / 8 * 8, ncols / 8 * 8);
        // SAFETY: AVX2 checked; every tile is inside src / dst (assert above).
        unsafe { tiles8(src, rows, cols, c0, (r8, c8), dst) };
    }
    // the rest: rows r8.. of the tiled columns, every row of columns c8.. (a batch of a
    // few tokens: all of them), one source row at a time
    for r in 0..rows {
        let srow = &src[r * cols + c0..r * cols + c0 + ncols];
        let from = if r < r8 { c8 } else { 0 };
        for (c, &x) in srow.iter().enumerate().skip(from) {
            dst[c * rows + r] = x;
        }
    }
}

/// The full 8 × 8 tiles of [`columns`]: rows `..r8`, columns `..c8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tiles8(src: &[f32], rows: usize, cols: usize, c0: usize, (r8, c8): (usize, usize), dst: &mut [f32]) {
    for c in (0..c8).step_by(8) {
        for r in (0..r8).step_by(8) {
            transpose8(src.as_ptr().add(r * cols + c0 + c), cols, dst.as_mut_ptr().add(c * rows + r), rows);
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
    #[test]
    fn columns_is_the_transpose_at_every_edge() {
        for (rows, cols) in [(1, 1), (7, 9), (8, 8), (16, 16), (33, 17), (4099, 16), (5, 40)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            for (c0, n) in [(0, cols), (cols / 3, cols - cols / 3), (cols - 1, 1)] {
                let mut dst = vec![f32::NAN; n * rows];
                super::columns(&src, rows, cols, c0, n, &mut dst);
                for c in 0..n {
                    for r in 0..rows {
                        assert_eq!(dst[c * rows + r], src[r * cols + c0 + c], "{rows}x{cols} c0 {c0} ({r}, {c})");
                    }
                }
            }
        }
    }
}
