//! Tokenizer behaviour on small hand-made vocabularies, and typed errors.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::tokenizer::{DecodeOptions, PreTokenizer, Tokenizer, TokenizerData, TokenizerError};
use pn_engine::{Gguf, MetaValue};

fn tok(tokens: &[&str], types: &[i32], merges: &[&str]) -> Tokenizer {
    Tokenizer::new(TokenizerData {
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: types.to_vec(),
        merges: merges.iter().map(|s| s.to_string()).collect(),
        pre: "qwen35".into(),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn merge_order_rank_then_leftmost() {
    let t = tok(
        &["a", "b", "c", "ab", "bc", "abc"],
        &[],
        &["b c", "a b", "ab c"],
    );
    // (b,c) has the lower rank: a + bc, and there is no rule for (a, bc).
    assert_eq!(t.encode("abc", false), [0, 4]);
    let t = tok(&["a", "aa"], &[], &["a a"]);
    assert_eq!(t.encode("aaa", false), [1, 0]);
    assert_eq!(t.encode("aaaaa", false), [1, 1, 0]);
}

#[test]
fn unknown_symbols_fall_back_per_byte() {
    // "a b" merges to "ab", which is not a token: back to its bytes.
    let t = tok(&["a", "b"], &[], &["a b"]);
    assert_eq!(t.encode("ab", false), [0, 1]);
    // Bytes without a token are dropped, as llama.cpp does.
    assert_eq!(t.encode("aéb", false), [0, 1]);
}

#[test]
fn special_and_user_defined_tokens() {
    // 3 = control, 4 = user-defined.
    let t = tok(
        &["a", "<", ">", "<ctl>", "<ud>", "<ctl><ud>"],
        &[1, 1, 1, 3, 4, 4],
        &[],
    );
    assert_eq!(t.encode("a<ctl>a", true), [0, 3, 0]);
    assert_eq!(
        t.encode("a<ud>a", false),
        [0, 4, 0],
        "user-defined tokens are always split out"
    );
    assert!(!t.encode("a<ctl>a", false).contains(&3));
    // Longest first.
    assert_eq!(t.encode("<ctl><ud><ctl>", true), [5, 3]);
    assert_eq!(t.decode(&[0, 3, 4]), "a<ud>");
    assert_eq!(
        t.decode_with(&[0, 3, 4], DecodeOptions { special: true }),
        "a<ctl><ud>"
    );
    assert_eq!(t.token_type(3), Some(3));
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn pre_tokenizer_names() {
    assert_eq!(PreTokenizer::from_name("qwen35"), PreTokenizer::Qwen35);
    assert_eq!(PreTokenizer::from_name("qwen2"), PreTokenizer::Qwen2);
    assert_eq!(PreTokenizer::from_name("llama-bpe"), PreTokenizer::Llama3);
    assert_eq!(PreTokenizer::from_name("something-new"), PreTokenizer::Gpt2);
}

#[test]
fn construction_errors() {
    let err = |d: TokenizerData| Tokenizer::new(d).unwrap_err();
    assert!(matches!(
        err(TokenizerData::default()),
        TokenizerError::EmptyVocab
    ));
    let d = TokenizerData {
        tokens: vec!["a".into(), "aa".into()],
        merges: vec!["aa".into()],
        ..Default::default()
    };
    let e = err(d);
    assert!(
        matches!(e, TokenizerError::MalformedMerge { index: 0, .. }),
        "{e}"
    );
    let d = TokenizerData {
        tokens: vec!["a".into()],
        token_types: vec![1, 1],
        ..Default::default()
    };
    assert!(matches!(
        err(d),
        TokenizerError::TypeCountMismatch {
            tokens: 1,
            types: 2
        }
    ));
}

fn strs(v: &[&str]) -> MetaValue {
    MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect())
}

fn gguf(kvs: Vec<(&str, MetaValue)>) -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w = w.kv(k, v);
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn gguf_errors() {
    let model = |m: &str| ("tokenizer.ggml.model", MetaValue::String(m.into()));
    let e = Tokenizer::from_gguf(&gguf(vec![
        model("t5"),
        ("tokenizer.ggml.tokens", strs(&["a"])),
    ]))
    .unwrap_err();
    assert!(matches!(&e, TokenizerError::UnsupportedModel { found } if found == "t5"));
    let msg = e.to_string();
    assert!(msg.contains("t5") && msg.contains("gpt2") && msg.contains("llama"), "{msg}");
    let e = Tokenizer::from_gguf(&gguf(vec![])).unwrap_err();
    assert!(matches!(
        e,
        TokenizerError::MissingKey("tokenizer.ggml.model")
    ));
    let e = Tokenizer::from_gguf(&gguf(vec![
        model("gpt2"),
        ("tokenizer.ggml.tokens", strs(&["a"])),
    ]))
    .unwrap_err();
    assert!(
        matches!(e, TokenizerError::MissingKey("tokenizer.ggml.merges")),
        "{e}"
    );
    let e = Tokenizer::from_gguf(&gguf(vec![
        model("gpt2"),
        ("tokenizer.ggml.tokens", MetaValue::U32(3)),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            e,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.tokens",
                ..
            }
        ),
        "{e}"
    );
    // A minimal valid file.
    let t = Tokenizer::from_gguf(&gguf(vec![
        model("gpt2"),
        (
            "tokenizer.ggml.tokens",
            strs(&["h", "i", "hi", "<|im_end|>"]),
        ),
        ("tokenizer.ggml.merges", strs(&["h i"])),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(3)),
    ]))
    .unwrap();
    assert_eq!(t.encode("hi<|im_end|>", true), [2, 3]);
    assert!(t.is_eog(3) && !t.add_bos() && t.bos().is_none());
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Gpt2);
}

/// Integer metadata follows one rule (`MetaValue::as_i64`): a token type that does not fit
/// an i32 is an error, never truncated; a special-token id outside u32 (-1, or a U64 beyond
/// i64) means "no such token".
#[test]
fn integer_metadata_ranges() {
    let base = || {
        vec![
            ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["h", "i", "hi"])),
            ("tokenizer.ggml.merges", strs(&["h i"])),
        ]
    };
    let mut kv = base();
    kv.push((
        "tokenizer.ggml.token_type",
        MetaValue::Array(vec![MetaValue::I64(1), MetaValue::I64(1 << 40), MetaValue::I64(1)]),
    ));
    let e = Tokenizer::from_gguf(&gguf(kv)).unwrap_err();
    assert!(matches!(e, TokenizerError::WrongType { key: "tokenizer.ggml.token_type", .. }), "{e}");
    let mut kv = base();
    kv.push(("tokenizer.ggml.eos_token_id", MetaValue::I32(-1)));
    kv.push(("tokenizer.ggml.bos_token_id", MetaValue::U64(u64::MAX)));
    kv.push(("tokenizer.ggml.eot_token_id", MetaValue::U64(2)));
    let t = Tokenizer::from_gguf(&gguf(kv)).unwrap();
    assert_eq!((t.eos(), t.bos(), t.eot()), (None, None, Some(2)));
    let mut kv = base();
    kv.push(("tokenizer.ggml.eos_token_id", MetaValue::String("2".into())));
    let e = Tokenizer::from_gguf(&gguf(kv)).unwrap_err();
    assert!(matches!(e, TokenizerError::WrongType { key: "tokenizer.ggml.eos_token_id", .. }), "{e}");
}
