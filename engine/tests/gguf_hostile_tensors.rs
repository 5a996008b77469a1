//! Hostile corpus, part 2 (tensor infos, data section, committed hostile files under
//! tests/fixtures/hostile/).

mod gguf_common;
use gguf_common::*;
use pn_engine::{Gguf, GgufError};
use std::path::Path;

// ---- tensor infos ---------------------------------------------------------------

#[test]
fn empty_and_duplicate_tensor_names() {
    let e = err(with_tensors(&[info(b"", &[1], 0, 0)], 64));
    assert!(
        matches!(e, GgufError::EmptyTensorName { index: 0 }),
        "{e:?}"
    );
    let e = err(with_tensors(
        &[info(b"w", &[1], 0, 0), info(b"w", &[1], 0, 32)],
        64,
    ));
    assert!(
        matches!(&e, GgufError::DuplicateTensor { name } if name == "w"),
        "{e:?}"
    );
}

#[test]
fn long_tensor_name_is_accepted() {
    let name = vec![b'n'; 100];
    let g = Gguf::from_bytes(with_tensors(&[info(&name, &[1], 0, 0)], 4)).unwrap();
    assert_eq!(g.tensors[0].name.len(), 100);
}

#[test]
fn too_many_dims() {
    for nd in [5usize, 8, 64] {
        let e = err(with_tensors(&[info(b"w", &vec![1; nd], 0, 0)], 64));
        assert!(
            matches!(e, GgufError::TooManyDims { found, .. } if found as usize == nd),
            "{e:?}"
        );
        msg_has(&e, &["\"w\"", "<= 4"]);
    }
    // n_dims = u32::MAX must not try to read 4 billion dims.
    let mut t = info(b"w", &[], 0, 0);
    t[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        err(with_tensors(&[t], 64)),
        GgufError::TooManyDims { .. }
    ));
}

#[test]
fn zero_dims_is_a_scalar() {
    let g = Gguf::from_bytes(with_tensors(&[info(b"s", &[], 0, 0)], 4)).unwrap();
    assert_eq!((g.tensors[0].ne, g.tensors[0].n_bytes), ([1, 1, 1, 1], 4));
}

#[test]
fn nonpositive_dims() {
    for (dims, bad) in [
        (vec![0i64], 0usize),
        (vec![4, -1], 1),
        (vec![4, 2, 1, i64::MIN], 3),
    ] {
        let e = err(with_tensors(&[info(b"w", &dims, 0, 0)], 64));
        assert!(
            matches!(e, GgufError::BadDim { dim, .. } if dim == bad),
            "{e:?}"
        );
        msg_has(&e, &["\"w\"", &format!("ne[{bad}]")]);
    }
}

#[test]
fn size_overflow() {
    let cases: [(&[i64], i32); 4] = [
        (&[1 << 32, 1 << 32, 1 << 32], 0),
        (&[i64::MAX, 2], 24),
        (&[1 << 30, 1 << 30, 4], 0), // 2^62 elements fit, 2^64 bytes do not
        (&[1 << 40, 1 << 40], 30),
    ];
    for (dims, ty) in cases {
        let e = err(with_tensors(&[info(b"w", dims, ty, 0)], 64));
        assert!(
            matches!(e, GgufError::SizeOverflow { .. }),
            "{dims:?}: {e:?}"
        );
        msg_has(&e, &["\"w\"", "overflow"]);
    }
}

#[test]
fn unknown_and_removed_type_ids() {
    for (id, removed) in [
        (99, false),
        (-1, false),
        (40, false),
        (4, true),
        (5, true),
        (31, true),
        (36, true),
        (38, true),
    ] {
        let e = err(with_tensors(&[info(b"blk.0.w", &[256], id, 0)], 1024));
        assert!(
            matches!(e, GgufError::UnknownTensorType { found, removed: r, .. } if found == id && r == removed),
            "{e:?}"
        );
        msg_has(&e, &["blk.0.w", &id.to_string()]);
    }
}

#[test]
fn row_length_not_multiple_of_block() {
    for (ne0, ty) in [(33i64, 8), (16, 2), (255, 12), (100, 39)] {
        let e = err(with_tensors(&[info(b"q", &[ne0, 2], ty, 0)], 4096));
        assert!(
            matches!(e, GgufError::BadRowLength { ne0: n, .. } if n == ne0 as u64),
            "{e:?}"
        );
        msg_has(&e, &["\"q\"", "multiple", &ne0.to_string()]);
    }
}

// ---- data section ---------------------------------------------------------------

