//! pn-cpu: the CPU backend. Multi-threaded (rayon) kernels whose results are bitwise
//! independent of the thread count: work is split by output rows / heads, never inside a
//! row's reduction.
//!
//! CONTRACT: `CpuBackend::new(threads: usize) -> CpuBackend` (0 = all cores), implementing
//! `pn_engine::Backend`.
