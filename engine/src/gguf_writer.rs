//! A small GGUF writer (spec §1) for tests and tools: metadata in insertion order plus
//! tensors of any `GgmlType` given as raw bytes.
//!
//! ```no_run
//! use pn_engine::gguf_writer::GgufWriter;
//! use pn_engine::MetaValue;
//! use pn_ops::GgmlType;
//! let bytes = GgufWriter::new()
//!     .kv("general.architecture", MetaValue::String("qwen35moe".into()))
//!     .tensor("w", &[4, 2], GgmlType::F32, vec![0u8; 32])
//!     .to_bytes();
//! let g = pn_engine::Gguf::from_bytes(bytes).unwrap();
//! ```
//!
//! The writer lays tensors out exactly as llama.cpp does: offsets are the running sum of
//! `align_up(n_bytes, alignment)` in insertion order, and every tensor (the last one
//! included) is zero-padded to the alignment. It panics on inputs that cannot be encoded
//! (a tensor whose byte length does not match its shape and type, a heterogeneous
//! array): it is a test helper, and those are bugs in the caller.

use crate::gguf::{MetaValue, DEFAULT_ALIGNMENT};
use pn_ops::GgmlType;
use std::path::Path;

/// Element type written for an empty `MetaValue::Array` (the value carries none).
const EMPTY_ARRAY_ELEM_TYPE: u32 = 0;

struct PendingTensor {
    name: String,
    ne: Vec<u64>,
    ty: GgmlType,
    bytes: Vec<u8>,
}

/// Builds a GGUF file in memory.
pub struct GgufWriter {
    version: u32,
    alignment: Option<u32>,
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty GGUF v3 file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
    /// The version field to write (the layout of 2 and 3 is the same; any other value
    /// makes a file readers reject, which is useful for tests).
    pub fn version(mut self, version: u32) -> GgufWriter {
        self.version = version;
        self
    }
    /// Set the data alignment; written as the `general.alignment` UINT32 key (replacing
    /// an existing one, else appended after the other keys). Must be a power of two.
    pub fn alignment(mut self, alignment: u32) -> GgufWriter {
        assert!(
            alignment.is_power_of_two(),
            "GGUF alignment must be a nonzero power of two, got {alignment}"
        );
        self.alignment = Some(alignment);
        self
    }
    /// Add a metadata key (in order). Adding a key twice writes it twice (a file that
    /// readers reject; useful for tests).
    pub fn kv(mut self, key: impl Into<String>, value: MetaValue) -> GgufWriter {
        self.kvs.push((key.into(), value));
        self
    }
    /// Add a tensor. `ne` is in ggml order (ne[0] innermost), 1 to 4 dims; `bytes` must
    /// be exactly the tensor's size for `ty`.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        ne: &[u64],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> GgufWriter {
        let name = name.into();
        assert!(
            ne.len() <= 4,
            "tensor {name:?}: at most 4 dims, got {}",
            ne.len()
        );
        let expected = tensor_n_bytes(ne, ty)
            .unwrap_or_else(|| panic!("tensor {name:?}: ne {ne:?} is not a valid shape for {ty}"));
        assert_eq!(
            bytes.len() as u64,
            expected,
            "tensor {name:?}: {ty} {ne:?} needs {expected} bytes"
        );
        self.tensors.push(PendingTensor {
            name,
            ne: ne.to_vec(),
            ty,
            bytes,
        });
        self
    }

    fn effective_alignment(&self) -> u64 {
        if let Some(a) = self.alignment {
            return a as u64;
        }
        match self.kvs.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => *a as u64,
            _ => DEFAULT_ALIGNMENT as u64,
        }
    }

    /// Serialize the whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.effective_alignment();
        let mut kvs: Vec<(&str, MetaValue)> = self
            .kvs
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        if let Some(a) = self.alignment {
            match kvs.iter_mut().find(|(k, _)| *k == "general.alignment") {
                Some(kv) => kv.1 = MetaValue::U32(a),
                None => kvs.push(("general.alignment", MetaValue::U32(a))),
            }
        }

        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as i64).to_le_bytes());
        out.extend_from_slice(&(kvs.len() as i64).to_le_bytes());
        for (k, v) in &kvs {
            write_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            write_value(&mut out, v);
        }

        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                out.extend_from_slice(&(d as i64).to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += align_up(t.bytes.len() as u64, align);
        }
        if !self.tensors.is_empty() {
            pad_to(&mut out, align);
            for t in &self.tensors {
                out.extend_from_slice(&t.bytes);
                pad_to(&mut out, align);
            }
        }
        out
    }

    /// Serialize and write to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}

/// Bytes of a tensor of shape `ne` (ggml order) and type `ty`, or `None` if ne[0] is not
/// a multiple of the block size, a dim is 0, or the size overflows.
pub fn tensor_n_bytes(ne: &[u64], ty: GgmlType) -> Option<u64> {
    let ne0 = ne.first().copied().unwrap_or(1);
    let bs = ty.block_size() as u64;
    if ne.contains(&0) || ne0 % bs != 0 {
        return None;
    }
    ne.iter()
        .skip(1)
        .try_fold((ne0 / bs).checked_mul(ty.type_size() as u64)?, |a, &d| {
            a.checked_mul(d)
        })
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let target = align_up(out.len() as u64, align) as usize;
    out.resize(target, 0);
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Write one value without its type id.
fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => write_str(out, s),
        MetaValue::Array(a) => {
            let et = a.first().map_or(EMPTY_ARRAY_ELEM_TYPE, MetaValue::type_id);
            assert!(
                a.iter().all(|e| e.type_id() == et),
                "GGUF arrays must be homogeneous (all elements of gguf type {et})"
            );
            out.extend_from_slice(&et.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                write_value(out, e);
            }
        }
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
    }
}
