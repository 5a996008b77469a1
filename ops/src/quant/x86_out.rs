//! The output of the row-group kernels (`x86_pack16` and its AVX-512 siblings, `x86_pack8`
//! and its AVX2 ones): row-major `[rows][tokens]` or token-major `[tokens][rows]`.

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
