//! GGUF reader (spec §1): memmap2, zero-copy tensor data, typed errors for every
//! malformed file.
//!
//! CONTRACT (used by models / CLI; keep these signatures):
//! - `Gguf::open(path)`, `Gguf::from_bytes(Vec<u8>)` (fuzzing / tests),
//!   `Gguf::from_static(&'static [u8])` (models embedded with `include_bytes!`)
//! - `gguf.version`, `gguf.alignment`, `gguf.data_start`, `gguf.metadata` (in file order),
//!   `gguf.tensors` (in file order)
//! - `gguf.get(key) -> Option<&MetaValue>`, typed getters, `gguf.tensor(name)`,
//!   `gguf.tensor_bytes(&info) -> &[u8]` (exactly `info.n_bytes` bytes).
//!
//! Typed getters return `Ok(None)` for a missing key, `Ok(Some(v))` for a key of an
//! acceptable type and `Err(GgufError::TypeMismatch { .. })` (naming the key, the
//! expected type and the found type) otherwise.
//!
//! Every check of `parse.rs` runs before any tensor is exposed, so every `TensorInfo` in
//! `gguf.tensors` is in bounds of the file, aligned and disjoint from the others.

mod load;
mod parse;
mod resident;
mod rows16;

pub use load::LoadMode;

use pn_ops::GgmlType;
use std::collections::HashMap;
use std::path::Path;
use thiserror::Error;

/// Default `general.alignment` (spec §1.4).
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// Arrays nested deeper than this are rejected (a hostile file could otherwise nest
/// arrays until the parser's recursion overflows the stack).
pub const MAX_ARRAY_DEPTH: usize = 8;

#[derive(Debug, Error)]
pub enum GgufError {
    /// The io error is shown in the message, not chained as a source (it would print twice).
    #[error("{path}: {err}")]
    Io {
        path: String,
        err: std::io::Error,
    },
    #[error("not a GGUF file: expected magic \"GGUF\", found \"{}\"", found.escape_ascii())]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version: expected 2 or 3, found {0} (0x{0:08x}; 0x03000000 is a big-endian file)")]
    BadVersion(u32),
    #[error("truncated file: needed {needed} bytes at offset {offset} for {what}, but the file has {len} bytes")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{what}: {msg}")]
    Invalid { what: String, msg: String },
    #[error("{what}: expected a count >= 0, found {found}")]
    NegativeCount { what: String, found: i64 },
    #[error("{what}: count {count} needs at least {min_bytes_each} bytes each, but only {remaining} bytes remain after offset {offset}")]
    CountTooLarge {
        what: String,
        count: u64,
        min_bytes_each: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("{what}: expected valid UTF-8 in the {len}-byte string at offset {offset}")]
    InvalidUtf8 { what: String, offset: u64, len: u64 },
    #[error(
        "metadata key #{index} at offset {offset}: expected a non-empty key, found an empty string"
    )]
    EmptyKey { index: u64, offset: u64 },
    #[error("metadata key {key:?}: expected unique keys, found a duplicate")]
    DuplicateKey { key: String },
    #[error("{what}: expected a value type id in 0..=12, found {found}")]
    UnknownValueType { what: String, found: i32 },
    #[error(
        "metadata key {key:?}: expected arrays nested at most {max} deep, found deeper nesting"
    )]
    NestingTooDeep { key: String, max: usize },
    #[error("general.alignment: expected a UINT32 that is a nonzero power of two, found {found}")]
    BadAlignment { found: String },
    #[error("tensor #{index}: expected a non-empty tensor name, found an empty string")]
    EmptyTensorName { index: u64 },
    #[error("tensor {name:?}: expected unique tensor names, found a duplicate")]
    DuplicateTensor { name: String },
    #[error("tensor {name:?}: expected n_dims <= 4, found {found}")]
    TooManyDims { name: String, found: u32 },
    #[error("tensor {name:?}: expected dimension ne[{dim}] >= 1, found {found}")]
    BadDim {
        name: String,
        dim: usize,
        found: i64,
    },
    #[error("tensor {name:?}: element count or byte size overflows (ne = {ne:?})")]
    SizeOverflow { name: String, ne: [u64; 4] },
    #[error("tensor {name:?}: expected a known ggml type id (spec §7.4), found {found}{}", if *removed { " (a removed type id)" } else { "" })]
    UnknownTensorType {
        name: String,
        found: i32,
        removed: bool,
    },
    #[error("tensor {name:?}: expected ne[0] to be a multiple of the {ty} block size {block_size}, found ne[0] = {ne0}")]
    BadRowLength {
        name: String,
        ty: GgmlType,
        block_size: u64,
        ne0: u64,
    },
    #[error(
        "tensor {name:?}: expected offset {offset} to be a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {name:?}: expected data (data_start {data_start} + offset {offset}, {n_bytes} bytes) inside the file, but the file has {len} bytes")]
    TensorOutOfBounds {
        name: String,
        data_start: u64,
        offset: u64,
        n_bytes: u64,
        len: u64,
    },
    #[error(
        "tensors {first:?} and {second:?}: expected disjoint data, found overlapping byte ranges"
    )]
    OverlappingTensors { first: String, second: String },
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    TypeMismatch {
        key: String,
        expected: &'static str,
        found: String,
    },
}

