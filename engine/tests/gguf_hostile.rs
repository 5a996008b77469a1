//! Hostile corpus, part 1 (header, truncation, strings, metadata): every malformation
//! gets a typed error, never a panic, an out-of-bounds read or an unbounded allocation.
//! Files are built byte by byte (builders in gguf_common/).

mod gguf_common;
use gguf_common::*;
use pn_engine::gguf::MAX_ARRAY_DEPTH;
use pn_engine::{Gguf, GgufError};

// ---- the valid base ------------------------------------------------------------

#[test]
fn base_file_is_valid() {
    let g = Gguf::from_bytes(valid()).unwrap();
    assert_eq!(g.tensors.len(), 3);
    assert_eq!(g.metadata.len(), 3);
    assert_eq!(g.tensor_data("c").unwrap().len(), 8);
}

// ---- header ----------------------------------------------------------------------

#[test]
fn bad_magic() {
    for m in [b"GGUX", b"FUGG", b"\0\0\0\0", b"ggml"] {
        let mut b = valid();
        b[..4].copy_from_slice(m);
        let e = err(b);
        assert!(
            matches!(e, GgufError::BadMagic { found } if &found == m),
            "{e:?}"
        );
        msg_has(&e, &["expected magic", "GGUF"]);
    }
}

#[test]
fn bad_versions() {
    for v in [0u32, 1, 4, 0x0300_0000, 0x0200_0000, 0x0003_0000, u32::MAX] {
        let mut b = valid();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err(b);
        assert!(matches!(e, GgufError::BadVersion(x) if x == v), "{e:?}");
        msg_has(&e, &["expected 2 or 3", &v.to_string()]);
    }
}

#[test]
fn negative_counts() {
    for (at, what) in [(8, "tensor count"), (16, "metadata kv count")] {
        for n in [-1i64, i64::MIN] {
            let mut b = valid();
            b[at..at + 8].copy_from_slice(&n.to_le_bytes());
            let e = err(b);
            assert!(
                matches!(e, GgufError::NegativeCount { found, .. } if found == n),
                "{e:?}"
            );
            msg_has(&e, &[what, &n.to_string()]);
        }
    }
}

#[test]
fn huge_counts_fail_before_allocating() {
    for (at, what) in [(8, "tensor count"), (16, "metadata kv count")] {
        for n in [1i64 << 40, i64::MAX, 1_000_000] {
            let mut b = valid();
            b[at..at + 8].copy_from_slice(&n.to_le_bytes());
            let e = err(b);
            assert!(
                matches!(e, GgufError::CountTooLarge { .. }),
                "{what} {n}: {e:?}"
            );
            msg_has(&e, &[what]);
        }
    }
    // Counts that fit separately but not together.
    let mut b = valid();
    let rem = (b.len() - 24) as i64;
    b[8..16].copy_from_slice(&(rem / 25).to_le_bytes());
    b[16..24].copy_from_slice(&(rem / 14).to_le_bytes());
    assert!(matches!(err(b), GgufError::CountTooLarge { .. }));
}

// ---- truncation -----------------------------------------------------------------

#[test]
fn truncated_at_every_offset_errors() {
    let b = valid();
    let g = Gguf::from_bytes(b.clone()).unwrap();
    let data_end = g
        .tensors
        .iter()
        .map(|t| g.data_start + t.offset + t.n_bytes)
        .max()
        .unwrap() as usize;
    for n in 0..data_end {
        let e = err(b[..n].to_vec());
        if n < g.data_start as usize {
            let ok = matches!(
                e,
                GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }
            ) || (n >= g.data_start as usize - 31
                && matches!(e, GgufError::TensorOutOfBounds { .. }));
            assert!(ok, "prefix {n}: {e:?}");
        } else {
            assert!(
                matches!(e, GgufError::TensorOutOfBounds { .. }),
                "prefix {n}: {e:?}"
            );
        }
    }
    let e = err(b[..10].to_vec());
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                offset: 8,
                needed: 8,
                len: 10,
                ..
            }
        ),
        "{e:?}"
    );
    msg_has(
        &e,
        &["tensor count", "needed 8 bytes at offset 8", "has 10 bytes"],
    );
}

#[test]
fn truncated_inside_a_key_names_it() {
    let kvs = [kv_str("general.architecture", "qwen35moe")];
    let b = file(&kvs, &[], &[], 32);
    let e = err(b[..b.len() - 3].to_vec());
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
    msg_has(&e, &["general.architecture", "STRING value"]);
}

// ---- strings --------------------------------------------------------------------

#[test]
fn huge_string_lengths() {
    for len in [1u64 << 63, u64::MAX, 1 << 40, 1000] {
        let mut key = len.to_le_bytes().to_vec();
        key.extend_from_slice(b"abc");
        let mut b = file(&[], &[], &[], 32);
        b[16..24].copy_from_slice(&1i64.to_le_bytes());
        b.extend_from_slice(&key);
        b.extend_from_slice(&[0u8; 16]);
        let e = err(b);
        assert!(
            matches!(e, GgufError::Truncated { needed, .. } if needed == len),
            "{e:?}"
        );
        // Also as a string value and as a tensor name.
        let mut v = len.to_le_bytes().to_vec();
        v.extend_from_slice(b"xyz");
        let e = err(file(&[kv(b"k", 8, &v)], &[], &[], 32));
        assert!(
            matches!(e, GgufError::Truncated { needed, .. } if needed == len),
            "{e:?}"
        );
        let mut t = info(b"", &[1], 0, 0);
        t[..8].copy_from_slice(&len.to_le_bytes());
        let e = err(with_tensors(&[t], 64));
        assert!(
            matches!(e, GgufError::Truncated { needed, .. } if needed == len),
            "{e:?}"
        );
    }
}

