//! A reasoning model's `<think> … </think>` block goes to `reasoning_content`, the rest to
//! `content`. Text arrives in pieces, so a tail that could still grow into a tag is held
//! back until it cannot.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Before any non-space text: an opening tag may still come.
    Start,
    Thinking,
    /// After the block: leading newlines are dropped once.
    AfterThink,
    Content,
}

#[derive(Clone, Debug)]
pub struct ThinkSplit {
    mode: Mode,
    held: String,
}

/// Text split into (reasoning, content).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Bytes at the end of `s` that are a proper prefix of `tag` (the longest such tail).
fn partial_tail(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.as_bytes().starts_with(&s.as_bytes()[s.len() - n..])).unwrap_or(0)
}

impl ThinkSplit {
    /// `in_think`: the prompt already opened the block (a template that ends the
    /// generation prompt with `<think>`).
    pub fn new(in_think: bool) -> ThinkSplit {
        ThinkSplit { mode: if in_think { Mode::Thinking } else { Mode::Start }, held: String::new() }
    }

    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        self.held.push_str(piece);
        loop {
            match self.mode {
                Mode::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.mode = Mode::Thinking;
                    } else if OPEN.starts_with(t) {
                        return out; // still may be the tag (or only whitespace so far)
                    } else {
                        self.mode = Mode::Content;
                    }
                }
                Mode::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.mode = Mode::AfterThink;
                    }
                    None => {
                        let keep = partial_tail(&self.held, CLOSE);
                        out.reasoning.push_str(&self.held[..self.held.len() - keep]);
                        self.held.drain(..self.held.len() - keep);
                        return out;
                    }
                },
                Mode::AfterThink => {
                    let t = self.held.trim_start_matches(['\n', '\r']);
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.mode = Mode::Content;
                }
                Mode::Content => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
            }
        }
    }

    /// The end of the text: what is held goes where the mode says.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Thinking => Split { reasoning: held, content: String::new() },
            _ => Split { reasoning: String::new(), content: held },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(in_think: bool, pieces: &[&str]) -> Split {
        let mut t = ThinkSplit::new(in_think);
        let mut all = Split::default();
        for p in pieces {
            let s = t.push(p);
            all.reasoning += &s.reasoning;
            all.content += &s.content;
        }
        let s = t.finish();
        all.reasoning += &s.reasoning;
        all.content += &s.content;
        all
    }

    #[test]
    fn think_block_is_split_across_pieces() {
        let s = run(false, &["<th", "ink>plan ", "a</thi", "nk>\n\nanswer"]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("plan a", "answer"));
        let s = run(true, &["step</think>", "done"]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("step", "done"));
    }

    #[test]
    fn plain_text_and_unclosed_blocks() {
        assert_eq!(run(false, &["<b>", "old</think>"]).content, "<b>old</think>");
        assert_eq!(run(false, &["  "]).content, "  ");
        let s = run(false, &["<think>never closed </th"]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("never closed </th", ""));
    }
}
