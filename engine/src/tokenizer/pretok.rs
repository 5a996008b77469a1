//! Pre-tokenizers: hand-written splitters equivalent to llama.cpp's
//! `unicode_regex_split_custom_qwen35` / `_llama3` / `_gpt2` state machines
//! (`src/unicode.cpp`). Each splits a text into the pieces BPE merges within.
//!
//! qwen35 regex (spec §9.2):
//! ```text
//! (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
//! |\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//! qwen2 is the same without the `\p{M}` terms; llama3 additionally groups digits by
//! up to three (`\p{N}{1,3}`); gpt2 is
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//!
//! Character classes come from the Unicode general category (`unicode-general-category`)
//! and Rust's `char::is_whitespace` (the same White_Space set as llama.cpp's table).

use super::pretok_regex::{split_stages, Class, Rep, Stage};
use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Which splitter a vocabulary uses (from `tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `qwen35`: letters take combining marks, digits one by one.
    Qwen35,
    /// `qwen2` (and `deepseek-r1-qwen`, ...): like qwen35 without `\p{M}`.
    Qwen2,
    /// `llama3`/`llama-bpe`/...: like qwen2 with digits grouped by up to three.
    Llama3,
    /// `gpt2` and the fallback for other values.
    Gpt2,
    /// `falcon`: `[\p{P}\$\+<=>\^~\|`]+`, then gpt2, then `[0-9][0-9][0-9]`.
    Falcon,
    /// `starcoder`, `refact`, `command-r`, ...: `\p{N}`, then gpt2.
    Starcoder,
    /// `deepseek-llm`: newlines, explicit letter and punctuation ranges, trailing
    /// spaces, CJK runs, `\p{N}+`.
    DeepseekLlm,
    /// `deepseek-coder`: newlines, `\s?\p{L}+`, `\s?\p{P}+`, CJK runs, `\p{N}`.
    DeepseekCoder,
    /// `gemma4`: `[^\n]+|[\n]+` (runs of newlines and of everything else).
    Newlines,
}

const fn run(ws: bool, class: Class, rep: Rep) -> Stage {
    Stage::Run { ws, class, rep }
}
const FALCON: &[Stage] = &[run(false, Class::PunctSymbols, Rep::Plus), Stage::Gpt2, run(false, Class::AsciiDigit, Rep::Exactly(3))];
const STARCODER: &[Stage] = &[run(false, Class::Number, Rep::One), Stage::Gpt2];
const DEEPSEEK_LLM: &[Stage] = &[
    run(false, Class::CrLf, Rep::One),
    run(true, Class::DeepseekLetters, Rep::Plus),
    run(true, Class::DeepseekPunct, Rep::Plus),
    Stage::TrailingWs,
    run(false, Class::Cjk, Rep::Plus),
    run(false, Class::Number, Rep::Plus),
];
const DEEPSEEK_CODER: &[Stage] = &[
    run(false, Class::CrLf, Rep::One),
    run(true, Class::Letter, Rep::Plus),
    run(true, Class::Punct, Rep::Plus),
    run(false, Class::Cjk, Rep::Plus),
    run(false, Class::Number, Rep::One),
];

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value to a splitter. Unknown values (and a missing
    /// key) fall back to the GPT-2 splitter, the classic byte-level BPE split.
    pub fn from_name(pre: &str) -> PreTokenizer {
        match pre {
            "qwen35" => PreTokenizer::Qwen35,
            "qwen2" | "deepseek-r1-qwen" | "hunyuan" | "kimi-k2" => PreTokenizer::Qwen2,
            "llama3" | "llama-bpe" | "llama-v3" | "smaug-bpe" | "falcon3" | "pixtral" | "dbrx"
            | "seed-coder" => PreTokenizer::Llama3,
            "falcon" => PreTokenizer::Falcon,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => PreTokenizer::Starcoder,
            "deepseek-llm" => PreTokenizer::DeepseekLlm,
            "deepseek-coder" => PreTokenizer::DeepseekCoder,
            "gemma4" => PreTokenizer::Newlines,
            _ => PreTokenizer::Gpt2,
        }
    }
}

pub(super) const LETTER: u8 = 1;
pub(super) const NUMBER: u8 = 2;
const MARK: u8 = 4;
pub(super) const WS: u8 = 8;
/// Set for every code point inside the text (the C++ code's "flags != 0" test).
const IN: u8 = 16;

const fn ascii_table() -> [u8; 128] {
    let mut t = [IN; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        if c.is_ascii_alphabetic() {
            t[i] |= LETTER;
        } else if c.is_ascii_digit() {
            t[i] |= NUMBER;
        } else if (c >= 9 && c <= 13) || c == b' ' {
            t[i] |= WS;
        }
        i += 1;
    }
    t
}
static ASCII: [u8; 128] = ascii_table();

#[inline]
fn flags_of(c: char) -> u8 {
    if (c as u32) < 128 {
        return ASCII[c as usize];
    }
    let cat = match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => LETTER,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => NUMBER,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => MARK,
        _ => 0,
    };
    IN | cat | if c.is_whitespace() { WS } else { 0 }
}

