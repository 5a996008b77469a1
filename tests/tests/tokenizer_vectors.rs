//! llama.cpp's tokenizer test vectors (`tests/test-tokenizer-0`: `models/ggml-vocab-*.gguf`
//! with `.inp` / `.out`, llama.cpp as vendored by llama-cpp-python 0.3.36), every case
//! of every BPE and SentencePiece vocabulary exact, `add_special = false`.
//!
//! The full vocabularies are 75 MB, so `tests/fixtures/vocab/NAME.json` keeps, per
//! vocabulary, only what the cases can reach: every token and merge whose text occurs
//! in a case (a merge only ever joins substrings of its piece, so the answer for these
//! texts is the same), the `<0xXX>` byte tokens, and the cases with llama.cpp's ids.
//! Other ids hold placeholders no text can produce. Regenerate (and check the full
//! vocabularies) with the ignored test below; see `tests/fixtures/README.md`.
//! Not covered: `bert-bge` (WordPiece), a tokenizer model pn does not support.

use pn_engine::tokenizer::{token_type, Tokenizer, TokenizerData, VocabKind};
use pn_engine::{Gguf, MetaValue};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The vocabularies of the set with a supported tokenizer model.
const VOCABS: &[&str] = &[
    "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2",
    "qwen35", "refact", "starcoder",
];

#[derive(Serialize, Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
struct Subset {
    /// `tokenizer.ggml.model`
    model: String,
    pre: String,
    add_space_prefix: Option<bool>,
    n_vocab: usize,
    /// (id, text, type, score) of the kept tokens
    tokens: Vec<(u32, String, i32, f32)>,
    merges: Vec<String>,
    cases: Vec<Case>,
}

fn kind_of(model: &str) -> VocabKind {
    match model {
        "llama" => VocabKind::Spm,
        "gemma4" => VocabKind::BpeRaw,
        _ => VocabKind::Bpe,
    }
}

impl Subset {
    fn tokenizer(&self) -> Tokenizer {
        let mut tokens: Vec<String> = (0..self.n_vocab).map(|i| format!("\u{FFFF}{i}")).collect();
        let mut types = vec![token_type::UNUSED; self.n_vocab];
        let mut scores = vec![0.0f32; self.n_vocab];
        for (id, text, ty, score) in &self.tokens {
            let i = *id as usize;
            (tokens[i], types[i], scores[i]) = (text.clone(), *ty, *score);
        }
        Tokenizer::new(TokenizerData {
            kind: kind_of(&self.model),
            tokens,
            scores,
            token_types: types,
            merges: self.merges.clone(),
            add_space_prefix: self.add_space_prefix,
            pre: self.pre.clone(),
            ..Default::default()
        })
        .expect("fixture vocabulary builds")
    }
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vocab")
}

/// (passed, failures as "vocab case#: text") over the cases.
fn run_cases(name: &str, t: &Tokenizer, cases: &[Case]) -> (usize, Vec<String>) {
    let mut bad = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let got = t.encode(&c.text, false);
        if got != c.ids {
            bad.push(format!("{name} #{i} {:?}: expected {:?}, found {got:?}", c.text, c.ids));
        }
    }
    (cases.len() - bad.len(), bad)
}

#[test]
fn llama_cpp_tokenizer_vectors_exact() {
    let (mut pass, mut total, mut bad) = (0, 0, Vec::new());
    for name in VOCABS {
        let path = fixture_dir().join(format!("{name}.json"));
        let raw = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let s: Subset = serde_json::from_str(&raw).expect("fixture parses");
        assert!(!s.cases.is_empty(), "{name}: no cases");
        let (p, b) = run_cases(name, &s.tokenizer(), &s.cases);
        pass += p;
        total += s.cases.len();
        bad.extend(b);
    }
    assert!(bad.is_empty(), "{pass}/{total} exact; failures:\n{}", bad.join("\n"));
    assert_eq!(total, 13 * 46 + 50);
}

// ---- regeneration from llama.cpp's files ---------------------------------------------

fn strs(g: &Gguf, key: &str) -> Vec<String> {
    match g.get(key) {
        Some(MetaValue::Array(a)) => a.iter().map(|v| if let MetaValue::String(s) = v { s.clone() } else { String::new() }).collect(),
        _ => Vec::new(),
    }
}

fn nums(g: &Gguf, key: &str) -> Vec<f64> {
    let num = |v: &MetaValue| match *v {
        MetaValue::F32(x) => x as f64,
        MetaValue::I32(x) => x as f64,
        MetaValue::U32(x) => x as f64,
        _ => 0.0,
    };
    match g.get(key) {
        Some(MetaValue::Array(a)) => a.iter().map(num).collect(),
        _ => Vec::new(),
    }
}

