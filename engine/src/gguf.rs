//! GGUF reader (spec §1): memmap2, zero-copy tensor data, typed errors for every
//! malformed file.
//!
//! CONTRACT (used by models / CLI; keep these signatures):
//! - `Gguf::open(path)`, `Gguf::from_bytes(Vec<u8>)` (fuzzing / tests)
//! - `gguf.version`, `gguf.alignment`, `gguf.data_start`, `gguf.metadata` (in file order),
//!   `gguf.tensors` (in file order)
//! - `gguf.get(key) -> Option<&MetaValue>`, typed getters, `gguf.tensor(name)`,
//!   `gguf.tensor_bytes(&info) -> &[u8]` (exactly `info.n_bytes` bytes).

use pn_ops::GgmlType;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file: expected magic \"GGUF\", found {found:?}")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version: expected 2 or 3, found {0}")]
    BadVersion(u32),
    #[error("truncated file: needed {needed} bytes at offset {offset} for {what}, but the file has {len} bytes")]
    Truncated { what: String, offset: u64, needed: u64, len: u64 },
    #[error("{what}: {msg}")]
    Invalid { what: String, msg: String },
}

/// A metadata value (spec §1.2).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order, always 4 entries (missing dims are 1).
    pub ne: [u64; 4],
    pub n_dims: u32,
    pub ty: GgmlType,
    /// Offset relative to `data_start`.
    pub offset: u64,
    pub n_bytes: u64,
}

pub struct Gguf {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let _ = path;
        todo!("gguf helper")
    }
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let _ = bytes;
        todo!("gguf helper")
    }
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let _ = key;
        todo!("gguf helper")
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let _ = name;
        todo!("gguf helper")
    }
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let _ = info;
        todo!("gguf helper")
    }
}