/// A code point with its byte offset and flags.
pub(super) type Cpt = (usize, char, u8);

/// Reusable scratch space for splitting (code points with their byte offsets).
#[derive(Default)]
pub struct Splitter {
    cpts: Vec<Cpt>,
}

impl Splitter {
    /// Splits `text` and calls `out` with each piece, in order. The pieces concatenate
    /// to `text`.
    pub fn split<'t>(&mut self, pre: PreTokenizer, text: &'t str, mut out: impl FnMut(&'t str)) {
        self.cpts.clear();
        self.cpts
            .extend(text.char_indices().map(|(i, c)| (i, c, flags_of(c))));
        let cp = &self.cpts;
        let n = cp.len();
        let byte = |p: usize| if p < n { cp[p].0 } else { text.len() };
        let mut prev = 0usize;
        let mut emit = |end: usize| {
            if end > prev {
                out(&text[byte(prev)..byte(end)]);
            }
            prev = end;
        };
        match pre {
            PreTokenizer::Gpt2 => split_gpt2(cp, &mut emit),
            PreTokenizer::Qwen35 => split_llama3(cp, true, 1, &mut emit),
            PreTokenizer::Qwen2 => split_llama3(cp, false, 1, &mut emit),
            PreTokenizer::Llama3 => split_llama3(cp, false, 3, &mut emit),
            PreTokenizer::Falcon => split_stages(FALCON, cp, &mut emit),
            PreTokenizer::Starcoder => split_stages(STARCODER, cp, &mut emit),
            PreTokenizer::DeepseekLlm => split_stages(DEEPSEEK_LLM, cp, &mut emit),
            PreTokenizer::DeepseekCoder => split_stages(DEEPSEEK_CODER, cp, &mut emit),
            PreTokenizer::Newlines => {
                for p in 1..=n {
                    if p == n || (cp[p].1 == '\n') != (cp[p - 1].1 == '\n') {
                        emit(p);
                    }
                }
            }
        }
    }
}

