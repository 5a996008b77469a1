//! Anonymous huge-page copies of the mapped weights that have no `rows16` copy (F32
//! routers, norms, Q8_0 / Q6_K matrices the 16-row kernels do not take, …), made once at
//! load for the weights a host die reads every step. Left in the file's mapping, each
//! faults in 4 KB at a time on the first pass (a 128-token real-dims prefill ran ~0.3 s
//! slower the first time) and streams through 4 KB TLB entries ever after (the F32
//! routers ran at ~14 GB/s in real-dims decode). The mapped pages are dropped once
//! copied, so the resident set stays about the file's size.

use super::{Backing, Gguf};
use std::sync::Arc;

/// Each copy starts on a 64-byte boundary (what the GGUF's own alignment gives at most
/// the kernels' loads).
const ALIGN: usize = 64;

impl Gguf {
    /// Copies every tensor of `ixs` that a mapped file holds, that has no `rows16` copy
    /// and no copy yet into one anonymous region advised for huge pages; returns the
    /// bytes copied. Nothing for a file already in anonymous memory or in a Vec.
    pub fn prepare_plain_copies(&self, ixs: &[usize]) -> u64 {
        if !matches!(self.backing, Backing::Mmap(_)) {
            return 0;
        }
        let mut todo: Vec<(usize, &[u8])> = Vec::new();
        for &ix in ixs {
            if self.rows16(ix).is_some() || self.plain.get(ix).is_none_or(|c| c.get().is_some()) {
                continue;
            }
            let Some(src) = self.tensors.get(ix).and_then(|info| self.try_tensor_bytes(info)) else { continue };
            if !src.is_empty() && !todo.iter().any(|&(i, _)| i == ix) {
                todo.push((ix, src));
            }
        }
        let offsets: Vec<usize> = todo
            .iter()
            .scan(0usize, |at, (_, src)| {
                let o = *at;
                *at = (o + src.len()).next_multiple_of(ALIGN);
                Some(o)
            })
            .collect();
        let total = todo.last().map_or(0, |(_, src)| offsets[offsets.len() - 1] + src.len());
        // the parser rejects overlapping tensors, so the copies fit in the file's size;
        // kept as a bound on what a load may allocate
        if total == 0 || total > self.file_bytes().len() {
            return 0;
        }
        let Ok(mut dst) = memmap2::MmapMut::map_anon(total) else { return 0 };
        let _ = dst.advise(memmap2::Advice::HugePage);
        for (&(_, src), &o) in todo.iter().zip(&offsets) {
            dst[o..o + src.len()].copy_from_slice(src);
        }
        let Ok(region) = dst.make_read_only() else { return 0 };
        let region = Arc::new(region);
        for (&(ix, src), &o) in todo.iter().zip(&offsets) {
            let _ = self.plain[ix].set((region.clone(), o));
            self.drop_plain_pages(src);
        }
        total as u64
    }

    /// The bytes a host kernel reads for tensor `ix`: its plain copy when one was made
    /// ([`Gguf::prepare_plain_copies`]), else the file's (`None` where `ix` is no tensor
    /// of this file or lies outside it).
    pub fn host_bytes(&self, ix: usize) -> Option<&[u8]> {
        let info = self.tensors.get(ix)?;
        match self.plain.get(ix).and_then(|c| c.get()) {
            Some((region, o)) => region.get(*o..*o + info.n_bytes as usize),
            None => self.try_tensor_bytes(info),
        }
    }

    /// Tensor `ix` as a host kernel reads it: shape and type, its plain copy's bytes (or
    /// the file's) and its `rows16` copy. Panics, as [`Gguf::tensor_bytes`], where `ix`
    /// lies outside the file (the runner checks every weight when it plans).
    pub fn weight_view(&self, ix: usize) -> pn_ops::WeightView<'_> {
        let info = &self.tensors[ix];
        pn_ops::WeightView {
            name: &info.name,
            ty: info.ty,
            shape: info.op_shape(),
            bytes: self.host_bytes(ix).unwrap_or_else(|| self.tensor_bytes(info)),
            rows16: self.rows16(ix),
        }
    }
}