impl GgufError {
    /// Prefix the location description of a low-level error with `ctx`.
    pub(crate) fn in_ctx(mut self, ctx: impl FnOnce() -> String) -> Self {
        match &mut self {
            GgufError::Truncated { what, .. }
            | GgufError::Invalid { what, .. }
            | GgufError::CountTooLarge { what, .. }
            | GgufError::InvalidUtf8 { what, .. }
            | GgufError::UnknownValueType { what, .. } => *what = format!("{}: {}", ctx(), what),
            _ => {}
        }
        self
    }
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

impl MetaValue {
    /// The gguf_type id (spec §1.2).
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
    /// The gguf type name ("UINT32", ...).
    pub fn type_name(&self) -> &'static str {
        type_id_name(self.type_id() as i32)
    }
    /// A description of the type for error messages ("ARRAY of STRING", ...).
    pub fn describe(&self) -> String {
        match self {
            MetaValue::Array(v) => match v.first() {
                Some(e) => format!("ARRAY of {}", e.describe()),
                None => "empty ARRAY".to_string(),
            },
            _ => self.type_name().to_string(),
        }
    }
    /// Any integer type as i128, so that every value fits (BOOL is not an integer).
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }
    /// Any integer type that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }
    /// Any integer type that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }
    /// F32 or F64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// The name of a gguf_type id, or "unknown type" for ids outside 0..=12.
pub fn type_id_name(id: i32) -> &'static str {
    match id {
        0 => "UINT8",
        1 => "INT8",
        2 => "UINT16",
        3 => "INT16",
        4 => "UINT32",
        5 => "INT32",
        6 => "FLOAT32",
        7 => "BOOL",
        8 => "STRING",
        9 => "ARRAY",
        10 => "UINT64",
        11 => "INT64",
        12 => "FLOAT64",
        _ => "unknown type",
    }
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

impl TensorInfo {
    /// ne0 * ne1 * ne2 * ne3 (validated not to overflow when the file was opened).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
    /// The first `n_dims` entries of `ne`.
    pub fn shape(&self) -> &[u64] {
        &self.ne[..(self.n_dims as usize).min(4)]
    }
    /// All four `ne` as the ops' shape (what a graph's weight node declares).
    pub fn op_shape(&self) -> pn_ops::Shape {
        pn_ops::Shape(self.ne.map(|n| n as usize))
    }
}

/// Where the file's bytes live.
enum Backing {
    /// The file mapped (its pages the page cache's).
    Mmap(memmap2::Mmap),
    /// The file read into anonymous memory ([`LoadMode::Copy`]).
    Anon(memmap2::Mmap),
    Vec(Vec<u8>),
    Static(&'static [u8]),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) | Backing::Anon(m) => m,
            Backing::Vec(v) => v,
            Backing::Static(s) => s,
        }
    }
}

pub struct Gguf {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
    backing: Backing,
    /// Per tensor, its `rows16` copy once made ([`Gguf::prepare_rows16`]).
    rows16: Vec<std::sync::OnceLock<Option<memmap2::Mmap>>>,
    /// Per tensor, its plain copy once made ([`Gguf::prepare_plain_copies`]): the
    /// region it lies in and its offset there.
    plain: Vec<std::sync::OnceLock<(std::sync::Arc<memmap2::Mmap>, usize)>>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("file_len", &self.backing.bytes().len())
            .finish()
    }
}

fn mismatch(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
    GgufError::TypeMismatch {
        key: key.to_string(),
        expected,
        found: found.describe(),
    }
}