/// The llama3 family state machine. `marks`: `[\p{L}\p{M}]` instead of `\p{L}`;
/// `max_digits`: `\p{N}{1,max_digits}`.
fn split_llama3(
    cp: &[(usize, char, u8)],
    marks: bool,
    max_digits: usize,
    emit: &mut impl FnMut(usize),
) {
    let n = cp.len();
    let flags = |p: usize| if p < n { cp[p].2 } else { 0 };
    let word = if marks { LETTER | MARK } else { LETTER };
    let stop = WS | NUMBER | word; // what ends `[^\s\p{L}(\p{M})\p{N}]+`
    let mut pos = 0;
    while pos < n {
        let c = cp[pos].1;
        let f = cp[pos].2;
        // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
        if c == '\'' && pos + 1 < n {
            let c1 = cp[pos + 1].1.to_ascii_lowercase();
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(pos);
                continue;
            }
            if pos + 2 < n {
                let c2 = cp[pos + 2].1.to_ascii_lowercase();
                if matches!((c1, c2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    emit(pos);
                    continue;
                }
            }
        }
        // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
        if !(c == '\r' || c == '\n' || f & NUMBER != 0)
            && (f & word != 0 || flags(pos + 1) & word != 0)
        {
            pos += 1;
            while flags(pos) & word != 0 {
                pos += 1;
            }
            emit(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if f & NUMBER != 0 {
            let mut ini = pos;
            while flags(pos) & NUMBER != 0 {
                pos += 1;
                if pos - ini >= max_digits {
                    emit(pos);
                    ini = pos;
                }
            }
            emit(pos);
            continue;
        }
        // <space>?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
        let f2 = if c == ' ' { flags(pos + 1) } else { f };
        if f2 & stop == 0 && f2 & IN != 0 {
            pos += (c == ' ') as usize;
            while flags(pos) & stop == 0 && flags(pos) & IN != 0 {
                pos += 1;
            }
            while pos < n && (cp[pos].1 == '\r' || cp[pos].1 == '\n') {
                pos += 1;
            }
            emit(pos);
            continue;
        }
        let mut num_ws = 0;
        let mut last_nl_end = 0;
        while flags(pos + num_ws) & WS != 0 {
            let c2 = cp[pos + num_ws].1;
            if c2 == '\r' || c2 == '\n' {
                last_nl_end = pos + num_ws + 1;
            }
            num_ws += 1;
        }
        // \s*[\r\n]+
        if last_nl_end > 0 {
            pos = last_nl_end;
            emit(pos);
            continue;
        }
        // \s+(?!\S)
        if num_ws > 1 && pos + num_ws < n {
            pos += num_ws - 1;
            emit(pos);
            continue;
        }
        // \s+
        if num_ws > 0 {
            pos += num_ws;
            emit(pos);
            continue;
        }
        // no match
        pos += 1;
        emit(pos);
    }
}

/// The GPT-2 state machine (`unicode_regex_split_custom_gpt2`).
pub(super) fn split_gpt2(cp: &[Cpt], emit: &mut impl FnMut(usize)) {
    let n = cp.len();
    let flags = |p: usize| if p < n { cp[p].2 } else { 0 };
    let mut pos = 0;
    while pos < n {
        let c = cp[pos].1;
        // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
        if c == '\'' && pos + 1 < n {
            let c1 = cp[pos + 1].1;
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(pos);
                continue;
            }
            if pos + 2 < n && matches!((c1, cp[pos + 2].1), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(pos);
                continue;
            }
        }
        let f2 = if c == ' ' { flags(pos + 1) } else { cp[pos].2 };
        let skip = (c == ' ') as usize;
        // <space>?\p{L}+ | <space>?\p{N}+
        for class in [LETTER, NUMBER] {
            if f2 & class != 0 {
                pos += skip;
                while flags(pos) & class != 0 {
                    pos += 1;
                }
                emit(pos);
                break;
            }
        }
        if f2 & (LETTER | NUMBER) != 0 {
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+
        if f2 & (WS | LETTER | NUMBER) == 0 && f2 & IN != 0 {
            pos += skip;
            while flags(pos) & (WS | LETTER | NUMBER) == 0 && flags(pos) & IN != 0 {
                pos += 1;
            }
            emit(pos);
            continue;
        }
        let mut num_ws = 0;
        while flags(pos + num_ws) & WS != 0 {
            num_ws += 1;
        }
        if num_ws > 1 && pos + num_ws < n {
            pos += num_ws - 1;
        } else if num_ws > 0 {
            pos += num_ws;
        } else {
            pos += 1;
        }
        emit(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: PreTokenizer, s: &str) -> Vec<&str> {
        let mut v = Vec::new();
        Splitter::default().split(pre, s, |p| v.push(p));
        v
    }

    #[test]
    fn qwen35_pieces() {
        let q = PreTokenizer::Qwen35;
        assert_eq!(split(q, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split(q, "it's WE'LL"), ["it", "'s", " WE", "'LL"]);
        assert_eq!(split(q, "a 123"), ["a", " ", "1", "2", "3"]);
        assert_eq!(split(q, "a   b"), ["a", "  ", " b"]);
        assert_eq!(split(q, "a\n  \n  b"), ["a", "\n  \n", " ", " b"]);
        assert_eq!(split(q, "end.\nNext"), ["end", ".\n", "Next"]);
        assert_eq!(split(q, "cafe\u{301} x"), ["cafe\u{301}", " x"]);
        assert_eq!(
            split(PreTokenizer::Qwen2, "cafe\u{301} x"),
            ["cafe", "\u{301}", " x"]
        );
        assert_eq!(split(q, "a  "), ["a", "  "]);
    }

    #[test]
    fn llama3_and_gpt2() {
        assert_eq!(
            split(PreTokenizer::Llama3, "x 1234567"),
            ["x", " ", "123", "456", "7"]
        );
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello  world 123!!"),
            ["Hello", " ", " world", " 123", "!!"]
        );
    }
}
