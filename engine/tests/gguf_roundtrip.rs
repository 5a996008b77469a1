//! GgufWriter -> Gguf round trips: every value type, nested arrays, every tensor type,
//! alignment, versions, the three backings, and the typed getters.

use pn_engine::gguf_writer::{tensor_n_bytes, GgufWriter};
use pn_engine::{Gguf, GgufError, MetaValue};
use pn_ops::GgmlType;

fn all_scalar_values() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(u8::MAX)),
        ("t.i8", MetaValue::I8(i8::MIN)),
        ("t.u16", MetaValue::U16(u16::MAX)),
        ("t.i16", MetaValue::I16(i16::MIN)),
        ("t.u32", MetaValue::U32(u32::MAX)),
        ("t.i32", MetaValue::I32(i32::MIN)),
        ("t.f32", MetaValue::F32(-1.5e-7)),
        ("t.bool_t", MetaValue::Bool(true)),
        ("t.bool_f", MetaValue::Bool(false)),
        ("t.str", MetaValue::String("héllo wörld ✓ 🦀".into())),
        ("t.str_empty", MetaValue::String(String::new())),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f64", MetaValue::F64(std::f64::consts::PI)),
    ]
}

fn all_values() -> Vec<(String, MetaValue)> {
    let mut kvs: Vec<(String, MetaValue)> = all_scalar_values()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    // An array of every element type.
    for (k, v) in all_scalar_values() {
        kvs.push((
            format!("{k}.arr"),
            MetaValue::Array(vec![v.clone(), v.clone(), v]),
        ));
    }
    kvs.push(("t.arr_empty".into(), MetaValue::Array(vec![])));
    // Nested arrays (llama.cpp rejects these; we accept them).
    let inner_i = MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-2)]);
    let inner_s = MetaValue::Array(vec![MetaValue::String("a".into())]);
    kvs.push((
        "t.nested".into(),
        MetaValue::Array(vec![
            inner_i.clone(),
            inner_s.clone(),
            MetaValue::Array(vec![]),
        ]),
    ));
    kvs.push((
        "t.nested3".into(),
        MetaValue::Array(vec![
            MetaValue::Array(vec![inner_i, inner_s]),
            MetaValue::Array(vec![]),
        ]),
    ));
    kvs
}

#[test]
fn every_value_type_round_trips_in_order() {
    let kvs = all_values();
    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w = w.kv(k.clone(), v.clone());
    }
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert!(g.tensors.is_empty());
    assert_eq!(
        g.metadata, kvs,
        "metadata must be in file order and bit-exact"
    );
    for (k, v) in &kvs {
        assert_eq!(g.get(k), Some(v));
    }
    assert_eq!(g.get("missing"), None);
}

#[test]
fn float_special_values_round_trip_bit_exact() {
    let vals = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE / 2.0,
    ];
    let mut w = GgufWriter::new();
    for (i, v) in vals.iter().enumerate() {
        w = w
            .kv(format!("f{i}"), MetaValue::F32(*v))
            .kv(format!("d{i}"), MetaValue::F64(*v as f64));
    }
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    for (i, v) in vals.iter().enumerate() {
        match g.get(&format!("f{i}")) {
            Some(MetaValue::F32(x)) => assert_eq!(x.to_bits(), v.to_bits()),
            other => panic!("{other:?}"),
        }
        match g.get(&format!("d{i}")) {
            Some(MetaValue::F64(x)) => assert_eq!(x.to_bits(), (*v as f64).to_bits()),
            other => panic!("{other:?}"),
        }
    }
}

