//! The GGUF parser proper: a bounds-checked cursor over the file bytes and the checks of
//! spec §1. Every count is checked against the remaining bytes before anything is
//! allocated, every arithmetic step on file-controlled values is checked, and nothing
//! here can read outside `buf` or panic.

use super::{type_id_name, GgufError, MetaValue, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
use pn_ops::GgmlType;
use std::collections::HashMap;

pub(super) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub kv_index: HashMap<String, usize>,
    pub tensor_index: HashMap<String, usize>,
}

/// Smallest encoding of one KV pair: key length (8) + 1 key byte + value type (4) + a
/// 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest encoding of one tensor info: name length (8) + 1 name byte + n_dims (4) +
/// type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 4 + 8;
/// Never reserve more than this many entries up front; vectors grow as entries parse.
const MAX_RESERVE: usize = 4096;

/// Ggml type ids that were removed from ggml (spec §7.4).
const REMOVED_TYPE_IDS: &[i32] = &[4, 5, 31, 32, 33, 36, 37, 38];

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the addition cannot overflow.
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.arr::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        self.arr(what).map(u16::from_le_bytes)
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.arr(what).map(u32::from_le_bytes)
    }
    fn i32(&mut self, what: &str) -> Result<i32, GgufError> {
        self.arr(what).map(i32::from_le_bytes)
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.arr(what).map(u64::from_le_bytes)
    }
    fn i64(&mut self, what: &str) -> Result<i64, GgufError> {
        self.arr(what).map(i64::from_le_bytes)
    }
    /// A `u64 length` + UTF-8 bytes string.
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what.to_string(),
                offset: start,
                len,
            }),
        }
    }
    /// Check that `count` items of at least `min_each` bytes each can fit in the rest of
    /// the file, before anything is allocated for them.
    fn check_count(&self, count: u64, min_each: u64, what: &str) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_each)
            .is_some_and(|total| total <= self.remaining());
        if !fits {
            return Err(GgufError::CountTooLarge {
                what: what.to_string(),
                count,
                min_bytes_each: min_each,
                offset: self.pos as u64,
                remaining: self.remaining(),
            });
        }
        // count <= remaining <= usize::MAX.
        Ok(count as usize)
    }
}

/// Smallest encoding of one value of gguf type `t` (arrays: elem type + count).
fn min_value_bytes(t: i32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn read_value(c: &mut Cursor, t: i32, depth: usize, key: &str) -> Result<MetaValue, GgufError> {
    Ok(match t {
        0 => MetaValue::U8(c.u8("UINT8 value")?),
        1 => MetaValue::I8(c.u8("INT8 value")? as i8),
        2 => MetaValue::U16(c.u16("UINT16 value")?),
        3 => MetaValue::I16(c.u16("INT16 value")? as i16),
        4 => MetaValue::U32(c.u32("UINT32 value")?),
        5 => MetaValue::I32(c.i32("INT32 value")?),
        6 => MetaValue::F32(f32::from_bits(c.u32("FLOAT32 value")?)),
        7 => MetaValue::Bool(c.u8("BOOL value")? != 0),
        8 => MetaValue::String(c.string("STRING value")?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    key: key.to_string(),
                    max: MAX_ARRAY_DEPTH,
                });
            }
            let et = c.i32("array element type")?;
            let Some(min_each) = min_value_bytes(et) else {
                return Err(GgufError::UnknownValueType {
                    what: "array element type".into(),
                    found: et,
                });
            };
            let count = c.u64("array count")?;
            let n = c.check_count(count, min_each, &format!("array of {}", type_id_name(et)))?;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let e = read_value(c, et, depth + 1, key)
                    .map_err(|e| e.in_ctx(|| format!("array element #{i}")))?;
                v.push(e);
            }
            MetaValue::Array(v)
        }
        10 => MetaValue::U64(c.u64("UINT64 value")?),
        11 => MetaValue::I64(c.i64("INT64 value")?),
        12 => MetaValue::F64(f64::from_bits(c.u64("FLOAT64 value")?)),
        _ => {
            return Err(GgufError::UnknownValueType {
                what: "value type".into(),
                found: t,
            })
        }
    })
}

fn check_nonneg(v: i64, what: &str) -> Result<u64, GgufError> {
    u64::try_from(v).map_err(|_| GgufError::NegativeCount {
        what: what.to_string(),
        found: v,
    })
}

