//! Every fixture in tests/fixtures/*.gguf opens, every tensor lies inside the file, and a
//! few known values match.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::{Gguf, MetaValue};
use pn_ops::GgmlType;
use std::path::{Path, PathBuf};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn fixture(name: &str) -> Gguf {
    Gguf::open(&fixtures_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn all_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    v
}

fn check_invariants(name: &str, g: &Gguf) {
    let len = g.file_bytes().len() as u64;
    assert!(g.version == 2 || g.version == 3, "{name}");
    assert!(g.alignment.is_power_of_two(), "{name}");
    assert_eq!(g.data_start % g.alignment, 0, "{name}");
    let mut ranges = Vec::new();
    for t in &g.tensors {
        assert_eq!(t.offset % g.alignment, 0, "{name}: {}", t.name);
        let start = g.data_start + t.offset;
        assert!(start + t.n_bytes <= len, "{name}: {} past EOF", t.name);
        let expect = (t.ne[0] / t.ty.block_size() as u64)
            * t.ty.type_size() as u64
            * t.ne[1]
            * t.ne[2]
            * t.ne[3];
        assert_eq!(t.n_bytes, expect, "{name}: {}", t.name);
        assert_eq!(g.tensor_bytes(t).len() as u64, t.n_bytes);
        assert_eq!(g.tensor(&t.name), Some(t));
        ranges.push((start, start + t.n_bytes));
    }
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "{name}: overlapping tensors");
    }
    for (k, v) in &g.metadata {
        assert_eq!(g.get(k), Some(v), "{name}: {k}");
    }
}

#[test]
fn every_fixture_opens_and_is_consistent() {
    let files = all_fixtures();
    assert!(
        files.len() >= 10,
        "expected the fixture corpus, found {files:?}"
    );
    for p in files {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let g = Gguf::open(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(g.is_mmapped());
        check_invariants(&name, &g);
        // the qwen35moe set, plus the dense qwen35 and qwen3moe architectures
        let arch = g.arch().unwrap_or_else(|| panic!("{name}: no architecture"));
        let expected = if name.starts_with("qwen3moe-") { "qwen3moe" } else if name.starts_with("qwen35-") && name != "qwen35-vocab.gguf" { "qwen35" } else { "qwen35moe" };
        // the 2-layer llama / qwen3 / qwen2 fixtures of tests/tests/archs.rs
        let other = ["llama", "qwen3", "qwen2"].into_iter().find(|a| name.starts_with(&format!("{a}-")));
        assert_eq!(arch, other.unwrap_or(expected), "{name}");
        if other.is_some() {
            assert_eq!(g.get_u64_lenient(&format!("{arch}.block_count")).unwrap(), Some(2), "{name}");
        } else if name != "qwen35-vocab.gguf" {
            assert!(g.tensors.len() >= 51, "{name}: {} tensors", g.tensors.len());
            // 4 main layers (+1 MTP layer in tiny-mtp-f16).
            let n_layer = g.get_u64_lenient(&format!("{arch}.block_count")).unwrap().unwrap();
            assert!(
                n_layer == 4 || (name.contains("mtp") && n_layer == 5),
                "{name}: {n_layer}"
            );
            assert!(g.tensor("token_embd.weight").is_some(), "{name}");
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
        let types = g
            .get_int_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap();
        assert_eq!(tokens.len(), types.len(), "{name}");
    }
}

#[test]
fn tiny_f32_known_values() {
    let g = fixture("tiny-f32.gguf");
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.tensors.len(), 76);
    assert_eq!(g.arch(), Some("qwen35moe"));
    assert_eq!(
        g.get_str("general.architecture").unwrap(),
        Some("qwen35moe")
    );
    assert_eq!(g.get("qwen35moe.block_count"), Some(&MetaValue::U32(4)));
    assert_eq!(g.get_u32("qwen35moe.embedding_length").unwrap(), Some(128));
    assert_eq!(g.get_u32("qwen35moe.expert_count").unwrap(), Some(8));
    assert_eq!(
        g.get_f32_lenient("qwen35moe.attention.layer_norm_rms_epsilon")
            .unwrap(),
        Some(1e-6)
    );
    assert_eq!(
        g.get_int_array("qwen35moe.rope.dimension_sections")
            .unwrap(),
        Some(vec![3, 3, 2, 0])
    );
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));

    let t = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ty, GgmlType::F32);
    assert_eq!(t.n_dims, 2);
    assert_eq!(t.ne, [128, 1027, 1, 1]);
    assert_eq!(t.n_bytes, 128 * 1027 * 4);
    let data = g.tensor_bytes(t);
    let floats: Vec<f32> = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(floats.iter().all(|x| x.is_finite()));
    assert!(floats.iter().any(|&x| x != 0.0));

    let norm = g.tensor("output_norm.weight").unwrap();
    assert_eq!(
        (norm.ty, norm.ne, norm.n_dims),
        (GgmlType::F32, [128, 1, 1, 1], 1)
    );
}

#[test]
fn quantized_fixtures_have_expected_types() {
    let cases = [
        ("tiny-f16.gguf", "token_embd.weight", GgmlType::F16),
        ("tiny-bf16.gguf", "token_embd.weight", GgmlType::BF16),
        ("tiny-q8_0.gguf", "blk.0.attn_norm.weight", GgmlType::F32),
        ("ktiny-q4_k_m.gguf", "token_embd.weight", GgmlType::Q4K),
        ("ktiny-q6_k.gguf", "output.weight", GgmlType::Q6K),
        ("ktiny-iq4_xs.gguf", "token_embd.weight", GgmlType::IQ4XS),
        ("ktiny-iq3_s.gguf", "token_embd.weight", GgmlType::IQ3S),
    ];
    for (file, tensor, ty) in cases {
        let g = fixture(file);
        assert_eq!(g.tensor(tensor).unwrap().ty, ty, "{file}: {tensor}");
    }
}

#[test]
fn vocab_fixture_has_no_tensors() {
    let g = fixture("qwen35-vocab.gguf");
    assert!(g.tensors.is_empty());
    let merges = g.get_str_array("tokenizer.ggml.merges").unwrap().unwrap();
    assert!(!merges.is_empty());
}

#[test]
fn from_bytes_matches_open_and_writer_reproduces_the_file() {
    let path = fixtures_dir().join("tiny-q4_0.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let a = Gguf::open(&path).unwrap();
    let b = Gguf::from_bytes(bytes.clone()).unwrap();
    assert_eq!(a.metadata, b.metadata);
    assert_eq!(a.tensors, b.tensors);
    assert_eq!(a.data_start, b.data_start);

    // Rebuild the file with GgufWriter from what the reader saw: the parsed view must be
    // identical (and, for a llama.cpp-style layout, so are the bytes).
    let mut w = GgufWriter::new().version(a.version);
    for (k, v) in &a.metadata {
        w = w.kv(k.clone(), v.clone());
    }
    for t in &a.tensors {
        w = w.tensor(t.name.clone(), t.shape(), t.ty, a.tensor_bytes(t).to_vec());
    }
    let rebuilt = w.to_bytes();
    let c = Gguf::from_bytes(rebuilt.clone()).unwrap();
    assert_eq!(c.metadata, a.metadata);
    assert_eq!(c.tensors, a.tensors);
    assert_eq!(c.data_start, a.data_start);
    assert_eq!(
        &rebuilt[..a.data_start as usize],
        &bytes[..a.data_start as usize]
    );
}
