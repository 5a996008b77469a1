//! The output of the row-group kernels (`x86_pack16` and its AVX-512 siblings, `x86_pack8`
//! and its AVX2 ones): row-major `[rows][tokens]` or token-major `[tokens][rows]`, and the
//! stores that put a tile's vectors there.

use std::arch::x86_64::*;

/// Where a row-group kernel's results go: row r, token j at `p + r·rs + j·ts`. Row-major
/// (`rows`: `[rows][tokens]`, ts = 1) or token-major (`tokens`: `[tokens][rows]`, rs =
/// 1: a batch's `[t][n]` output written in place, no transpose after).
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub(super) p: *mut f32,
    pub(super) rs: usize,
    pub(super) ts: usize,
}

impl Out {
    /// `out[r·ostride + j]`: the kernels' row-major contract (the caller checks that
    /// `out` holds every (row, token) it will write).
    pub(crate) fn rows(out: &mut [f32], ostride: usize) -> Out {
        Out { p: out.as_mut_ptr(), rs: ostride, ts: 1 }
    }

    /// `p[j·tstride + r]`.
    ///
    /// # Safety
    /// Every (row, token) the kernel will write is inside `p`'s allocation and written
    /// by no one else meanwhile.
    pub(crate) unsafe fn tokens(p: *mut f32, tstride: usize) -> Out {
        Out { p, rs: 1, ts: tstride }
    }

    /// The same layout from row `r`, token `j` on.
    #[inline(always)]
    pub(crate) fn at(self, r: usize, j: usize) -> Out {
        Out { p: self.p.wrapping_add(r * self.rs + j * self.ts), ..self }
    }
}

/// Lanes `0..nr` of `v` (one token's results, lane r = row r) into rows `0..nr`, token
/// `col` of `o`: one masked store token-major, else row by row.
///
/// # Safety
/// AVX-512 F available; `o` holds rows `0..nr` × token `col` (`Out`'s contract).
#[inline(always)]
pub(crate) unsafe fn store_rows(v: __m512, nr: usize, o: Out, col: usize) {
    // SAFETY (whole body): AVX-512 enabled in every caller; the stores stay inside the
    // rows and token the caller vouched for.
    unsafe {
        if o.rs == 1 {
            let mask: __mmask16 = if nr >= 16 { 0xffff } else { ((1u32 << nr) - 1) as __mmask16 };
            return _mm512_mask_storeu_ps(o.p.add(col * o.ts), mask, v);
        }
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), v);
        for (r, &x) in l.iter().enumerate().take(nr) {
            *o.p.add(r * o.rs + col * o.ts) = x;
        }
    }
}

/// Row r, token `col + j` of `o` = lane r of `v[j]` for r < `nr`, j < M ≤ 8. Token-major:
/// each token's vector is its rows already, one masked store each ([`store_rows`]).
/// Row-major: the tile transposed in registers by `x86_pack16::transpose16x8` (an 8×8
/// transpose per 256-bit half, its
/// own inverse: vector r then holds row r's M results low and row r + 8's high) and each
/// row written as one masked store, instead of 16·M scalar stores through a stack copy
/// (a pure move either way: the same values land).
///
/// # Safety
/// AVX-512 F/VL available; `o` holds rows `0..nr` × tokens `col..col + M` (`Out`'s
/// contract).
#[inline(always)]
pub(crate) unsafe fn store_tile<const M: usize>(v: &[__m512; M], nr: usize, o: Out, col: usize) {
    const { assert!(M >= 1 && M <= 8) };
    // SAFETY (whole body): AVX-512 F/VL enabled in every caller; the stores stay inside
    // the rows and tokens the caller vouched for.
    unsafe {
        if o.rs == 1 {
            for (j, vj) in v.iter().enumerate() {
                store_rows(*vj, nr, o, col + j);
            }
            return;
        }
        let mut z = [_mm512_setzero_si512(); 8];
        for (zj, vj) in z.iter_mut().zip(v) {
            *zj = _mm512_castps_si512(*vj);
        }
        let rows = super::x86_pack16::transpose16x8(z);
        let mask: __mmask8 = ((1u16 << M) - 1) as __mmask8;
        for (r, w) in rows.iter().enumerate() {
            let halves = [_mm512_castsi512_si256(*w), _mm512_extracti64x4_epi64::<1>(*w)];
            for (h, half) in halves.iter().enumerate() {
                if r + 8 * h < nr {
                    let dst = o.p.add((r + 8 * h) * o.rs + col);
                    _mm256_mask_storeu_ps(dst, mask, _mm256_castsi256_ps(*half));
                }
            }
        }
    }
}

/// Lanes `0..nr` of `v` (one token's results, lane r = row r) into rows `0..nr`, token
/// `col` of `o` ([`store_rows`] on 8 lanes): one store token-major (a whole
/// group), else row by row.
///
/// # Safety
/// AVX enabled in the caller; `o` holds rows `0..nr` × token `col` (`Out`'s contract).
#[inline(always)]
pub(crate) unsafe fn store_rows8(v: __m256, nr: usize, o: Out, col: usize) {
    // SAFETY (whole body): AVX enabled in every caller; the stores stay inside the rows
    // and token the caller vouched for.
    unsafe {
        if o.rs == 1 && nr >= 8 {
            return _mm256_storeu_ps(o.p.add(col * o.ts), v);
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), v);
        for (r, &x) in l.iter().enumerate().take(nr) {
            *o.p.add(r * o.rs + col * o.ts) = x;
        }
    }
}