pub(super) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0 };

    // Header.
    let magic: [u8; 4] = c.arr("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if !(version == 2 || version == 3) {
        return Err(GgufError::BadVersion(version));
    }
    let n_tensors = check_nonneg(c.i64("tensor count")?, "tensor count")?;
    let n_kv = check_nonneg(c.i64("metadata kv count")?, "metadata kv count")?;
    let n_kv = c.check_count(n_kv, MIN_KV_BYTES, "metadata kv count")?;
    let n_tensors_us = c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor count")?;
    let both = (n_kv as u64).checked_mul(MIN_KV_BYTES).and_then(|a| {
        n_tensors
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .and_then(|b| a.checked_add(b))
    });
    if both.is_none_or(|b| b > c.remaining()) {
        return Err(GgufError::CountTooLarge {
            what: format!("metadata kv count {n_kv} together with tensor count"),
            count: n_tensors,
            min_bytes_each: MIN_TENSOR_INFO_BYTES,
            offset: c.pos as u64,
            remaining: c.remaining(),
        });
    }

    // Metadata.
    let mut metadata = Vec::with_capacity(n_kv.min(MAX_RESERVE));
    let mut kv_index = HashMap::with_capacity(n_kv.min(MAX_RESERVE));
    for i in 0..n_kv {
        let key_off = c.pos as u64;
        let key = c
            .string("key")
            .map_err(|e| e.in_ctx(|| format!("metadata key #{i}")))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey {
                index: i as u64,
                offset: key_off,
            });
        }
        if kv_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        let ctx = || format!("metadata key {key:?}");
        let t = c.i32("value type").map_err(|e| e.in_ctx(ctx))?;
        let v = read_value(&mut c, t, 0, &key).map_err(|e| e.in_ctx(ctx))?;
        kv_index.insert(key.clone(), metadata.len());
        metadata.push((key, v));
    }

    // Alignment (spec §1.4).
    let alignment = match kv_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT as u64,
        Some(MetaValue::U32(a)) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some(v) => {
            let found = match v {
                MetaValue::U32(a) => format!("UINT32 {a}"),
                other => other.describe(),
            };
            return Err(GgufError::BadAlignment { found });
        }
    };

    // Tensor infos.
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors_us.min(MAX_RESERVE));
    let mut tensor_index = HashMap::with_capacity(n_tensors_us.min(MAX_RESERVE));
    for i in 0..n_tensors_us {
        let info = read_tensor_info(&mut c, i as u64)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        if info.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                name: info.name,
                offset: info.offset,
                alignment,
            });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    // Data section: data_start = align_up(end of tensor infos, alignment).
    let end_infos = c.pos as u64;
    let data_start = end_infos
        .checked_add(alignment - 1)
        .map(|x| x / alignment * alignment)
        .ok_or_else(|| GgufError::Invalid {
            what: "data section".into(),
            msg: format!("expected align_up({end_infos}, {alignment}) to fit in u64"),
        })?;
    let len = buf.len() as u64;
    let mut ranges = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|e| e > len) {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                data_start,
                offset: t.offset,
                n_bytes: t.n_bytes,
                len,
            });
        }
        ranges.push((t.offset, t.offset + t.n_bytes, i));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.0 < a.1 {
            return Err(GgufError::OverlappingTensors {
                first: tensors[a.2].name.clone(),
                second: tensors[b.2].name.clone(),
            });
        }
    }

    Ok(Parsed {
        version,
        alignment,
        data_start,
        metadata,
        tensors,
        kv_index,
        tensor_index,
    })
}

fn read_tensor_info(c: &mut Cursor, index: u64) -> Result<TensorInfo, GgufError> {
    let name = c
        .string("name")
        .map_err(|e| e.in_ctx(|| format!("tensor info #{index}")))?;
    if name.is_empty() {
        return Err(GgufError::EmptyTensorName { index });
    }
    let ctx = || format!("tensor info {name:?}");
    let n_dims = c.u32("n_dims").map_err(|e| e.in_ctx(ctx))?;
    if n_dims > 4 {
        return Err(GgufError::TooManyDims {
            name,
            found: n_dims,
        });
    }
    let mut ne = [1u64; 4];
    for (d, slot) in ne.iter_mut().enumerate().take(n_dims as usize) {
        let v = c.i64("dimension").map_err(|e| e.in_ctx(ctx))?;
        if v <= 0 {
            return Err(GgufError::BadDim {
                name,
                dim: d,
                found: v,
            });
        }
        *slot = v as u64;
    }
    let type_id = c.i32("type").map_err(|e| e.in_ctx(ctx))?;
    let offset = c.u64("offset").map_err(|e| e.in_ctx(ctx))?;
    let ty = match u32::try_from(type_id).ok().and_then(GgmlType::from_id) {
        Some(ty) => ty,
        None => {
            let removed = REMOVED_TYPE_IDS.contains(&type_id);
            return Err(GgufError::UnknownTensorType {
                name,
                found: type_id,
                removed,
            });
        }
    };
    // ggml counts elements in i64.
    let n_el = ne
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64);
    if n_el.is_none() {
        return Err(GgufError::SizeOverflow { name, ne });
    }
    let (bs, ts) = (ty.block_size() as u64, ty.type_size() as u64);
    if ne[0] % bs != 0 {
        return Err(GgufError::BadRowLength {
            name,
            ty,
            block_size: bs,
            ne0: ne[0],
        });
    }
    let n_bytes = (ne[0] / bs)
        .checked_mul(ts)
        .and_then(|r| r.checked_mul(ne[1]))
        .and_then(|r| r.checked_mul(ne[2]))
        .and_then(|r| r.checked_mul(ne[3]));
    let Some(n_bytes) = n_bytes else {
        return Err(GgufError::SizeOverflow { name, ne });
    };
    Ok(TensorInfo {
        name,
        ne,
        n_dims,
        ty,
        offset,
        n_bytes,
    })
}
