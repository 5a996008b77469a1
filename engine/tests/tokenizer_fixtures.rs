//! Tokenizer exactness against llama.cpp on the repository fixtures.

use pn_engine::tokenizer::{DecodeOptions, StreamDecoder, Tokenizer};
use pn_engine::Gguf;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn load(rel: &str) -> Tokenizer {
    let g = Gguf::open(&root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn qwen35() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("tests/fixtures/qwen35-vocab.gguf"))
}

fn json(rel: &str) -> serde_json::Value {
    let s = std::fs::read_to_string(root().join(rel)).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn cases() -> Vec<(String, Vec<u32>)> {
    let j = json("tests/fixtures/tokenizer.json");
    assert_eq!(j["model"], "qwen35-vocab.gguf");
    j["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), ids_of(&c["ids"])))
        .collect()
}

#[test]
fn metadata() {
    let t = qwen35();
    assert_eq!(t.n_vocab(), 248047);
    assert_eq!(t.bos(), Some(248044));
    assert_eq!(t.eos(), Some(248046));
    assert!(!t.add_bos());
    assert_eq!(t.token_id("<|im_start|>"), Some(248045));
    assert!(t.is_eog(248046) && t.is_eog(248044) && !t.is_eog(248045) && !t.is_eog(9419));
    assert!(t.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn every_fixture_case_matches_llama_cpp() {
    let t = qwen35();
    let cases = cases();
    assert_eq!(cases.len(), 41);
    let mut bad = Vec::new();
    for (text, ids) in &cases {
        let got = t.encode(text, true);
        if &got != ids {
            bad.push(format!("{text:?}\n  want {ids:?}\n  got  {got:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn fixture_cases_are_the_source_lines() {
    let src = std::fs::read_to_string(root().join("tests/fixtures/tokenizer-cases.txt")).unwrap();
    let lines: Vec<&str> = src.lines().collect();
    for (text, _) in cases() {
        assert!(text.split('\n').all(|l| lines.contains(&l)), "{text:?}");
    }
}

#[test]
fn round_trip_all_cases() {
    let t = qwen35();
    let special = DecodeOptions { special: true };
    for (text, ids) in cases() {
        assert_eq!(t.decode_with(&ids, special), text);
        assert_eq!(t.decode_with(&t.encode(&text, true), special), text);
        // Without special parsing the control-token spellings are plain text.
        assert_eq!(t.decode(&t.encode(&text, false)), text);
    }
}

#[test]
fn special_parsing_on_and_off() {
    let t = qwen35();
    assert_eq!(t.encode("<|im_start|>user", true), [248045, 846]);
    let plain = t.encode("<|im_start|>user", false);
    assert!(!plain.contains(&248045) && plain.len() > 2, "{plain:?}");
    assert_eq!(t.decode(&plain), "<|im_start|>user");
    // Control tokens render empty unless asked for.
    let ids = t.encode("Hi<|im_end|>", true);
    assert_eq!(ids, [12675, 248046]);
    assert_eq!(t.decode(&ids), "Hi");
    assert_eq!(
        t.decode_with(&ids, DecodeOptions { special: true }),
        "Hi<|im_end|>"
    );
    assert!(t.token_bytes(248046).is_empty());
    // Adjacent and repeated specials.
    assert_eq!(
        t.encode("<|im_end|><|im_end|>x<|endoftext|>", true),
        [248046, 248046, 87, 248044]
    );
    assert_eq!(t.encode("", true), Vec::<u32>::new());
}

#[test]
fn tiny_vocab_prompt() {
    let t = load("tests/fixtures/tiny-f32.gguf");
    let j = json("tests/fixtures/tiny-f32.logits.json");
    let want = ids_of(&j["tokens"]);
    assert_eq!(want.len(), 56);
    let text = "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; its crew returned safely.";
    assert_eq!(t.encode(text, true), want);
    assert_eq!(t.decode(&want), text);
}

#[test]
fn default_model_code_prompt() {
    let t = load("models/default/pn-default-code-q4_k_m.gguf");
    let j = json("tests/fixtures/pn-default-code-q4_k_m.logits.json");
    let ids = ids_of(&j["tokens"]);
    assert_eq!(ids.len(), 120);
    let text = t.decode(&ids);
    assert!(text.contains("def") || text.contains("import"), "{text}");
    assert_eq!(t.encode(&text, true), ids, "{text}");
}

#[test]
fn streaming_split_characters() {
    let t = qwen35();
    for text in [
        "🙂 emoji 👍🏽 family: 👨‍👩‍👧‍👦 flags: 🇫🇷🇯🇵",
        "你好，世界！",
        "こんにちは世界、カタカナとひらがな。",
        "Ünïcödé",
    ] {
        let ids = t.encode(text, true);
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        let mut held = 0;
        for &id in &ids {
            let piece = d.push(t, id);
            assert!(!piece.contains('\u{FFFD}'), "{text:?}: {piece:?}");
            held += piece.is_empty() as usize;
            out += &piece;
        }
        out += &d.flush();
        assert_eq!(out, text);
        if text.starts_with('🙂') {
            assert!(held > 0, "byte tokens should be held back");
        }
    }
    // The emoji case really splits characters over byte tokens.
    assert_eq!(t.token_bytes(235).len(), 1);
}

#[test]
fn streaming_invalid_and_truncated() {
    let t = qwen35();
    let mut d = StreamDecoder::new();
    // 0xF0 (lead byte of a 4-byte character, 'ð' in the byte-level alphabet) then 'A':
    // invalid, becomes U+FFFD, never panics.
    let lead = t.token_id("ð").unwrap();
    assert_eq!(t.token_bytes(lead), [0xF0]);
    let mut s = d.push(t, lead);
    assert_eq!(s, "");
    s += &d.push(t, t.token_id("A").unwrap());
    s += &d.flush();
    assert_eq!(s, "\u{FFFD}A");
    // A truncated character at the end is flushed as U+FFFD.
    let mut d = StreamDecoder::new();
    assert_eq!(d.push(t, lead), "");
    assert!(d.has_pending());
    assert_eq!(d.flush(), "\u{FFFD}");
    // Out of range ids never panic.
    assert_eq!(d.push(t, u32::MAX), "\u{FFFD}");
    assert_eq!(t.decode(&[9419, 999_999_999]), "Hello\u{FFFD}");
}

#[test]
fn long_pathological_inputs_round_trip() {
    let t = qwen35();
    let inputs = [
        "a".repeat(100_000),
        " ".repeat(50_000) + "x",
        "=".repeat(60_000) + "\n\n",
        "é\u{301}".repeat(20_000),
        "1".repeat(30_000),
        "<|im_end|>".repeat(5_000) + "<|im_",
    ];
    for s in &inputs {
        let ids = t.encode(s, true);
        assert_eq!(t.decode_with(&ids, DecodeOptions { special: true }), *s);
    }
}
