//! The kernel sources (`kernels/*.cu`, embedded) and their compilation by NVRTC.
//!
//! Each module is one `.cu` file with `common.cuh` (and, for files that read weight
//! blocks, `blocks.cuh`) prepended; there are no `#include`s, so NVRTC needs only its
//! builtins. Modules are compiled to CUBIN for the device's real architecture
//! (`sm_XY`), which older drivers load as well as new ones (PTX from a newer NVRTC
//! would not be). CUBINs are cached on disk per architecture and source hash
//! (`$PN_CUDA_CACHE`, default `~/.cache/pn-cuda`), so NVRTC runs once per machine and
//! kernel version, and a machine without NVRTC can use a cache prepared elsewhere.

use crate::CudaError;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::{CStr, CString};
use std::path::PathBuf;

const COMMON: &str = include_str!("../kernels/common.cuh");
const BLOCKS: &str = include_str!("../kernels/blocks.cuh");

/// One compiled module: its file, whether it needs `blocks.cuh`, and the kernels the
/// backend looks up in it (each must be an `extern "C" __global__` of the file).
pub struct Module {
    pub file: &'static str,
    pub source: &'static str,
    pub blocks: bool,
    pub entries: &'static [&'static str],
}

/// Native weight formats: the suffix of their `mm_*` / `get_rows_*` kernels.
pub const FORMATS: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
    "iq4_xs", "mxfp4", "f32", "f16", "bf16",
];

const MM_ENTRIES: &[&str] = &[
    "mm_q4_0",
    "mm_q4_1",
    "mm_q5_0",
    "mm_q5_1",
    "mm_q8_0",
    "mm_q2_k",
    "mm_q3_k",
    "mm_q4_k",
    "mm_q5_k",
    "mm_q6_k",
    "mm_iq4_nl",
    "mm_iq4_xs",
    "mm_mxfp4",
    "mm_f32",
    "mm_f16",
    "mm_bf16",
    "get_rows_q4_0",
    "get_rows_q4_1",
    "get_rows_q5_0",
    "get_rows_q5_1",
    "get_rows_q8_0",
    "get_rows_q2_k",
    "get_rows_q3_k",
    "get_rows_q4_k",
    "get_rows_q5_k",
    "get_rows_q6_k",
    "get_rows_iq4_nl",
    "get_rows_iq4_xs",
    "get_rows_mxfp4",
    "get_rows_f32",
    "get_rows_f16",
    "get_rows_bf16",
];

/// Every kernel file of `kernels/` (a test checks that none is missing).
pub const MODULES: &[Module] = &[
    Module {
        file: "matmul.cu",
        source: include_str!("../kernels/matmul.cu"),
        blocks: true,
        entries: MM_ENTRIES,
    },
    Module {
        file: "quantize.cu",
        source: include_str!("../kernels/quantize.cu"),
        blocks: false,
        entries: &[
            "quantize_q8_0",
            "quantize_q8_1",
            "quantize_q8_k",
            "quantize_f16",
            "quantize_bf16",
        ],
    },
    Module {
        file: "norm.cu",
        source: include_str!("../kernels/norm.cu"),
        blocks: false,
        entries: &["rms_norm", "l2_norm", "softmax_rows"],
    },
    Module {
        file: "rope.cu",
        source: include_str!("../kernels/rope.cu"),
        blocks: false,
        entries: &["rope_neox"],
    },
    Module {
        file: "attention.cu",
        source: include_str!("../kernels/attention.cu"),
        blocks: false,
        entries: &["kv_store", "attn_kv", "kv_store_seqs", "attn_kv_seqs"],
    },
    Module {
        file: "delta.cu",
        source: include_str!("../kernels/delta.cu"),
        blocks: false,
        entries: &["conv1d_causal_seqs", "conv_state_update_seqs", "conv_state_store_seqs", "delta_rule_seqs"],
    },
    Module {
        file: "delta_chunk.cu",
        source: include_str!("../kernels/delta_chunk.cu"),
        blocks: false,
        entries: &["delta_chunk_prep", "delta_chunk_apply"],
    },
    Module {
        file: "moe.cu",
        source: include_str!("../kernels/moe.cu"),
        blocks: false,
        entries: &["topk_rows", "moe_weights", "moe_combine"],
    },
    Module {
        file: "elementwise.cu",
        source: include_str!("../kernels/elementwise.cu"),
        blocks: false,
        entries: &["unary_f32", "binary_f32", "slice_cols", "copy_f32"],
    },
];

/// NVRTC options for every module. `--fmad=false`: no FMA contraction, so the f32
/// arithmetic rounds like the CPU kernels (which never fuse); measure before changing.
pub const OPTIONS: &[&str] = &[
    "--std=c++17",
    "--fmad=false",
    "--restrict",
    "--display-error-number",
];