#[test]
fn tensor_data_past_eof() {
    let e = err(with_tensors(&[info(b"w", &[16], 0, 0)], 63));
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { n_bytes: 64, .. }),
        "{e:?}"
    );
    msg_has(&e, &["\"w\"", "64 bytes"]);
    let e = err(with_tensors(&[info(b"w", &[1], 0, 1 << 20)], 64));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e:?}");
    // offset + data_start overflows u64.
    let e = err(with_tensors(&[info(b"w", &[1], 0, u64::MAX - 31)], 64));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e:?}");
}

#[test]
fn misaligned_offset() {
    let e = err(with_tensors(&[info(b"w", &[1], 0, 4)], 64));
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{e:?}"
    );
    // Alignment 1 accepts any offset.
    let f = file(
        &[kv_u32("general.alignment", 1)],
        &[info(b"w", &[1], 0, 3)],
        &[0; 8],
        1,
    );
    assert_eq!(Gguf::from_bytes(f).unwrap().tensors[0].offset, 3);
}

#[test]
fn overlapping_tensors() {
    let e = err(with_tensors(
        &[info(b"a", &[16], 0, 0), info(b"b", &[16], 0, 32)],
        128,
    ));
    assert!(matches!(e, GgufError::OverlappingTensors { .. }), "{e:?}");
    msg_has(&e, &["\"a\"", "\"b\"", "overlapping"]);
    let e = err(with_tensors(
        &[info(b"a", &[1], 0, 64), info(b"b", &[1], 0, 64)],
        128,
    ));
    assert!(matches!(e, GgufError::OverlappingTensors { .. }), "{e:?}");
    // Touching is fine, and file order need not be offset order.
    let g = Gguf::from_bytes(with_tensors(
        &[info(b"a", &[8], 0, 32), info(b"b", &[8], 0, 0)],
        64,
    ))
    .unwrap();
    assert_eq!(g.tensors[0].offset, 32);
}

// ---- committed hostile files ------------------------------------------------------

/// (file name, expected error variant, bytes)
fn hostile_files() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut nested_deep = nested(64);
    nested_deep.truncate(nested_deep.len().min(4000));
    let mut bad_version = valid();
    bad_version[4..8].copy_from_slice(&0x0300_0000u32.to_le_bytes());
    let mut huge_arr = arr_header(0, 1 << 40);
    huge_arr.extend_from_slice(&[0; 8]);
    vec![
        ("bad-magic.gguf", "BadMagic", {
            let mut b = valid();
            b[..4].copy_from_slice(b"GGUX");
            b
        }),
        ("bad-version-big-endian.gguf", "BadVersion", bad_version),
        ("truncated-header.gguf", "Truncated", valid()[..20].to_vec()),
        ("truncated-data.gguf", "TensorOutOfBounds", {
            let b = valid();
            b[..b.len() - 1].to_vec()
        }),
        (
            "huge-string-len.gguf",
            "Truncated",
            file(&[kv(b"k", 8, &(1u64 << 63).to_le_bytes())], &[], &[], 32),
        ),
        (
            "huge-array-count.gguf",
            "CountTooLarge",
            file(&[kv(b"k", 9, &huge_arr)], &[], &[], 32),
        ),
        ("nested-too-deep.gguf", "NestingTooDeep", nested_deep),
        (
            "overlapping-tensors.gguf",
            "OverlappingTensors",
            with_tensors(&[info(b"a", &[16], 0, 0), info(b"b", &[16], 0, 32)], 128),
        ),
        (
            "unknown-type.gguf",
            "UnknownTensorType",
            with_tensors(&[info(b"w", &[32], 99, 0)], 128),
        ),
        (
            "duplicate-key.gguf",
            "DuplicateKey",
            file(&[kv_u32("a", 1), kv_u32("a", 2)], &[], &[], 32),
        ),
    ]
}

fn hostile_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hostile")
}

/// `cargo test -p pn-engine --test gguf_hostile_tensors -- --ignored regenerate` rewrites them.
#[test]
#[ignore]
fn regenerate_hostile_files() {
    std::fs::create_dir_all(hostile_dir()).unwrap();
    for (name, _, bytes) in hostile_files() {
        assert!(bytes.len() < 4096, "{name}");
        std::fs::write(hostile_dir().join(name), bytes).unwrap();
    }
}

#[test]
fn committed_hostile_files_all_error() {
    for (name, variant, bytes) in hostile_files() {
        let path = hostile_dir().join(name);
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(on_disk, bytes, "{name} is stale; regenerate it");
        let e = Gguf::open(&path).expect_err(name);
        assert!(
            format!("{e:?}").starts_with(variant),
            "{name}: expected {variant}, got {e:?}"
        );
    }
}
