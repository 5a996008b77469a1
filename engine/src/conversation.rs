//! A multi-turn conversation whose state stays in the model: each turn feeds only the
//! text the chat template adds since the previous turn (no re-prefill of earlier turns).

use crate::chat::{render_for, ChatError, ChatMessage};
use crate::state::SeqState;
use crate::tokenizer::Tokenizer;

pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// The rendered conversation text the model has seen (its state holds exactly this).
    fed: String,
    pub st: SeqState,
    /// `fed` before the last user turn, to undo a turn whose tokens were not fed.
    fed_before: String,
    /// How often a template re-rendered earlier turns differently, forcing a re-prefill.
    pub re_prefills: usize,
}

impl Conversation {
    pub fn new(system: Option<&str>, st: SeqState) -> Conversation {
        let messages = system.iter().map(|s| ChatMessage::system(*s)).collect();
        Conversation { messages, fed: String::new(), fed_before: String::new(), st, re_prefills: 0 }
    }

    /// Add a user message and return the tokens to feed before generating the answer:
    /// only the rendered text past what the model has seen, or — if the template
    /// rendered earlier turns differently (e.g. it strips reasoning) — everything, after
    /// resetting the state.
    pub fn user_turn(&mut self, tok: &Tokenizer, text: &str) -> Result<Vec<u32>, ChatError> {
        self.messages.push(ChatMessage::user(text));
        let rendered = match render_for(tok, &self.messages, true) {
            Ok(r) => r,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        if !rendered.starts_with(&self.fed) {
            self.st.reset();
            self.fed.clear();
            self.re_prefills += 1;
        }
        self.fed_before = self.fed.clone();
        let mut ids = Vec::new();
        if self.st.pos == 0 && tok.add_bos() {
            ids.extend(tok.bos());
        }
        ids.extend(tok.encode(&rendered[self.fed.len()..], true));
        self.fed = rendered;
        Ok(ids)
    }

    /// Undo the last user turn when its tokens could not be fed (e.g. context full).
    pub fn cancel_user_turn(&mut self) {
        self.messages.pop();
        self.fed = std::mem::take(&mut self.fed_before);
    }

    /// Record the assistant's answer. Every token of `text` must have been fed; the
    /// end-of-turn token that closed it is not fed: the template's end-of-turn text
    /// starts the next turn's delta.
    pub fn assistant_turn(&mut self, text: String) {
        self.fed.push_str(&text);
        self.messages.push(ChatMessage::assistant(text));
    }
}