impl Module {
    /// The full source NVRTC compiles (common + blocks + the file).
    pub fn full_source(&self) -> String {
        let mut s = String::with_capacity(COMMON.len() + BLOCKS.len() + self.source.len() + 64);
        s.push_str(COMMON);
        if self.blocks {
            s.push_str(BLOCKS);
        }
        s.push_str(&format!("\n// ---- {} ----\n", self.file));
        s.push_str(self.source);
        s
    }
}

/// The result of one NVRTC compilation: the CUBIN and the (possibly empty) log.
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Whether libnvrtc can be loaded (dynamic loading; never panics).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names; no symbol is called.
    std::panic::catch_unwind(|| unsafe { nvrtc_sys::is_culib_present() }).unwrap_or(false)
}

/// The NVRTC version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid locals.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

fn no_nvrtc() -> CudaError {
    CudaError::Nvrtc(
        "libnvrtc not found: install the CUDA toolkit or the PyPI package nvidia-cuda-nvrtc-cu12 \
         (tools/nvrtc-check.sh does) and add its lib directory to LD_LIBRARY_PATH"
            .into(),
    )
}

/// Owns an nvrtcProgram and destroys it on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn log_of(p: &Program) -> String {
    // SAFETY: `p` is a live program; the log is a NUL-terminated C string.
    match unsafe { nvrtc::get_program_log(p.0) } {
        Ok(raw) if !raw.is_empty() => {
            // SAFETY: NVRTC writes a NUL-terminated string of the reported size.
            unsafe { CStr::from_ptr(raw.as_ptr()) }
                .to_string_lossy()
                .trim()
                .to_string()
        }
        _ => String::new(),
    }
}

/// Compile one module for `arch` (`"sm_90"`, `"sm_80"`, ...) to CUBIN.
pub fn compile(module: &Module, arch: &str) -> Result<Compiled, CudaError> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let src = CString::new(module.full_source())
        .map_err(|_| CudaError::Nvrtc("NUL byte in kernel source".into()))?;
    let name =
        CString::new(module.file).map_err(|_| CudaError::Nvrtc("NUL byte in file name".into()))?;
    let prog =
        Program(nvrtc::create_program(&src, Some(&name)).map_err(|e| {
            CudaError::Nvrtc(format!("{}: nvrtcCreateProgram: {e:?}", module.file))
        })?);
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is live; the options are plain strings without NUL bytes.
    let res = unsafe { nvrtc::compile_program(prog.0, &opts) };
    let log = log_of(&prog);
    if let Err(e) = res {
        return Err(CudaError::Compile {
            file: module.file.into(),
            arch: arch.into(),
            log: format!("{e:?}\n{log}"),
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully for a real architecture, so a CUBIN exists;
    // `size` is a valid out pointer and `cubin` has exactly `size` bytes.
    let cubin = unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size)
            .result()
            .map_err(|e| CudaError::Nvrtc(format!("{}: nvrtcGetCUBINSize: {e:?}", module.file)))?;
        let mut cubin = vec![0u8; size];
        nvrtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut std::ffi::c_char)
            .result()
            .map_err(|e| CudaError::Nvrtc(format!("{}: nvrtcGetCUBIN: {e:?}", module.file)))?;
        cubin
    };
    Ok(Compiled { cubin, log })
}

/// FNV-1a over the full source, the options and the architecture: the cache key.
pub fn source_hash(module: &Module, arch: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(module.full_source().as_bytes());
    for o in OPTIONS {
        eat(o.as_bytes());
    }
    eat(arch.as_bytes());
    h
}

/// The CUBIN cache directory (`$PN_CUDA_CACHE`, else `~/.cache/pn-cuda`).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PN_CUDA_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("pn-cuda")
}

/// Path of the cached CUBIN of `module` for `arch`.
pub fn cache_path(module: &Module, arch: &str) -> PathBuf {
    let stem = module.file.trim_end_matches(".cu");
    cache_dir()
        .join(arch)
        .join(format!("{stem}-{:016x}.cubin", source_hash(module, arch)))
}

/// The CUBIN of `module` for `arch`: from the cache, else compiled (and cached; a cache
/// that cannot be written is not an error).
pub fn cubin(module: &Module, arch: &str) -> Result<Vec<u8>, CudaError> {
    let path = cache_path(module, arch);
    if let Ok(b) = std::fs::read(&path) {
        if !b.is_empty() {
            return Ok(b);
        }
    }
    let c = compile(module, arch)?;
    if let Some(dir) = path.parent() {
        if std::fs::create_dir_all(dir).is_ok() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &c.cubin).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
    Ok(c.cubin)
}
