//! Reading `pn chat` turns: a rustyline editor on a terminal (line editing, history in the
//! user's data dir, a paste stays one turn, Alt-Enter or a `"""` block for several lines),
//! plain lines from a pipe otherwise (the prompt then goes to stderr).

use anyhow::Result;
use rustyline::completion::Completer;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::{DefaultHistory, History};
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Cmd, Editor, EventHandler, Helper, KeyCode, KeyEvent, Modifiers};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

/// Opens and closes a multi-line block.
pub const BLOCK: &str = "\"\"\"";

/// What the user did at the prompt.
pub enum Input {
    Line(String),
    /// Ctrl-C: the line was dropped.
    Interrupted,
    /// Ctrl-D or end of input.
    Eof,
}

/// A turn is complete unless it opens a `"""` block it has not closed.
fn open_block(s: &str) -> bool {
    let t = s.trim_start();
    t.starts_with(BLOCK) && (t.len() < 2 * BLOCK.len() || !t.trim_end().ends_with(BLOCK))
}

/// The text of a turn: a `"""` block without its quotes.
pub fn turn_text(s: &str) -> String {
    let t = s.trim();
    match t.strip_prefix(BLOCK).and_then(|r| r.strip_suffix(BLOCK)) {
        Some(inner) => inner.trim_matches('\n').to_string(),
        None => s.trim_end_matches(['\n', '\r']).to_string(),
    }
}

pub struct ChatHelper;

impl Completer for ChatHelper {
    type Candidate = String;
}
impl Hinter for ChatHelper {
    type Hint = String;
}
impl Highlighter for ChatHelper {}
impl Validator for ChatHelper {
    fn validate(&self, ctx: &mut ValidationContext) -> rustyline::Result<ValidationResult> {
        Ok(if open_block(ctx.input()) { ValidationResult::Incomplete } else { ValidationResult::Valid(None) })
    }
}
impl Helper for ChatHelper {}

/// The history file: `$PN_HISTORY`, else `$XDG_DATA_HOME/pantheon/chat_history`, else
/// `~/.local/share/pantheon/chat_history`.
pub fn history_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PN_HISTORY").filter(|p| !p.is_empty()) {
        return Some(p.into());
    }
    let data = std::env::var_os("XDG_DATA_HOME").filter(|p| !p.is_empty()).map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("pantheon").join("chat_history"))
}

pub enum Reader {
    Editor { ed: Box<Editor<ChatHelper, DefaultHistory>>, history: Option<PathBuf> },
    Pipe(std::io::StdinLock<'static>),
}

impl Reader {
    /// The editor when stdin and stdout are terminals, else lines from stdin.
    pub fn new() -> Result<Reader> {
        if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
            return Ok(Reader::Pipe(std::io::stdin().lock()));
        }
        let cfg = rustyline::Config::builder().auto_add_history(true).max_history_size(1000)?.build();
        let mut ed: Editor<ChatHelper, DefaultHistory> = Editor::with_config(cfg)?;
        ed.set_helper(Some(ChatHelper));
        ed.bind_sequence(KeyEvent(KeyCode::Enter, Modifiers::ALT), EventHandler::Simple(Cmd::Newline));
        let history = history_path();
        if let Some(h) = &history {
            let _ = ed.load_history(h); // absent on the first run
        }
        Ok(Reader::Editor { ed: Box::new(ed), history })
    }

    pub fn read(&mut self, prompt: &str) -> Result<Input> {
        match self {
            Reader::Editor { ed, history } => match ed.readline(prompt) {
                Ok(l) => {
                    if let Some(h) = history {
                        save_history(ed.history_mut(), h);
                    }
                    Ok(Input::Line(l))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Input::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Input::Eof),
                Err(e) => Err(e.into()),
            },
            Reader::Pipe(stdin) => {
                // the prompt on stderr keeps stdout the answers alone
                eprint!("{prompt}");
                let mut text = String::new();
                loop {
                    let mut line = String::new();
                    if stdin.read_line(&mut line)? == 0 {
                        return Ok(if text.is_empty() { Input::Eof } else { Input::Line(text) });
                    }
                    text.push_str(&line);
                    if !open_block(&text) {
                        return Ok(Input::Line(text.trim_end_matches(['\n', '\r']).to_string()));
                    }
                }
            }
        }
    }
}

/// History is written after every turn (a crash loses nothing); failures are ignored.
fn save_history(h: &mut DefaultHistory, path: &std::path::Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = h.save(path);
    let _ = std::io::stderr().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triple_quote_blocks() {
        assert!(open_block("\"\"\"def f():"));
        assert!(open_block("\"\"\""));
        assert!(!open_block("\"\"\"def f():\n    pass\n\"\"\""));
        assert!(!open_block("\"\"\"one line\"\"\""));
        assert!(!open_block("plain"));
        assert_eq!(turn_text("\"\"\"\ndef f():\n    pass\n\"\"\""), "def f():\n    pass");
        assert_eq!(turn_text("a\nb"), "a\nb");
    }
}