/// llama.cpp's `.inp` (cases split by the separator, as test-tokenizer-0.cpp does) and `.out`.
fn read_cases(dir: &Path, name: &str) -> Vec<Case> {
    let f = |ext: &str| std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.{ext}"))).expect("vector file");
    let (inp, out) = (f("inp"), f("out"));
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(p) => {
                texts.push(rest[..p].to_string());
                rest = &rest[p + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                break;
            }
        }
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(texts.len(), lines.len(), "{name}: cases vs expected lines");
    let ids = |l: &str| l.split_whitespace().map(|x| x.parse().expect("id")).collect();
    texts.into_iter().zip(lines).map(|(text, l)| Case { text, ids: ids(l) }).collect()
}

/// The bytes a token's text stands for (byte-level BPE map, or SentencePiece `▁`).
fn token_bytes(kind: VocabKind, text: &str) -> Vec<u8> {
    match kind {
        VocabKind::Spm | VocabKind::BpeRaw => text.replace('\u{2581}', " ").into_bytes(),
        VocabKind::Bpe => {
            let c2b = pn_engine::tokenizer::bpe::char_to_byte_table();
            let mut v = Vec::new();
            for c in text.chars() {
                match c2b.get(c as usize) {
                    Some(&b) if b >= 0 => v.push(b as u8),
                    _ => v.extend_from_slice(c.to_string().as_bytes()),
                }
            }
            v
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Builds the subset of one full vocabulary and checks that it tokenizes every case
/// exactly as the full one does.
fn subset_of(dir: &Path, name: &str) -> (Subset, Tokenizer) {
    let g = Gguf::open(&dir.join(format!("ggml-vocab-{name}.gguf"))).expect("vocab gguf");
    let full = Tokenizer::from_gguf(&g).expect("full tokenizer");
    let model = match g.get("tokenizer.ggml.model") {
        Some(MetaValue::String(s)) => s.clone(),
        _ => panic!("{name}: no tokenizer.ggml.model"),
    };
    let kind = kind_of(&model);
    let tokens = strs(&g, "tokenizer.ggml.tokens");
    let types = nums(&g, "tokenizer.ggml.token_type");
    let scores = nums(&g, "tokenizer.ggml.scores");
    let cases = read_cases(dir, name);
    // SentencePiece merges inside fragments that start with a space
    let hay: Vec<Vec<u8>> = cases.iter().map(|c| format!(" {}", c.text).into_bytes()).collect();
    let occurs = |b: &[u8]| hay.iter().any(|h| contains(h, b));
    let expected: std::collections::HashSet<u32> = cases.iter().flat_map(|c| c.ids.iter().copied()).collect();
    let mut kept = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.get(i).map_or(token_type::NORMAL, |&x| x as i32);
        let keep = expected.contains(&(i as u32))
            || occurs(&token_bytes(kind, t))
            || occurs(t.as_bytes())
            || (kind != VocabKind::Bpe && ty == token_type::BYTE);
        if keep {
            kept.push((i as u32, t.clone(), ty, scores.get(i).copied().unwrap_or(0.0) as f32));
        }
    }
    let merges = strs(&g, "tokenizer.ggml.merges")
        .into_iter()
        .filter(|m| occurs(&token_bytes(kind, &m.replacen(' ', "", 1))))
        .collect();
    let add_space_prefix = match g.get("tokenizer.ggml.add_space_prefix") {
        Some(MetaValue::Bool(b)) => Some(*b),
        _ => None,
    };
    let pre = match g.get("tokenizer.ggml.pre") {
        Some(MetaValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let s = Subset { model, pre, add_space_prefix, n_vocab: tokens.len(), tokens: kept, merges, cases };
    let small = s.tokenizer();
    for c in &s.cases {
        assert_eq!(small.encode(&c.text, false), full.encode(&c.text, false), "{name}: the subset differs on {:?}", c.text);
    }
    (s, full)
}

/// `PN_VOCAB_DIR=…/vendor/llama.cpp/models cargo test -p pn-tests --test tokenizer_vectors
/// -- --ignored`: scores the full vocabularies and rewrites `tests/fixtures/vocab/`.
#[test]
#[ignore = "needs llama.cpp's vocabulary files (PN_VOCAB_DIR)"]
fn regenerate_from_llama_cpp() {
    let dir = PathBuf::from(std::env::var("PN_VOCAB_DIR").expect("PN_VOCAB_DIR: llama.cpp's models/ folder"));
    std::fs::create_dir_all(fixture_dir()).expect("fixture dir");
    let (mut pass, mut total) = (0, 0);
    for name in VOCABS {
        let (s, full) = subset_of(&dir, name);
        let (p, bad) = run_cases(name, &full, &s.cases);
        eprintln!("{name}: {p}/{} exact with the full vocabulary", s.cases.len());
        for b in &bad {
            eprintln!("  {b}");
        }
        (pass, total) = (pass + p, total + s.cases.len());
        let json = serde_json::to_string(&s).expect("json");
        std::fs::write(fixture_dir().join(format!("{name}.json")), json).expect("write fixture");
    }
    eprintln!("total: {pass}/{total}");
}