#[test]
fn string_one_past_eof() {
    let mut b = file(&[kv_str("k", "hello")], &[], &[], 32);
    let at = b.len() - 13;
    b[at..at + 8].copy_from_slice(&6u64.to_le_bytes());
    let e = err(b);
    assert!(matches!(e, GgufError::Truncated { needed: 6, .. }), "{e:?}");
}

#[test]
fn invalid_utf8() {
    let bad: &[u8] = b"ab\xffcd";
    let e = err(file(&[kv(bad, 4, &1u32.to_le_bytes())], &[], &[], 32));
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e:?}");
    msg_has(&e, &["metadata key #0", "UTF-8"]);
    let e = err(file(&[kv(b"k", 8, &s(bad))], &[], &[], 32));
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e:?}");
    msg_has(&e, &["\"k\""]);
    let mut a = arr_header(8, 2);
    a.extend(s(b"ok"));
    a.extend(s(b"\xc3"));
    let e = err(file(&[kv(b"k", 9, &a)], &[], &[], 32));
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e:?}");
    msg_has(&e, &["array element #1"]);
    let e = err(with_tensors(&[info(bad, &[1], 0, 0)], 64));
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e:?}");
}

// ---- keys and values ----------------------------------------------------------

#[test]
fn empty_key() {
    let e = err(file(&[kv_u32("a", 1), kv_u32("", 2)], &[], &[], 32));
    assert!(matches!(e, GgufError::EmptyKey { index: 1, .. }), "{e:?}");
}

#[test]
fn duplicate_key() {
    let e = err(file(
        &[kv_u32("a.b", 1), kv_str("x", "y"), kv_u32("a.b", 2)],
        &[],
        &[],
        32,
    ));
    assert!(
        matches!(&e, GgufError::DuplicateKey { key } if key == "a.b"),
        "{e:?}"
    );
    msg_has(&e, &["a.b", "duplicate"]);
}

#[test]
fn unknown_value_types() {
    for t in [13, 100, -1, i32::MIN] {
        let e = err(file(&[kv(b"k", t, &[0; 16])], &[], &[], 32));
        assert!(
            matches!(e, GgufError::UnknownValueType { found, .. } if found == t),
            "{e:?}"
        );
        msg_has(&e, &["\"k\"", "0..=12", &t.to_string()]);
        let e = err(file(&[kv(b"k", 9, &arr_header(t, 1))], &[], &[], 32));
        assert!(
            matches!(e, GgufError::UnknownValueType { found, .. } if found == t),
            "{e:?}"
        );
        msg_has(&e, &["array element type"]);
    }
}

#[test]
fn bool_nonzero_is_true() {
    let g = Gguf::from_bytes(file(&[kv(b"b", 7, &[2])], &[], &[], 32)).unwrap();
    assert_eq!(g.get_bool("b").unwrap(), Some(true));
}

#[test]
fn huge_array_counts_fail_before_allocating() {
    for (elem, count) in [
        (0, 1u64 << 40),
        (10, 1 << 62),
        (10, u64::MAX),
        (8, 1 << 61),
        (9, 1 << 60),
        (7, 17),
    ] {
        let mut p = arr_header(elem, count);
        p.extend_from_slice(&[0u8; 16]);
        let e = err(file(&[kv(b"arr", 9, &p)], &[], &[], 32));
        assert!(
            matches!(e, GgufError::CountTooLarge { count: c, .. } if c == count),
            "{e:?}"
        );
        msg_has(&e, &["\"arr\"", &count.to_string()]);
    }
}

#[test]
fn nesting_depth_is_bounded() {
    assert!(Gguf::from_bytes(nested(MAX_ARRAY_DEPTH)).is_ok());
    for d in [MAX_ARRAY_DEPTH + 1, 1000, 200_000] {
        let e = err(nested(d));
        assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e:?}");
        msg_has(&e, &["deep", &MAX_ARRAY_DEPTH.to_string()]);
    }
}

#[test]
fn bad_alignment_values() {
    let cases: Vec<Vec<u8>> = vec![
        kv_u32("general.alignment", 0),
        kv_u32("general.alignment", 3),
        kv_u32("general.alignment", 48),
        kv(b"general.alignment", 10, &32u64.to_le_bytes()),
        kv(b"general.alignment", 5, &32i32.to_le_bytes()),
        kv_str("general.alignment", "32"),
    ];
    for c in cases {
        let e = err(file(&[c], &[], &[], 32));
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e:?}");
        msg_has(&e, &["general.alignment", "power of two"]);
    }
    let g = Gguf::from_bytes(file(&[kv_u32("general.alignment", 1 << 31)], &[], &[], 32)).unwrap();
    assert_eq!(g.alignment, 1 << 31);
}
