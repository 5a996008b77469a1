//! Byte-level BPE tokenizer built from GGUF metadata (spec §9.2), exactly llama.cpp's.
//!
//! CONTRACT (used by the CLI; keep these signatures):
//! - `Tokenizer::from_gguf(&Gguf) -> Result<Tokenizer, TokenizerError>`
//! - `encode(text, parse_special) -> Vec<u32>` (never adds BOS; see `add_bos()`)
//! - `decode(ids) -> String` (lossy: invalid UTF-8 becomes U+FFFD)
//! - `token_bytes(id) -> Vec<u8>`, `n_vocab()`, `bos()`, `eos()`, `add_bos()`, `is_eog(id)`,
//!   `chat_template()`, `token_id(text)`
//! - `StreamDecoder::new()`, `push(&Tokenizer, id) -> String`, `flush() -> String`

use crate::gguf::Gguf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Invalid(String),
}

pub struct Tokenizer {}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let _ = g;
        todo!("tokenizer helper")
    }
}
