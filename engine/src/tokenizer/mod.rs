//! Byte-level BPE (`gpt2`) and SentencePiece (`llama`) tokenizers built from GGUF
//! metadata (spec §9.2), exactly llama.cpp's.
//!
//! CONTRACT (used by the CLI; keep these signatures):
//! - `Tokenizer::from_gguf(&Gguf) -> Result<Tokenizer, TokenizerError>`
//! - `encode(text, parse_special) -> Vec<u32>` (never adds BOS; see `add_bos()`)
//! - `decode(ids) -> String` (lossy: invalid UTF-8 becomes U+FFFD)
//! - `token_bytes(id) -> Vec<u8>`, `n_vocab()`, `bos()`, `eos()`, `add_bos()`, `is_eog(id)`,
//!   `chat_template()`, `token_id(text)`
//! - `StreamDecoder::new()`, `push(&Tokenizer, id) -> String`, `flush() -> String`
//!
//! Encoding follows llama.cpp: special tokens are split out of the text first
//! (`tokenizer_st_partition`: longest first; control/unknown tokens only when
//! `parse_special`, user-defined tokens always), the remaining text is split by the
//! pre-tokenizer ([`pretok`]), and each piece is merged by [`bpe`]. SentencePiece
//! vocabularies skip the pre-tokenizer: each text fragment gets a leading space when it
//! starts the text or follows a special token (`add_space_prefix`), spaces become `▁`,
//! and [`spm`] merges by score with byte fallback.

pub mod bpe;
pub mod pretok;
mod load;
mod pretok_regex;
pub mod spm;
mod stream;

pub use pretok::PreTokenizer;
pub use stream::StreamDecoder;

use bpe::{Bpe, BpeScratch, FxBuild};
use spm::Spm;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer: missing metadata key `{0}`")]
    MissingKey(&'static str),
    #[error("tokenizer: metadata key `{key}` has the wrong type: expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error("tokenizer: unsupported tokenizer model `{found}` (tokenizer.ggml.model); supported: `gpt2` (byte-level BPE), `llama` (SentencePiece)")]
    UnsupportedModel { found: String },
    #[error("tokenizer: the vocabulary is empty")]
    EmptyVocab,
    #[error("tokenizer: {tokens} tokens but {types} token types")]
    TypeCountMismatch { tokens: usize, types: usize },
    #[error("tokenizer: malformed merge #{index} {text:?}: expected \"left right\"")]
    MalformedMerge { index: usize, text: String },
    #[error("tokenizer: {0}")]
    Invalid(String),
}

/// llama.cpp token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The merge algorithm of a vocabulary (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VocabKind {
    /// `gpt2`: byte-level BPE over pre-tokenizer pieces, merges by rank.
    #[default]
    Bpe,
    /// `llama`: SentencePiece, merges by token score, `<0xXX>` byte fallback.
    Spm,
    /// `gemma4`: BPE by rank over raw UTF-8 (spaces as `▁`, no byte-level map),
    /// pieces split at newline runs, `<0xXX>` byte fallback.
    BpeRaw,
}

/// Plain data a tokenizer is built from (what `from_gguf` extracts).
#[derive(Clone, Debug, Default)]
pub struct TokenizerData {
    pub kind: VocabKind,
    pub tokens: Vec<String>,
    /// One per token (SentencePiece merge priority); empty means all 0.
    pub scores: Vec<f32>,
    /// One per token; empty means all normal.
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    /// `tokenizer.ggml.add_space_prefix`; `None`: the kind's default (SentencePiece yes).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.pre` ("qwen35", "qwen2", ...); empty = default.
    pub pre: String,
    pub chat_template: Option<String>,
}

/// Options for [`Tokenizer::decode_with`] / [`StreamDecoder::with_options`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Render control tokens (`<|im_end|>` ...) as their text (llama.cpp `special=true`).
    pub special: bool,
}

/// Texts llama.cpp treats as end-of-generation tokens (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];
/// Texts llama.cpp auto-detects as the EOT token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

const CACHE_MAX: usize = 1 << 16;

/// Per-piece BPE results: piece bytes -> ids.
type WordCache = HashMap<Box<[u8]>, Box<[u32]>, FxBuild>;

pub struct Tokenizer {
    kind: VocabKind,
    tokens: Vec<String>,
    types: Vec<i32>,
    token_to_id: HashMap<String, u32>,
    bpe: Bpe,
    spm: Option<Spm>,
    pre: PreTokenizer,
    /// llama3-style vocabularies: a piece that is a token is not merged (llama.cpp
    /// `ignore_merges`).
    ignore_merges: bool,
    add_space_prefix: bool,
    /// Special tokens split out before BPE, longest text first.
    special: Vec<u32>,
    /// Decoded bytes of every token as llama.cpp's `token_to_piece(special=true)`.
    piece_data: Vec<u8>,
    piece_off: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    eog: HashSet<u32>,
    chat_template: Option<String>,
    /// Per-piece BPE results (shared; skipped when another thread holds it).
    cache: Mutex<WordCache>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.tokens.len())
            .field("pre", &self.pre)
            .finish()
    }
}

