//! Sequence tables: what a multi-sequence kernel launch gets by value ([`ByValue`]), so
//! a captured graph replays it with nothing to upload. [`SeqTab`]: each sequence's layer
//! state buffer and its token offsets (kernels/delta.cu); `ops_attn::KvTab` the KV caches'
//! buffers (kernels/attention.cu).

use crate::exec::Buf;

/// A `repr(C)` struct without padding whose size is a multiple of 8, passed to a kernel
/// by value (its C twin in the kernel file has the same layout).
///
/// # Safety
/// Implement only for `repr(C)` types with no padding bytes, 8-byte alignment and a size
/// that is a multiple of 8.
pub unsafe trait ByValue: Copy {
    /// The struct's bytes as 8-byte words.
    fn words(&self) -> Box<[u64]> {
        let n = std::mem::size_of::<Self>() / 8;
        // SAFETY: the trait's contract: aligned to 8, n whole words, every byte initialized.
        unsafe { std::slice::from_raw_parts(self as *const Self as *const u64, n) }.into()
    }
}

/// Most sequences of one multi-sequence launch (kernels/delta.cu `SEQ_TAB`).
pub const SEQ_TAB: usize = 16;

/// The sequences of a multi-sequence launch, passed by value as the kernel's `SeqTab`
/// (kernels/delta.cu, the same C layout: 16 addresses, 17 ints, an int; 200 bytes): a
/// captured graph replays it with the launch, nothing to upload. Sequence z has the layer
/// state buffer `st[z]` and the pass's tokens `t0[z]..t0[z + 1]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeqTab {
    pub st: [u64; SEQ_TAB],
    pub t0: [i32; SEQ_TAB + 1],
    pub n: i32,
}

// SAFETY: repr(C), 16 u64 then 18 i32: 200 bytes, no padding, aligned to 8.
unsafe impl ByValue for SeqTab {}

impl SeqTab {
    /// Tables of at most [`SEQ_TAB`] sequences each for `states` (one buffer per
    /// sequence) and their token counts `lens`, in order from the pass's first token.
    pub fn groups(states: &[Buf], lens: &[usize]) -> Vec<SeqTab> {
        let mut out = Vec::with_capacity(states.len().div_ceil(SEQ_TAB));
        let mut at = 0;
        for (sts, ls) in states.chunks(SEQ_TAB).zip(lens.chunks(SEQ_TAB)) {
            let mut t = SeqTab { st: [0; SEQ_TAB], t0: [0; SEQ_TAB + 1], n: sts.len() as i32 };
            t.t0[0] = at as i32;
            for (z, (b, &len)) in sts.iter().zip(ls).enumerate() {
                t.st[z] = b.ptr;
                at += len;
                t.t0[z + 1] = at as i32;
            }
            // the unused entries repeat the end (no tokens)
            for z in sts.len()..SEQ_TAB {
                t.t0[z + 1] = at as i32;
            }
            out.push(t);
        }
        out
    }
    /// Tokens of the pass this table covers.
    pub fn tokens(&self) -> usize {
        (self.t0[self.n as usize] - self.t0[0]) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{fingerprint, Arg, Cmd};

    #[test]
    fn sequence_tables_have_the_kernels_layout_and_cover_the_pass() {
        // the C struct of kernels/delta.cu: 16 addresses, 17 ints, an int
        assert!(include_str!("../kernels/delta.cu").contains(&format!("#define SEQ_TAB {SEQ_TAB}\n")));
        assert_eq!(std::mem::size_of::<SeqTab>(), 8 * SEQ_TAB + 4 * (SEQ_TAB + 1) + 4);
        assert_eq!(std::mem::align_of::<SeqTab>(), 8);
        let t = SeqTab { st: [0; SEQ_TAB], t0: [0; SEQ_TAB + 1], n: 0 };
        let base = &t as *const SeqTab as usize;
        assert_eq!(t.t0.as_ptr() as usize - base, 8 * SEQ_TAB);
        assert_eq!(&t.n as *const i32 as usize - base, 8 * SEQ_TAB + 4 * (SEQ_TAB + 1));
        // 20 sequences of 1..=20 tokens: two tables, the second going on where the first ends
        let bufs: Vec<Buf> = (0..20u64).map(|i| Buf { ptr: 0x1000 * (i + 1), bytes: 64 }).collect();
        let lens: Vec<usize> = (1..=20).collect();
        let g = SeqTab::groups(&bufs, &lens);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].n, g[1].n), (16, 4));
        assert_eq!(g[0].t0[0], 0);
        assert_eq!(g[0].t0[16], (1..=16).sum::<i32>());
        assert_eq!(g[1].t0[0], g[0].t0[16]);
        assert_eq!(g[1].t0[4], (1..=20).sum::<i32>());
        assert_eq!(g[1].t0[SEQ_TAB], g[1].t0[4], "unused entries hold no tokens");
        assert_eq!(g[0].tokens() + g[1].tokens(), lens.iter().sum::<usize>());
        for (z, b) in bufs.iter().enumerate() {
            let (tab, i) = (&g[z / SEQ_TAB], z % SEQ_TAB);
            assert_eq!(tab.st[i], b.ptr);
            assert_eq!((tab.t0[i + 1] - tab.t0[i]) as usize, lens[z]);
        }
        // a table is part of a command's fingerprint
        let cmd = |t: &SeqTab| Cmd::Kernel { name: "k", f: 1, grid: [1, 1, 1], block: [32, 1, 1], shared: 0, args: vec![Arg::V(t.words())] };
        assert_eq!(g[0].words().len(), 25);
        assert_eq!(g[0].words()[0], g[0].st[0]);
        assert_eq!(g[0].words()[24] >> 32, 16, "n, after t0[16]");
        let mut other = g[0];
        other.st[3] += 8;
        assert_ne!(fingerprint(&[cmd(&g[0])]), fingerprint(&[cmd(&other)]));
        assert_eq!(fingerprint(&[cmd(&g[0])]), fingerprint(&[cmd(&g[0].clone())]));
    }
}
