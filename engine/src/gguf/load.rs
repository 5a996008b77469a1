//! How a model file's bytes get into memory: memory-mapped, or read into anonymous
//! memory advised for transparent huge pages ([`LoadMode`]).

use super::{Backing, Gguf, GgufError};
use std::path::Path;

/// How a model file's bytes get into memory ([`Gguf::open_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// `Copy` when the file takes at most half of the memory available now, else `Mmap`;
    /// always `Mmap` where the CPU's matmuls read `rows16` copies of the K-quants
    /// (`Gguf::prepare_rows16`: a mapped file drops the plain pages they replace, a copy
    /// could not, and the copies are in huge pages themselves).
    Auto,
    /// Memory-map the file (lazy, pages shared with the page cache and reclaimable).
    Mmap,
    /// Read the file into anonymous memory backed by transparent huge pages where the
    /// kernel allows: no TLB walk every 4 KB of a weight stream (decode +4–5 % on
    /// full-dims q4_k_m, docs/perf.md), at the cost of reading it all up front.
    Copy,
}

impl std::str::FromStr for LoadMode {
    type Err = String;
    fn from_str(s: &str) -> Result<LoadMode, String> {
        match s {
            "auto" => Ok(LoadMode::Auto),
            "mmap" => Ok(LoadMode::Mmap),
            "copy" => Ok(LoadMode::Copy),
            _ => Err(format!("expected auto, mmap or copy, found {s:?}")),
        }
    }
}

/// `MemAvailable` of /proc/meminfo in bytes (None where there is no such file).
fn mem_available() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Gguf {
    /// Load and parse a GGUF file as `mode` says (a `Copy` that cannot get its memory
    /// falls back to the memory map).
    pub fn open_with(path: &Path, mode: LoadMode) -> Result<Gguf, GgufError> {
        Gguf::open_with_progress(path, mode, &mut |_, _| {})
    }

    /// `open_with`, calling `progress(bytes_read, file_len)` as a `Copy` reads the file
    /// (every 64 MiB and at the end); a memory map reads nothing up front.
    pub fn open_with_progress(path: &Path, mode: LoadMode, progress: &mut dyn FnMut(u64, u64)) -> Result<Gguf, GgufError> {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let copy = match mode {
            LoadMode::Mmap => false,
            LoadMode::Copy => true,
            LoadMode::Auto => {
                let rows16 = pn_ops::quant::rows16::available(pn_ops::GgmlType::Q4K, 256, 16);
                !rows16 && len > 0 && mem_available().is_some_and(|avail| len.saturating_mul(2) <= avail)
            }
        };
        if copy && len > 0 {
            if let Some(g) = Gguf::read_into_huge_pages(path, len, progress)? {
                return Ok(g);
            }
        }
        Gguf::open(path)
    }

    /// The file read into anonymous memory advised for huge pages; None when that
    /// memory cannot be had (the caller maps the file instead).
    fn read_into_huge_pages(path: &Path, len: u64, progress: &mut dyn FnMut(u64, u64)) -> Result<Option<Gguf>, GgufError> {
        use std::io::Read;
        let io = |err| GgufError::Io {
            path: path.display().to_string(),
            err,
        };
        let Ok(len) = usize::try_from(len) else { return Ok(None) };
        let Ok(mut m) = memmap2::MmapOptions::new().len(len).map_anon() else { return Ok(None) };
        // advice only: without THP the copy still works, in 4 KB pages
        let _ = m.advise(memmap2::Advice::HugePage);
        const CHUNK: usize = 64 << 20;
        let mut f = std::fs::File::open(path).map_err(io)?;
        for (i, chunk) in m.chunks_mut(CHUNK).enumerate() {
            f.read_exact(chunk).map_err(io)?;
            progress((i * CHUNK + chunk.len()) as u64, len as u64);
        }
        let m = m.make_read_only().map_err(io)?;
        Gguf::from_backing(Backing::Anon(m)).map(Some)
    }

}
