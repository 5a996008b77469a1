//! Parallel-loop helpers: fan out over disjoint output rows, or run inline when the work
//! is too small to be worth waking threads. The split never changes what any element
//! computes, so results do not depend on the thread count.

use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Set while an op runs inline (see `lib.rs`): its loops stay serial even when the
    /// caller is a pool thread (a whole pass runs on one, [`crate::CpuBackend`]'s
    /// `run_pass`).
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether loops must stay serial: the caller is outside any rayon pool (they would
/// otherwise fall into rayon's global pool), or runs a light op inline.
pub fn outside_pool() -> bool {
    rayon::current_thread_index().is_none() || INLINE.with(Cell::get)
}

/// Runs `f` with every `par` loop (and `outside_pool` check) serial on this thread.
pub fn inline<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(INLINE.with(|c| c.replace(true)));
    f()
}

/// Below this many "work units" (roughly flops) a loop runs on the calling thread.
pub const SERIAL_WORK: usize = 1 << 15;

/// Call `f(i, row)` for every `row_len`-sized row of `y` (row `i`), in parallel when
/// `work_per_row × rows` is large enough.
pub fn rows<T: Send, F>(y: &mut [T], row_len: usize, work_per_row: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    if row_len == 0 || y.is_empty() {
        return;
    }
    let n_rows = y.len() / row_len;
    // Outside a pool (a small op run inline on the caller's thread, see `lib.rs`): serial,
    // never rayon's global pool.
    if n_rows <= 1
        || work_per_row.saturating_mul(n_rows) < SERIAL_WORK
        || outside_pool()
    {
        y.chunks_mut(row_len).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        let min = (SERIAL_WORK / work_per_row.max(1)).clamp(1, 1 << 16);
        y.par_chunks_mut(row_len)
            .with_min_len(min)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// `y.copy_from_slice(x)`, in parallel chunks when the copy is large (a prefill's
/// reshapes and slices move megabytes; one thread's copy leaves the other idle).
pub fn copy(y: &mut [f32], x: &[f32]) {
    const CHUNK: usize = 1 << 14;
    assert_eq!(y.len(), x.len(), "copy of {} floats into {}", x.len(), y.len());
    rows(y, CHUNK, CHUNK, |i, r| r.copy_from_slice(&x[i * CHUNK..i * CHUNK + r.len()]));
}
