//! Raw byte builders shared by the hostile GGUF tests.
#![allow(dead_code)]

use pn_engine::{Gguf, GgufError};

// ----- raw byte builders -------------------------------------------------------------

pub fn s(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}
pub fn kv(key: &[u8], ty: i32, payload: &[u8]) -> Vec<u8> {
    let mut v = s(key);
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(payload);
    v
}
pub fn kv_u32(key: &str, x: u32) -> Vec<u8> {
    kv(key.as_bytes(), 4, &x.to_le_bytes())
}
pub fn kv_str(key: &str, x: &str) -> Vec<u8> {
    kv(key.as_bytes(), 8, &s(x.as_bytes()))
}
pub fn arr_header(elem: i32, count: u64) -> Vec<u8> {
    let mut v = elem.to_le_bytes().to_vec();
    v.extend_from_slice(&count.to_le_bytes());
    v
}
pub fn info(name: &[u8], dims: &[i64], ty: i32, off: u64) -> Vec<u8> {
    let mut v = s(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&off.to_le_bytes());
    v
}
/// header + kvs + infos, padded to `align`, then `data`.
pub fn file(kvs: &[Vec<u8>], infos: &[Vec<u8>], data: &[u8], align: usize) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&(infos.len() as i64).to_le_bytes());
    v.extend_from_slice(&(kvs.len() as i64).to_le_bytes());
    kvs.iter().chain(infos).for_each(|p| v.extend_from_slice(p));
    if !infos.is_empty() {
        v.resize(v.len().div_ceil(align) * align, 0);
    }
    v.extend_from_slice(data);
    v
}
pub fn with_tensors(infos: &[Vec<u8>], data_len: usize) -> Vec<u8> {
    file(
        &[kv_str("general.architecture", "qwen35moe")],
        infos,
        &vec![7u8; data_len],
        32,
    )
}

/// A small valid file: three kvs (string, u32, nested array) and three tensors.
pub fn valid() -> Vec<u8> {
    let mut nested = arr_header(9, 2);
    nested.extend(arr_header(5, 2));
    nested.extend(1i32.to_le_bytes());
    nested.extend(2i32.to_le_bytes());
    nested.extend(arr_header(8, 1));
    nested.extend(s(b"x"));
    let kvs = [
        kv_str("general.architecture", "qwen35moe"),
        kv_u32("qwen35moe.block_count", 4),
        kv(b"n", 9, &nested),
    ];
    let infos = [
        info(b"a", &[8, 2], 0, 0),
        info(b"b", &[32], 8, 64),
        info(b"c", &[4], 1, 128),
    ];
    file(&kvs, &infos, &[1u8; 136], 32)
}

pub fn err(bytes: Vec<u8>) -> GgufError {
    match Gguf::from_bytes(bytes) {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => e,
    }
}
pub fn msg_has(e: &GgufError, parts: &[&str]) {
    let m = e.to_string();
    for p in parts {
        assert!(m.contains(p), "message {m:?} lacks {p:?}");
    }
}

pub fn nested(depth: usize) -> Vec<u8> {
    // depth arrays, each holding one array, the innermost holding one u8.
    let mut p = Vec::new();
    for _ in 0..depth - 1 {
        p.extend(arr_header(9, 1));
    }
    p.extend(arr_header(0, 1));
    p.push(42);
    file(&[kv(b"deep", 9, &p)], &[], &[], 32)
}
