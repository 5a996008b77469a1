//! The `rows16` copies of a file's quantized weights (`pn_ops::quant::rows16`): the rows
//! interleaved 16 at a time as the CPU's 16-row kernels read them, made once at load for
//! the weights a host die multiplies every step, so no matmul re-transposes its rows per
//! call. The size of the plain rows it holds (all of them, or a matrix's whole 16-row
//! groups); a mapped file then drops its pages of the plain copy (they come back from
//! the page cache for any other reader), so the resident set stays about the file's
//! size. A file read into anonymous memory (`LoadMode::Copy`) gets no copies: its plain
//! bytes could not be dropped.

use super::{Backing, Gguf};
use pn_ops::quant::rows16;

impl Gguf {
    /// Makes the `rows16` copy of every tensor of `ixs` that has one on this CPU (a
    /// quantized matrix or expert stack of a type `rows16::available` takes), in parallel
    /// over row groups. Returns the bytes made. A tensor made before is skipped. An expert
    /// stack needs each matrix in whole 16-row groups (an expert's copy starts where its
    /// plain bytes do); a single matrix gets its whole 16-row groups copied and its last
    /// `rows % 16` rows stay plain (an LM head of 4099 rows: 4096 in the copy), so the
    /// copy may be shorter than the tensor.
    pub fn prepare_rows16(&self, ixs: &[usize]) -> u64 {
        if matches!(self.backing, Backing::Anon(_)) {
            return 0;
        }
        let mut made = 0;
        for &ix in ixs {
            let Some(info) = self.tensors.get(ix) else { continue };
            let (n, rows, mats) = (info.ne[0] as usize, info.ne[1] as usize, (info.ne[2] * info.ne[3]) as usize);
            // rows of the copy: every row of a stack, a matrix's whole 16-row groups
            let covered = if mats == 1 { rows / 16 * 16 } else { rows * mats };
            if !rows16::available(info.ty, n, if mats == 1 { covered } else { rows }) || self.rows16[ix].get().is_some() {
                continue;
            }
            let Some(src) = self.try_tensor_bytes(info) else { continue };
            let Some(src) = info.ty.row_bytes(n).and_then(|rb| src.get(..covered * rb)) else { continue };
            let copy = repacked(info.ty, n, covered, src);
            if copy.is_some() {
                made += src.len() as u64;
                self.drop_plain_pages(src);
            }
            let _ = self.rows16[ix].set(copy);
        }
        made
    }

    /// Tensor `ix`'s `rows16` copy, if made: its first rows (all of them, or a matrix's
    /// whole 16-row groups; see [`Gguf::prepare_rows16`]).
    pub fn rows16(&self, ix: usize) -> Option<&[u8]> {
        self.rows16.get(ix)?.get()?.as_deref()
    }

    /// A mapped file's whole pages inside `bytes` (one of its tensors) leave the
    /// resident set; read again, they fault back in from the file.
    pub(super) fn drop_plain_pages(&self, bytes: &[u8]) {
        let Backing::Mmap(m) = &self.backing else { return };
        const PAGE: usize = 4096;
        let start = bytes.as_ptr() as usize - m.as_ptr() as usize;
        let (a, b) = (start.next_multiple_of(PAGE), (start + bytes.len()) / PAGE * PAGE);
        if b > a {
            // SAFETY: a read-only mapping of a file: dropping its pages loses nothing
            // (MADV_DONTNEED on a file mapping re-reads the file on the next access).
            #[allow(unsafe_code)]
            let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a) };
        }
    }
}

/// `src` (`rows` rows of `n` elements of `ty`) in the `rows16` layout, in anonymous
/// memory advised for huge pages; the rows split over the cores in whole 16-row groups.
fn repacked(ty: pn_ops::GgmlType, n: usize, rows: usize, src: &[u8]) -> Option<memmap2::Mmap> {
    let rb = ty.row_bytes(n)?;
    let mut dst = memmap2::MmapMut::map_anon(src.len()).ok()?;
    let _ = dst.advise(memmap2::Advice::HugePage);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = rows.div_ceil(16).div_ceil(threads) * 16;
    let ok = std::thread::scope(|s| {
        let jobs: Vec<_> = src
            .chunks(per * rb)
            .zip(dst.chunks_mut(per * rb))
            .map(|(a, b)| s.spawn(move || rows16::repack(ty, n, a.len() / rb, a, b)))
            .collect();
        jobs.into_iter().all(|j| j.join().unwrap_or(false))
    });
    if ok {
        dst.make_read_only().ok()
    } else {
        None
    }
}