impl Tokenizer {
    /// Builds a tokenizer (byte-level BPE or SentencePiece, `d.kind`) from plain data.
    pub fn new(d: TokenizerData) -> Result<Tokenizer, TokenizerError> {
        let n = d.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > (u32::MAX / 2) as usize {
            return Err(TokenizerError::Invalid(format!(
                "vocabulary too large ({n} tokens)"
            )));
        }
        let mut types = d.token_types;
        if types.is_empty() {
            types = vec![token_type::NORMAL; n];
        } else if types.len() != n {
            return Err(TokenizerError::TypeCountMismatch {
                tokens: n,
                types: types.len(),
            });
        }
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in d.tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32); // the last duplicate wins, like llama.cpp
        }
        let bpe = match d.kind {
            VocabKind::BpeRaw => Bpe::new_raw(&token_to_id, n as u32, &d.merges)?,
            _ => Bpe::new(&token_to_id, n as u32, &d.merges)?,
        };
        let text_tokens = d.kind != VocabKind::Bpe; // token texts are UTF-8 with ▁, bytes <0xXX>
        let spm = (d.kind == VocabKind::Spm).then(|| Spm::new(&token_to_id, d.scores));
        let valid = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (bos, eos, pad) = (valid(d.bos), valid(d.eos), valid(d.pad));
        let mut eot = valid(d.eot);
        if eot.is_none() {
            eot = EOT_TEXTS.iter().find_map(|t| token_to_id.get(*t).copied());
        }
        let mut eog: HashSet<u32> = [eos, eot].into_iter().flatten().collect();
        let by_text = EOG_TEXTS
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied());
        for id in by_text.chain(eot) {
            eog.insert(id);
            // llama.cpp overrides such "control-looking" tokens to be control tokens.
            if types[id as usize] != token_type::CONTROL {
                types[id as usize] = token_type::CONTROL;
            }
        }
        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                let t = types[i as usize];
                (t == token_type::CONTROL
                    || t == token_type::USER_DEFINED
                    || t == token_type::UNKNOWN)
                    && !d.tokens[i as usize].is_empty()
            })
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(d.tokens[i as usize].len()));
        let c2b = bpe::char_to_byte_table();
        let mut piece_data = Vec::new();
        let mut piece_off = Vec::with_capacity(n + 1);
        piece_off.push(0u32);
        for (t, &ty) in d.tokens.iter().zip(&types) {
            match ty {
                token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED => {
                    piece_data.extend_from_slice(t.as_bytes())
                }
                token_type::NORMAL if text_tokens => {
                    piece_data.extend_from_slice(t.replace('\u{2581}', " ").as_bytes())
                }
                token_type::BYTE if text_tokens => piece_data.extend(Spm::byte_of(t)),
                token_type::NORMAL => {
                    for c in t.chars() {
                        match c2b.get(c as usize) {
                            Some(&b) if b >= 0 => piece_data.push(b as u8),
                            _ => {
                                piece_data.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes())
                            }
                        }
                    }
                }
                _ => {} // unused / byte / undefined: rendered empty by llama.cpp's BPE path
            }
            piece_off.push(piece_data.len().min(u32::MAX as usize) as u32);
        }
        let pre = match d.kind {
            VocabKind::BpeRaw => PreTokenizer::Newlines, // llama.cpp sets "gemma4" for the model
            _ => PreTokenizer::from_name(&d.pre),
        };
        Ok(Tokenizer {
            kind: d.kind,
            tokens: d.tokens,
            types,
            token_to_id,
            bpe,
            spm,
            pre,
            ignore_merges: d.kind == VocabKind::Bpe && pre == PreTokenizer::Llama3,
            add_space_prefix: d.add_space_prefix.unwrap_or(d.kind == VocabKind::Spm),
            special,
            piece_data,
            piece_off,
            bos,
            eos,
            eot,
            pad,
            add_bos: d.add_bos,
            eog,
            chat_template: d.chat_template,
            cache: Mutex::new(HashMap::default()),
        })
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    /// Whether a BOS token should be prepended (`tokenizer.ggml.add_bos_token`, default false).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
    pub fn kind(&self) -> VocabKind {
        self.kind
    }
    /// End of generation: eos, eot and `<|im_end|>`, `<|endoftext|>`, ... (llama.cpp's list).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
    /// The id of the token whose (GGUF) text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }
    /// The GGUF text of a token (byte-level encoded for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|s| s.as_str())
    }
    /// The token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }

    /// Bytes of one token as llama.cpp's `token_to_piece(special)` renders them; out
    /// of range ids give U+FFFD.
    pub fn token_piece(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.tokens.len() {
            return "\u{FFFD}".as_bytes();
        }
        if !special && self.types[i] == token_type::CONTROL {
            return &[];
        }
        &self.piece_data[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// Bytes of one token; control tokens are empty (llama.cpp's default `special=false`).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_piece(id, false).to_vec()
    }

    /// Lossy decode; control tokens render empty. With `add_space_prefix`
    /// (SentencePiece), one leading space of the first token is dropped, like
    /// llama.cpp's `llama_detokenize`.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, DecodeOptions::default())
    }

    pub fn decode_with(&self, ids: &[u32], opts: DecodeOptions) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let p = self.token_piece(id, opts.special);
            let strip = i == 0 && self.add_space_prefix && p.first() == Some(&b' ');
            bytes.extend_from_slice(&p[strip as usize..]);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Tokenizes `text`. Never adds BOS (see [`Tokenizer::add_bos`]). With
    /// `parse_special`, control tokens written in the text (`<|im_start|>`) become their
    /// ids; user-defined tokens are always recognised.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        if let Some(spm) = &self.spm {
            self.encode_spm(spm, text, parse_special, &mut out);
            return out;
        }
        let mut st = EncodeState {
            split: pretok::Splitter::default(),
            scratch: BpeScratch::default(),
            cache: self.cache.try_lock().ok(),
        };
        for frag in self.partition(text, parse_special) {
            match frag {
                Frag::Text(a, b) if self.kind == VocabKind::BpeRaw => {
                    self.encode_text(&text[a..b].replace(' ', "\u{2581}"), &mut st, &mut out)
                }
                Frag::Text(a, b) => self.encode_text(&text[a..b], &mut st, &mut out),
                Frag::Token(id) => out.push(id),
            }
        }
        out
    }

    /// SentencePiece: a space before fragments that start the text or follow a special
    /// token (`add_space_prefix`), spaces escaped as `▁`, then merged by score.
    fn encode_spm(&self, spm: &Spm, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        if text.is_empty() {
            return; // no fragment at all, so no space prefix either
        }
        let mut after_special = true;
        for frag in self.partition(text, parse_special) {
            match frag {
                Frag::Text(a, b) => {
                    let prefix = if self.add_space_prefix && after_special { " " } else { "" };
                    let escaped = format!("{prefix}{}", &text[a..b]).replace(' ', "\u{2581}");
                    spm.encode(&escaped, &self.token_to_id, out);
                    after_special = false;
                }
                Frag::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
            }
        }
    }

    /// `tokenizer_st_partition`: splits special token texts out of `text`.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = vec![Frag::Text(0, text.len())];
        if text.is_empty() {
            return frags;
        }
        for &id in &self.special {
            let ty = self.types[id as usize];
            if !parse_special && (ty == token_type::CONTROL || ty == token_type::UNKNOWN) {
                continue;
            }
            let tok = self.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(*f, Frag::Text(a, b) if text[a..b].contains(tok)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(mut a, b) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(p) = text[a..b].find(tok) {
                    if p > 0 {
                        next.push(Frag::Text(a, a + p));
                    }
                    next.push(Frag::Token(id));
                    a += p + tok.len();
                }
                if a < b {
                    next.push(Frag::Text(a, b));
                }
            }
            frags = next;
        }
        frags
    }

    fn encode_text(&self, text: &str, st: &mut EncodeState<'_>, out: &mut Vec<u32>) {
        let EncodeState {
            split,
            scratch,
            cache,
        } = st;
        split.split(self.pre, text, |piece| {
            let w = piece.as_bytes();
            // a piece that is a token as a whole: llama3's ignore_merges, gemma4's newline runs
            if self.kind == VocabKind::BpeRaw && w.iter().all(|&b| b == b'\n') {
                if let Some(&id) = self.token_to_id.get(piece) {
                    out.push(id);
                    return;
                }
            } else if self.ignore_merges && w.len() > 1 {
                let encoded: String = w.iter().map(|&b| bpe::byte_to_char(b)).collect();
                if let Some(&id) = self.token_to_id.get(&encoded) {
                    out.push(id);
                    return;
                }
            }
            if w.len() == 1 {
                self.bpe.encode_word(w, scratch, out);
                return;
            }
            if let Some(c) = cache.as_deref_mut() {
                if let Some(ids) = c.get(w) {
                    out.extend_from_slice(ids);
                    return;
                }
                let start = out.len();
                self.bpe.encode_word(w, scratch, out);
                if c.len() >= CACHE_MAX {
                    c.clear();
                }
                c.insert(w.into(), out[start..].into());
            } else {
                self.bpe.encode_word(w, scratch, out);
            }
        });
    }
}

struct EncodeState<'a> {
    split: pretok::Splitter,
    scratch: BpeScratch,
    cache: Option<std::sync::MutexGuard<'a, WordCache>>,
}

#[derive(Clone, Copy, Debug)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}
