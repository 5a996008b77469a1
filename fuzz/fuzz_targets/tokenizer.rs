//! The tokenizer of tests/fixtures/tiny-f32.gguf on arbitrary input.
//!
//! The first byte picks a mode; the rest is either text (lossy UTF-8) to encode (with and
//! without special-token parsing) and decode, or little-endian u32 token ids (any value,
//! out-of-range ones included) for `decode` and `StreamDecoder`.
//! Checked: no panic; byte-level BPE round-trips plain text exactly; the stream decoder's
//! output equals `decode` of the same ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pn_engine::tokenizer::{StreamDecoder, Tokenizer};
use std::sync::OnceLock;

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-f32.gguf");
        let g = pn_engine::Gguf::open(std::path::Path::new(path)).expect("tiny-f32.gguf");
        Tokenizer::from_gguf(&g).expect("tiny-f32 tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let tok = tok();
    if mode & 1 == 0 {
        let text = String::from_utf8_lossy(rest);
        let plain = tok.encode(&text, false);
        assert_eq!(tok.decode(&plain), text, "decode(encode(text)) != text");
        let special = tok.encode(&text, true);
        let _ = tok.decode(&special);
        for &id in &special {
            assert!((id as usize) < tok.n_vocab(), "encode produced id {id} ≥ n_vocab {}", tok.n_vocab());
        }
    } else {
        // ids: mostly in range (mode bit 1 clear), or raw u32s
        let n = tok.n_vocab() as u32 + 8;
        let ids: Vec<u32> = rest
            .chunks(4)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                let v = u32::from_le_bytes(b);
                if mode & 2 == 0 { v % n } else { v }
            })
            .collect();
        let whole = tok.decode(&ids);
        let mut dec = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            streamed += &dec.push(tok, id);
            let _ = tok.is_eog(id);
            let _ = tok.token_bytes(id);
        }
        streamed += &dec.flush();
        assert_eq!(streamed, whole, "StreamDecoder output != decode(ids)");
    }
});