fn pattern(n: u64, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn every_tensor_type_round_trips() {
    let mut w = GgufWriter::new().kv("general.architecture", MetaValue::String("test".into()));
    let mut expect = Vec::new();
    for (i, ty) in GgmlType::all().enumerate() {
        let ne = [ty.block_size() as u64 * 2, 3, 1 + (i as u64 % 2)];
        let n = tensor_n_bytes(&ne, ty).unwrap();
        let bytes = pattern(n, i as u8);
        w = w.tensor(format!("t.{}", ty.name()), &ne, ty, bytes.clone());
        expect.push((format!("t.{}", ty.name()), ne, ty, bytes));
    }
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.arch(), Some("test"));
    assert_eq!(g.tensors.len(), expect.len());
    assert_eq!(g.data_start % 32, 0);
    for ((name, ne, ty, bytes), t) in expect.iter().zip(&g.tensors) {
        assert_eq!(&t.name, name);
        assert_eq!(t.ty, *ty);
        assert_eq!(t.n_dims, 3);
        assert_eq!(t.ne, [ne[0], ne[1], ne[2], 1]);
        assert_eq!(t.shape(), &ne[..]);
        assert_eq!(t.n_elements(), ne.iter().product::<u64>());
        assert_eq!(t.n_bytes, bytes.len() as u64);
        assert_eq!(t.offset % 32, 0);
        assert_eq!(g.tensor_bytes(t), &bytes[..]);
        assert_eq!(g.tensor(name), Some(t));
        assert_eq!(g.tensor_data(name), Some(&bytes[..]));
    }
    assert!(g.tensor("nope").is_none());
}

#[test]
fn alignment_is_honoured() {
    for align in [1u32, 2, 8, 64, 256, 4096] {
        let g = Gguf::from_bytes(
            GgufWriter::new()
                .alignment(align)
                .tensor("a", &[3], GgmlType::F32, pattern(12, 1))
                .tensor("b", &[5], GgmlType::I8, pattern(5, 2))
                .tensor("c", &[32], GgmlType::Q8_0, pattern(34, 3))
                .to_bytes(),
        )
        .unwrap();
        assert_eq!(g.alignment, align as u64);
        assert_eq!(g.get("general.alignment"), Some(&MetaValue::U32(align)));
        assert_eq!(g.data_start % align as u64, 0);
        for t in &g.tensors {
            assert_eq!(t.offset % align as u64, 0);
        }
        assert_eq!(g.tensor_data("b").unwrap(), &pattern(5, 2)[..]);
        assert_eq!(g.tensor_data("c").unwrap(), &pattern(34, 3)[..]);
    }
}

#[test]
fn version_2_is_read_like_version_3() {
    let w = GgufWriter::new().kv("k", MetaValue::U32(7)).tensor(
        "x",
        &[2, 2],
        GgmlType::F16,
        pattern(8, 0),
    );
    let g2 = Gguf::from_bytes(w.version(2).to_bytes()).unwrap();
    assert_eq!(g2.version, 2);
    assert_eq!(g2.get_u32("k").unwrap(), Some(7));
    assert_eq!(g2.tensor_data("x").unwrap(), &pattern(8, 0)[..]);
}

#[test]
fn long_tensor_names_are_accepted() {
    let name = "x".repeat(200);
    let g = Gguf::from_bytes(
        GgufWriter::new()
            .tensor(name.clone(), &[1], GgmlType::F32, vec![1, 2, 3, 4])
            .to_bytes(),
    )
    .unwrap();
    assert_eq!(g.tensor_data(&name).unwrap(), &[1, 2, 3, 4]);
}

#[test]
fn backings_agree_open_from_bytes_from_static() {
    let bytes = GgufWriter::new()
        .kv(
            "general.architecture",
            MetaValue::String("qwen35moe".into()),
        )
        .tensor("w", &[4, 2], GgmlType::F32, pattern(32, 9))
        .to_bytes();
    let path =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf_roundtrip_backings.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let a = Gguf::open(&path).unwrap();
    assert!(a.is_mmapped());
    let b = Gguf::from_bytes(bytes.clone()).unwrap();
    assert!(!b.is_mmapped());
    let leaked: &'static [u8] = Box::leak(bytes.clone().into_boxed_slice());
    let c = Gguf::from_static(leaked).unwrap();
    for g in [&a, &b, &c] {
        assert_eq!(g.file_bytes(), &bytes[..]);
        assert_eq!(g.arch(), Some("qwen35moe"));
        assert_eq!(g.tensor_data("w").unwrap(), &pattern(32, 9)[..]);
    }
    // Zero copy: the static backing hands out slices of the static buffer.
    let t = c.tensor("w").unwrap();
    let s = c.tensor_bytes(t);
    let base = leaked.as_ptr() as usize;
    assert_eq!(
        s.as_ptr() as usize,
        base + (c.data_start + t.offset) as usize
    );
    std::fs::remove_file(&path).ok();
}

