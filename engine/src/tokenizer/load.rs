//! `Tokenizer::from_gguf`: the `tokenizer.*` metadata (spec §9.2) with llama.cpp's
//! defaults, each key's type checked.

use super::{PreTokenizer, Tokenizer, TokenizerData, TokenizerError, VocabKind};
use crate::gguf::{Gguf, MetaValue};

fn get_str(g: &Gguf, key: &'static str) -> Result<Option<String>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(MetaValue::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(TokenizerError::WrongType {
            key,
            expected: "string",
        }),
    }
}

fn get_str_array(g: &Gguf, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(MetaValue::Array(a)) => a
            .iter()
            .map(|v| match v {
                MetaValue::String(s) => Ok(s.clone()),
                _ => Err(TokenizerError::WrongType {
                    key,
                    expected: "array of strings",
                }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(TokenizerError::WrongType {
            key,
            expected: "array of strings",
        }),
    }
}

fn get_bool(g: &Gguf, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(TokenizerError::WrongType {
            key,
            expected: "bool",
        }),
    }
}

fn get_id(g: &Gguf, key: &'static str) -> Result<Option<u32>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(x) => Ok(u32::try_from(x).ok()), // -1 and friends: "no such token"
            None if v.as_u64().is_some() => Ok(None), // beyond i64: no such token either
            None => Err(TokenizerError::WrongType {
                key,
                expected: "integer",
            }),
        },
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.*` metadata (spec §9.2).
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = get_str(g, "tokenizer.ggml.model")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        let kind = match model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            "gemma4" => VocabKind::BpeRaw,
            _ => return Err(TokenizerError::UnsupportedModel { found: model }),
        };
        let tokens = get_str_array(g, "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
        let merges = match kind {
            VocabKind::Bpe | VocabKind::BpeRaw => get_str_array(g, "tokenizer.ggml.merges")?
                .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?,
            VocabKind::Spm => Vec::new(),
        };
        let scores = match g.get("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(MetaValue::Array(a)) => a
                .iter()
                .map(|v| match *v {
                    MetaValue::F32(x) => Some(x),
                    MetaValue::F64(x) => Some(x as f32),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenizerError::WrongType {
                    key: "tokenizer.ggml.scores",
                    expected: "array of floats",
                })?,
            Some(_) => {
                return Err(TokenizerError::WrongType {
                    key: "tokenizer.ggml.scores",
                    expected: "array of floats",
                })
            }
        };
        let token_types = match g.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(MetaValue::Array(a)) => a
                .iter()
                .map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenizerError::WrongType {
                    key: "tokenizer.ggml.token_type",
                    expected: "array of integers",
                })?,
            Some(_) => {
                return Err(TokenizerError::WrongType {
                    key: "tokenizer.ggml.token_type",
                    expected: "array of integers",
                })
            }
        };
        let pre = get_str(g, "tokenizer.ggml.pre")?.unwrap_or_default();
        // llama.cpp's defaults: SentencePiece and llama3-style BPE add BOS; SentencePiece
        // files name BOS 1 and EOS 2 unless they say otherwise
        let spm = kind == VocabKind::Spm;
        let add_bos = get_bool(g, "tokenizer.ggml.add_bos_token")?
            .unwrap_or(spm || PreTokenizer::from_name(&pre) == PreTokenizer::Llama3);
        let id_or = |key, default: u32| -> Result<Option<u32>, TokenizerError> {
            Ok(match g.get(key) {
                None if spm => Some(default),
                _ => get_id(g, key)?,
            })
        };
        Tokenizer::new(TokenizerData {
            kind,
            tokens,
            scores,
            token_types,
            merges,
            bos: id_or("tokenizer.ggml.bos_token_id", 1)?,
            eos: id_or("tokenizer.ggml.eos_token_id", 2)?,
            eot: get_id(g, "tokenizer.ggml.eot_token_id")?,
            pad: get_id(g, "tokenizer.ggml.padding_token_id")?,
            add_bos,
            add_space_prefix: get_bool(g, "tokenizer.ggml.add_space_prefix")?,
            pre,
            chat_template: get_str(g, "tokenizer.chat_template")?,
        })
    }

}
