//! glibc malloc under a serving load: keep large transient buffers out of the arenas.
//!
//! glibc serves a block of at least `M_MMAP_THRESHOLD` (128 KiB) with its own mapping and
//! unmaps it on free, but it raises that threshold to the size of every mapped block that
//! is freed (up to 32 MiB), and the trim threshold to twice that. Under load, the first
//! 4 MiB request body (or prefix-cache snapshot, or logits buffer) freed raises it, and
//! from then on such buffers come from the per-thread arenas, each of which keeps up to
//! twice the largest one as free memory it never returns: RSS climbs during the first
//! minutes of load as more threads' arenas see a large buffer (measured: +8 % over a
//! 5-minute run, docs/server.md). Setting the threshold pins it (glibc then stops moving
//! it, and the trim threshold stays 128 KiB), so those buffers are mapped and unmapped
//! every time, and the arenas hold only small blocks.
#![allow(unsafe_code)]

/// glibc's default threshold, pinned.
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Pin glibc's mmap threshold (see the module doc); false where it is not glibc.
pub fn pin_mmap_threshold() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt sets one allocator parameter under glibc's own lock; it takes
        // no pointers and is safe to call at any time from any thread.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