#[test]
fn open_reports_io_errors_with_the_path() {
    let err = Gguf::open(std::path::Path::new("/nonexistent/dir/model.gguf")).unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/dir/model.gguf"),
        "{err}"
    );
}

#[test]
fn open_empty_file_is_truncated_error() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf_roundtrip_empty.gguf");
    std::fs::write(&path, b"").unwrap();
    let err = Gguf::open(&path).unwrap_err();
    assert!(matches!(err, GgufError::Truncated { .. }), "{err:?}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn try_tensor_bytes_rejects_foreign_infos() {
    let g = Gguf::from_bytes(
        GgufWriter::new()
            .tensor("w", &[1], GgmlType::F32, vec![0; 4])
            .to_bytes(),
    )
    .unwrap();
    let mut t = g.tensor("w").unwrap().clone();
    t.offset = u64::MAX - 2;
    assert!(g.try_tensor_bytes(&t).is_none());
    t.offset = 1 << 20;
    assert!(g.try_tensor_bytes(&t).is_none());
}

fn getter_file() -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w = w.kv(k, v);
    }
    w = w
        .kv(
            "general.architecture",
            MetaValue::String("qwen35moe".into()),
        )
        .kv("i.neg", MetaValue::I32(-3))
        .kv("i.small_i64", MetaValue::I64(12))
        .kv(
            "a.u32",
            MetaValue::Array(vec![MetaValue::U32(1), MetaValue::U32(2)]),
        )
        .kv(
            "a.bool",
            MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
        )
        .kv(
            "a.strs",
            MetaValue::Array(vec![
                MetaValue::String("x".into()),
                MetaValue::String("yz".into()),
            ]),
        )
        .kv(
            "a.f32",
            MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-1.0)]),
        );
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

fn assert_mismatch(err: GgufError, key: &str, expected_part: &str, found_part: &str) {
    let msg = err.to_string();
    assert!(matches!(err, GgufError::TypeMismatch { .. }), "{err:?}");
    assert!(msg.contains(key), "{msg}");
    assert!(msg.contains(expected_part), "{msg}");
    assert!(msg.contains(found_part), "{msg}");
}

