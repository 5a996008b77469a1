//! Chat-template rendering (`tokenizer.chat_template`, a Jinja template) with minijinja.
//!
//! The environment is set up like the Hugging Face / llama.cpp renderers: `trim_blocks`
//! and `lstrip_blocks` on, Python string/dict methods (`startswith`, `strip`, `split`,
//! `items` ...) through minijinja-contrib's pycompat, `raise_exception(msg)`, `tojson`,
//! loop controls and `namespace`. Variables: `messages` (list of `{role, content}`),
//! `add_generation_prompt`, `bos_token`, `eos_token`.

use crate::tokenizer::Tokenizer;
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use thiserror::Error as ThisError;

/// ChatML, used when the GGUF has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

#[derive(Debug, ThisError)]
pub enum ChatError {
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template called `raise_exception(msg)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// Any other error while rendering.
    #[error("chat template render error: {0}")]
    Render(String),
}

const RAISED: &str = "raise_exception: ";

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env
}

/// Renders `template` for `messages`.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String, ChatError> {
    let env = environment();
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| ChatError::Syntax(describe(&e)))?;
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    tmpl.render(ctx)
        .map_err(|e| match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            Some(msg) => ChatError::Raised(msg.to_string()),
            None => ChatError::Render(describe(&e)),
        })
}

/// Renders with the tokenizer's template (ChatML when the GGUF has none) and its
/// BOS/EOS texts. When the tokenizer adds BOS itself, a BOS the template writes first
/// (Llama 3, Mistral) is dropped, as llama.cpp's `common_chat_templates_apply` does, so
/// the prompt starts with one BOS.
pub fn render_for(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, ChatError> {
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
    let template = tok.chat_template().unwrap_or(CHATML_TEMPLATE);
    let bos = text(tok.bos());
    let out = render_chat(template, messages, add_generation_prompt, &bos, &text(tok.eos()))?;
    match out.strip_prefix(bos.as_str()) {
        Some(rest) if tok.add_bos() && !bos.is_empty() => Ok(rest.to_string()),
        _ => Ok(out),
    }
}