impl Gguf {
    /// Memory-map and parse a GGUF file. Tensor data is not copied.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |err| GgufError::Io {
            path: path.display().to_string(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Gguf::from_backing(Backing::Vec(Vec::new()));
        }
        // SAFETY: the mapping is read-only and lives inside the returned `Gguf` (every
        // slice we hand out borrows from it). Soundness requires that no one truncates or
        // writes the file while it is mapped; model files are treated as immutable, which
        // is the same assumption llama.cpp and every mmap-based loader make.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        // advice only: where the kernel backs read-only file pages with huge pages
        // (CONFIG_READ_ONLY_THP_FOR_FS), the weights stream with fewer TLB misses
        let _ = map.advise(memmap2::Advice::HugePage);
        Gguf::from_backing(Backing::Mmap(map))
    }
    /// Parse a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Gguf::from_backing(Backing::Vec(bytes))
    }
    /// Parse a GGUF file embedded in the binary (`include_bytes!`). Nothing is copied.
    pub fn from_static(bytes: &'static [u8]) -> Result<Gguf, GgufError> {
        Gguf::from_backing(Backing::Static(bytes))
    }
    fn from_backing(backing: Backing) -> Result<Gguf, GgufError> {
        let p = parse::parse(backing.bytes())?;
        let rows16 = (0..p.tensors.len()).map(|_| std::sync::OnceLock::new()).collect();
        let plain = (0..p.tensors.len()).map(|_| std::sync::OnceLock::new()).collect();
        Ok(Gguf {
            version: p.version,
            alignment: p.alignment,
            data_start: p.data_start,
            metadata: p.metadata,
            tensors: p.tensors,
            kv_index: p.kv_index,
            tensor_index: p.tensor_index,
            backing,
            rows16,
            plain,
        })
    }

    /// The whole file.
    pub fn file_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }
    /// Whether the file is memory-mapped (as opposed to held in a Vec or a static).
    pub fn is_mmapped(&self) -> bool {
        matches!(self.backing, Backing::Mmap(_) | Backing::Anon(_))
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
    /// The data of a tensor of this file: exactly `info.n_bytes` bytes, borrowed from
    /// the mapping. Panics if `info` does not lie inside this file (a `TensorInfo` from
    /// another file); use `try_tensor_bytes` for a non-panicking version.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        match self.try_tensor_bytes(info) {
            Some(b) => b,
            None => panic!(
                "tensor {:?} (offset {}, {} bytes) is not inside this GGUF file ({} bytes, data_start {})",
                info.name,
                info.offset,
                info.n_bytes,
                self.file_bytes().len(),
                self.data_start
            ),
        }
    }
    /// `tensor_bytes`, or `None` if the range is not inside the file.
    pub fn try_tensor_bytes(&self, info: &TensorInfo) -> Option<&[u8]> {
        let start = self.data_start.checked_add(info.offset)?;
        let end = start.checked_add(info.n_bytes)?;
        let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
        self.file_bytes().get(start..end)
    }
    /// The data of the tensor called `name`.
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_bytes(t))
    }

    /// `general.architecture`, if it is present and a string.
    pub fn arch(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }
    /// A STRING value.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| mismatch(key, "STRING", v)),
        }
    }
    /// Any integer type whose value fits in u64.
    pub fn get_u64_lenient(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| mismatch(key, "an integer that fits in u64", v).with_value(v)),
        }
    }
    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| mismatch(key, "an integer that fits in u32", v).with_value(v)),
        }
    }
    /// Any integer type whose value fits in i64.
    pub fn get_i64_lenient(&self, key: &str) -> Result<Option<i64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| mismatch(key, "an integer that fits in i64", v).with_value(v)),
        }
    }
    /// FLOAT32 or FLOAT64 (converted to f32).
    pub fn get_f32_lenient(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| mismatch(key, "FLOAT32 or FLOAT64", v)),
        }
    }
    /// A BOOL value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| mismatch(key, "BOOL", v)),
        }
    }
    /// An ARRAY value (elements of any type).
    pub fn get_array(&self, key: &str) -> Result<Option<&[MetaValue]>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| mismatch(key, "ARRAY", v)),
        }
    }
    /// An ARRAY of integers (any integer type that fits in i64; BOOL counts as 0/1, as
    /// llama.cpp's per-layer arrays allow).
    pub fn get_int_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        self.array_of(key, "ARRAY of integers that fit in i64", |e| match e {
            MetaValue::Bool(b) => Some(*b as i64),
            _ => e.as_i64(),
        })
    }
    /// An ARRAY of FLOAT32 or FLOAT64 (converted to f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        self.array_of(key, "ARRAY of FLOAT32 or FLOAT64", |e| {
            e.as_f64().map(|x| x as f32)
        })
    }
    /// An ARRAY of STRING.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        self.array_of(key, "ARRAY of STRING", MetaValue::as_str)
    }
    fn array_of<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| mismatch(key, expected, v))?;
        arr.iter()
            .map(f)
            .collect::<Option<Vec<T>>>()
            .map(Some)
            .ok_or_else(|| mismatch(key, expected, v))
    }
}

impl GgufError {
    /// For integer range errors: add the offending value to `found`.
    fn with_value(mut self, v: &MetaValue) -> Self {
        if let GgufError::TypeMismatch { found, .. } = &mut self {
            if let Some(x) = v.as_i128() {
                *found = format!("{found} {x}");
            }
        }
        self
    }
}