#[test]
fn typed_getters() {
    let g = getter_file();
    assert_eq!(g.arch(), Some("qwen35moe"));
    assert_eq!(g.get_str("t.str").unwrap(), Some("héllo wörld ✓ 🦀"));
    assert_eq!(g.get_str("missing").unwrap(), None);
    assert_mismatch(g.get_str("t.u32").unwrap_err(), "t.u32", "STRING", "UINT32");

    assert_eq!(g.get_u64_lenient("t.u8").unwrap(), Some(255));
    assert_eq!(g.get_u64_lenient("t.u16").unwrap(), Some(65535));
    assert_eq!(g.get_u64_lenient("t.u32").unwrap(), Some(u32::MAX as u64));
    assert_eq!(g.get_u64_lenient("t.u64").unwrap(), Some(u64::MAX));
    assert_eq!(g.get_u64_lenient("i.small_i64").unwrap(), Some(12));
    assert_eq!(g.get_u64_lenient("missing").unwrap(), None);
    assert_mismatch(
        g.get_u64_lenient("i.neg").unwrap_err(),
        "i.neg",
        "u64",
        "INT32 -3",
    );
    assert_mismatch(
        g.get_u64_lenient("t.f32").unwrap_err(),
        "t.f32",
        "integer",
        "FLOAT32",
    );
    assert_eq!(g.get_u32("t.u16").unwrap(), Some(65535));
    assert_mismatch(g.get_u32("t.u64").unwrap_err(), "t.u64", "u32", "UINT64");
    assert_eq!(g.get_i64_lenient("i.neg").unwrap(), Some(-3));
    assert_eq!(g.get_i64_lenient("t.i64").unwrap(), Some(i64::MIN));
    assert!(g.get_i64_lenient("t.u64").is_err());

    assert_eq!(g.get_f32_lenient("t.f32").unwrap(), Some(-1.5e-7));
    assert_eq!(
        g.get_f32_lenient("t.f64").unwrap(),
        Some(std::f32::consts::PI)
    );
    assert_mismatch(
        g.get_f32_lenient("t.u32").unwrap_err(),
        "t.u32",
        "FLOAT32 or FLOAT64",
        "UINT32",
    );

    assert_eq!(g.get_bool("t.bool_t").unwrap(), Some(true));
    assert_eq!(g.get_bool("t.bool_f").unwrap(), Some(false));
    assert_mismatch(g.get_bool("t.u8").unwrap_err(), "t.u8", "BOOL", "UINT8");

    assert_eq!(g.get_array("t.arr_empty").unwrap(), Some(&[][..]));
    assert_eq!(g.get_array("t.u8.arr").unwrap().unwrap().len(), 3);
    assert_mismatch(
        g.get_array("t.str").unwrap_err(),
        "t.str",
        "ARRAY",
        "STRING",
    );

    assert_eq!(
        g.get_int_array("t.i32.arr").unwrap(),
        Some(vec![i32::MIN as i64; 3])
    );
    assert_eq!(g.get_int_array("a.u32").unwrap(), Some(vec![1, 2]));
    assert_eq!(g.get_int_array("a.bool").unwrap(), Some(vec![1, 0]));
    assert_eq!(g.get_int_array("t.arr_empty").unwrap(), Some(vec![]));
    assert_eq!(g.get_int_array("missing").unwrap(), None);
    assert_mismatch(
        g.get_int_array("a.strs").unwrap_err(),
        "a.strs",
        "ARRAY of integers",
        "ARRAY of STRING",
    );
    assert_mismatch(
        g.get_int_array("t.u64.arr").unwrap_err(),
        "t.u64.arr",
        "i64",
        "ARRAY of UINT64",
    );
    assert_mismatch(
        g.get_int_array("t.u32").unwrap_err(),
        "t.u32",
        "ARRAY",
        "UINT32",
    );

    assert_eq!(g.get_str_array("a.strs").unwrap(), Some(vec!["x", "yz"]));
    assert_mismatch(
        g.get_str_array("a.u32").unwrap_err(),
        "a.u32",
        "ARRAY of STRING",
        "ARRAY of UINT32",
    );
    assert_mismatch(
        g.get_str_array("t.nested").unwrap_err(),
        "t.nested",
        "ARRAY of STRING",
        "ARRAY of ARRAY of INT32",
    );

    assert_eq!(g.get_f32_array("a.f32").unwrap(), Some(vec![0.5, -1.0]));
    assert!(g.get_f32_array("a.u32").is_err());
}

#[test]
fn writer_replaces_alignment_key_and_emits_no_data_without_tensors() {
    let bytes = GgufWriter::new()
        .kv("general.alignment", MetaValue::U32(8))
        .alignment(16)
        .to_bytes();
    let g = Gguf::from_bytes(bytes.clone()).unwrap();
    assert_eq!(g.alignment, 16);
    assert_eq!(g.metadata.len(), 1);
    // No tensors: the file ends right after the metadata.
    let kv_len = 8 + "general.alignment".len() + 4 + 4;
    assert_eq!(bytes.len(), 24 + kv_len);
}

#[test]
#[should_panic(expected = "needs 8 bytes")]
fn writer_rejects_wrong_byte_count() {
    let _ = GgufWriter::new().tensor("w", &[2], GgmlType::F32, vec![0; 7]);
}

#[test]
#[should_panic(expected = "not a valid shape")]
fn writer_rejects_bad_row_length() {
    let _ = GgufWriter::new().tensor("w", &[33], GgmlType::Q8_0, vec![0; 34]);
}
