//! From a request to prompt tokens: the chat template, and tokenization that reuses the
//! exact tokens of earlier sequences.
//!
//! Re-tokenizing a previous turn's text need not give the tokens the model generated
//! (BPE may merge an answer differently), and then the prefix cache would miss the answer.
//! So the server remembers, for each sequence it ran (prompt end and generation end), its
//! text and tokens; a new prompt whose text starts with a remembered text reuses those
//! tokens and tokenizes only the rest (what `pn chat` does within one conversation).

use crate::error::ApiError;
use pn_engine::chat::{render_for, ChatMessage};
use pn_engine::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Texts remembered at most (oldest dropped first).
const MAX_ENTRIES: usize = 512;

/// The template's generation prompt for messages (role, text).
pub fn render_chat(tok: &Tokenizer, msgs: &[(String, String)]) -> Result<String, ApiError> {
    let m: Vec<ChatMessage> = msgs.iter().map(|(r, c)| ChatMessage::new(r.clone(), c.clone())).collect();
    render_for(tok, &m, true).map_err(|e| ApiError::invalid("messages", format!("messages: the model's chat template failed: {e}")))
}

/// Whether the model writes `<think>` blocks (its template knows them), and whether this
/// rendered prompt already opened one.
pub fn reasoning(tok: &Tokenizer, rendered: &str) -> (bool, bool) {
    let knows = tok.chat_template().is_some_and(|t| t.contains("<think>"));
    (knows, knows && rendered.trim_end().ends_with("<think>"))
}

/// Texts of sequences run and their exact tokens.
#[derive(Default)]
pub struct PromptIndex {
    entries: Mutex<VecDeque<(String, Vec<u32>)>>,
}

impl PromptIndex {
    /// Remember that `text` is exactly the sequence `tokens`.
    pub fn insert(&self, text: String, tokens: Vec<u32>) {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = e.iter().position(|(t, _)| *t == text) {
            let hit = e.remove(i).expect("found");
            e.push_back(hit);
            return;
        }
        if e.len() >= MAX_ENTRIES {
            e.pop_front();
        }
        e.push_back((text, tokens));
    }

    /// Tokens of `text` as a whole prompt: the longest remembered prefix's tokens, then the
    /// rest tokenized (special tokens parsed); a BOS first when the model wants one.
    pub fn tokenize(&self, tok: &Tokenizer, text: &str) -> Vec<u32> {
        let best = {
            let e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            e.iter().filter(|(t, _)| text.starts_with(t.as_str())).max_by_key(|(t, _)| t.len()).cloned()
        };
        let (mut ids, rest) = match best {
            Some((t, ids)) => (ids, &text[t.len()..]),
            None => (if tok.add_bos() { tok.bos().into_iter().collect() } else { vec![] }, text),
        };
        ids.extend(tok.encode(rest, true));
        ids
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
