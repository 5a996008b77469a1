//! Pre-tokenizers that llama.cpp runs as a sequence of regexes (`unicode_regex_split`
//! with `std::regex` on the category-collapsed text): each stage splits every piece of
//! the previous one into its matches and the gaps between them. The stages used by the
//! supported vocabularies are one character class with an optional leading `\s` and a
//! repeat (`\s?[class]+`, `\p{N}`, `[0-9]{3}`), `\s+$`, and the GPT-2 state machine.

use super::pretok::{split_gpt2, Cpt, LETTER, NUMBER, WS};
use std::sync::OnceLock;
use unicode_general_category::{get_general_category, GeneralCategory as G};

/// One regex of a sequence.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stage {
    /// `'s|'t|…| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (llama.cpp's custom gpt2).
    Gpt2,
    /// `\s?` (when `ws`) then `class` repeated.
    Run { ws: bool, class: Class, rep: Rep },
    /// `\s+$`: the trailing whitespace of a piece.
    TrailingWs,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Rep {
    One,
    Plus,
    Exactly(usize),
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Class {
    /// `[\r\n]`
    CrLf,
    /// `\p{L}` (collapsed: ASCII letters, non-ASCII letters)
    Letter,
    /// `\p{N}`
    Number,
    /// `\p{P}`
    Punct,
    /// falcon's `[\p{P}\$\+<=>\^~\|`]`
    PunctSymbols,
    /// `[0-9]`
    AsciiDigit,
    /// deepseek-llm's explicit letter ranges `[A-Za-zµÀ-Ö…]`
    DeepseekLetters,
    /// deepseek-llm's `[!-/:-~！-／：-～‘-‟　-。]`
    DeepseekPunct,
    /// `[一-龥ࠀ-一가-퟿]`
    Cjk,
}

// Bracket contents copied from llama-vocab.cpp (code point ranges, no escapes).
const DEEPSEEK_LETTERS: &str = include_str!("deepseek_letters.txt");
const DEEPSEEK_PUNCT: &str = "!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}";
const CJK: &str = "\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}";

/// Parses `a-bcd-e` into inclusive ranges.
fn ranges(spec: &str) -> Vec<(char, char)> {
    let c: Vec<char> = spec.trim_end_matches('\n').chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if i + 2 < c.len() && c[i + 1] == '-' {
            out.push((c[i], c[i + 2]));
            i += 3;
        } else {
            out.push((c[i], c[i]));
            i += 1;
        }
    }
    out
}

fn in_ranges(cell: &'static OnceLock<Vec<(char, char)>>, spec: &str, c: char) -> bool {
    cell.get_or_init(|| ranges(spec)).iter().any(|&(a, b)| a <= c && c <= b)
}

fn is_punct(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation() && !"$+<=>^`|~".contains(c);
    }
    matches!(
        get_general_category(c),
        G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation
    )
}

impl Class {
    fn has(self, (_, c, f): Cpt) -> bool {
        static LETTERS: OnceLock<Vec<(char, char)>> = OnceLock::new();
        static PUNCT: OnceLock<Vec<(char, char)>> = OnceLock::new();
        static HAN: OnceLock<Vec<(char, char)>> = OnceLock::new();
        // the collapsed text writes every non-ASCII space as \v, whatever its category
        let ws = f & WS != 0;
        match self {
            Class::CrLf => c == '\r' || c == '\n',
            Class::Letter => !ws && f & LETTER != 0,
            Class::Number => !ws && f & NUMBER != 0,
            Class::Punct => !ws && is_punct(c),
            Class::PunctSymbols => !ws && (is_punct(c) || "$+<=>^~|`".contains(c)),
            Class::AsciiDigit => c.is_ascii_digit(),
            Class::DeepseekLetters => !ws && in_ranges(&LETTERS, DEEPSEEK_LETTERS, c),
            Class::DeepseekPunct => !ws && in_ranges(&PUNCT, DEEPSEEK_PUNCT, c),
            Class::Cjk => !ws && in_ranges(&HAN, CJK, c),
        }
    }
}

impl Stage {
    /// The end of the match starting at `p` in `cp` (one piece), if any.
    fn match_at(self, cp: &[Cpt], p: usize) -> Option<usize> {
        let n = cp.len();
        let ws = |i: usize| i < n && cp[i].2 & WS != 0;
        match self {
            Stage::TrailingWs => (p < n && (p..n).all(ws)).then_some(n),
            Stage::Run { ws: lead, class, rep } => {
                let has = |i: usize| i < n && class.has(cp[i]);
                // `\s?` is greedy: taken when the class follows it
                let s = if lead && ws(p) && has(p + 1) { p + 1 } else { p };
                match rep {
                    Rep::One => has(s).then_some(s + 1),
                    Rep::Plus => has(s).then(|| (s..).find(|&i| !has(i)).unwrap_or(n)),
                    Rep::Exactly(k) => (s..s + k).all(has).then_some(s + k),
                }
            }
            Stage::Gpt2 => None,
        }
    }

    /// Splits the piece `cp[a..b]` into matches and gaps, pushing the piece ends.
    fn split(self, cp: &[Cpt], a: usize, b: usize, ends: &mut Vec<usize>) {
        let piece = &cp[a..b];
        if let Stage::Gpt2 = self {
            split_gpt2(piece, &mut |e| ends.push(a + e));
            return;
        }
        let mut p = 0;
        while p < piece.len() {
            match self.match_at(piece, p) {
                Some(e) => {
                    ends.push(a + p);
                    ends.push(a + e);
                    p = e;
                }
                None => p += 1,
            }
        }
        ends.push(b);
    }
}

/// Runs the stages over `cp` and calls `emit` with each final piece end, in order.
pub(super) fn split_stages(stages: &[Stage], cp: &[Cpt], emit: &mut impl FnMut(usize)) {
    let mut ends = vec![cp.len()];
    let mut next = Vec::new();
    for st in stages {
        next.clear();
        let mut a = 0;
        for &b in &ends {
            if b > a {
                st.split(cp, a, b, &mut next);
            }
            a = b;
        }
        std::mem::swap(&mut ends, &mut next);
    }
    for e in ends {
        emit(e);
    }
}
