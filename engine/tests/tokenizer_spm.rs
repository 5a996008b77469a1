//! The SentencePiece (`llama`) tokenizer read from GGUF metadata: score order, byte
//! fallback, the leading-space rule on encode and decode, llama.cpp's defaults.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::tokenizer::{Tokenizer, VocabKind};
use pn_engine::{Gguf, MetaValue};

fn strs(v: &[&str]) -> MetaValue {
    MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect())
}

/// `<unk> <s> </s>`, the 256 byte tokens, then `extra` with their scores.
fn spm(extra: &[(&str, f32)], more: Vec<(&str, MetaValue)>) -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let mut scores = vec![0.0f32; tokens.len()];
    for (t, s) in extra {
        tokens.push(t.to_string());
        types.push(1);
        scores.push(*s);
    }
    let toks: Vec<&str> = tokens.iter().map(|s| s.as_str()).collect();
    let mut w = GgufWriter::new()
        .kv("tokenizer.ggml.model", MetaValue::String("llama".into()))
        .kv("tokenizer.ggml.tokens", strs(&toks))
        .kv("tokenizer.ggml.scores", MetaValue::Array(scores.into_iter().map(MetaValue::F32).collect()))
        .kv("tokenizer.ggml.token_type", MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()));
    for (k, v) in more {
        w = w.kv(k, v);
    }
    Tokenizer::from_gguf(&Gguf::from_bytes(w.to_bytes()).unwrap()).unwrap()
}

const B: u32 = 259; // first extra token

#[test]
fn merges_by_score_with_a_leading_space() {
    // "▁ab": (▁a) scores higher than (ab), so ▁a + b; with ab preferred, ▁ + ab
    let t = spm(&[("▁", -5.0), ("a", -5.0), ("b", -5.0), ("▁a", -1.0), ("ab", -2.0)], vec![]);
    assert_eq!(t.kind(), VocabKind::Spm);
    assert_eq!(t.encode("ab", false), [B + 3, B + 2]);
    let t = spm(&[("▁", -5.0), ("a", -5.0), ("b", -5.0), ("▁a", -3.0), ("ab", -2.0)], vec![]);
    assert_eq!(t.encode("ab", false), [B, B + 4]);
    // spaces are ▁; nothing at all for an empty text
    assert_eq!(t.encode("a a", false), [B + 3, B + 3]);
    assert!(t.encode("", false).is_empty());
    // defaults: BOS 1 and EOS 2, add_bos
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(1), Some(2), true));
}

#[test]
fn byte_fallback_and_decode() {
    let t = spm(&[("▁", -1.0), ("a", -1.0)], vec![]);
    // "é" is not a token: its two UTF-8 bytes
    assert_eq!(t.encode("aé", false), [B, B + 1, 3 + 0xC3, 3 + 0xA9]);
    let ids = t.encode("a a", false);
    // llama_detokenize drops the leading space the encoder added
    assert_eq!(t.decode(&ids), "a a");
    assert_eq!(t.decode(&t.encode("aé", false)), "aé");
    // a control token in the text (parse_special) is followed by a space prefix
    assert_eq!(t.encode("<s>a", true), [1, B, B + 1]);
    assert_eq!(t.encode("<s>a", false)[..2], [B, 3 + b'<' as u32]);
}

#[test]
fn add_space_prefix_and_add_bos_from_the_file() {
    let t = spm(
        &[("▁", -1.0), ("a", -1.0)],
        vec![
            ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
            ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        ],
    );
    assert_eq!(t.encode("a", false), [B + 1]);
    assert!(!t.add_bos());
}
