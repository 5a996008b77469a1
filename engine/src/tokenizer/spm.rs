//! SentencePiece-style merging for `tokenizer.ggml.model = "llama"` (llama.cpp
//! `llm_tokenizer_spm_session`): the escaped text (spaces as `▁`) starts as one symbol
//! per UTF-8 character; the adjacent pair whose concatenation is a vocabulary token
//! with the highest score is merged first (ties: the leftmost), until no pair is a
//! token. A final symbol that is not a token is written as its bytes (`<0xXX>` tokens).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// What a SentencePiece vocabulary needs besides the token → id map.
pub struct Spm {
    /// Score of every token (`tokenizer.ggml.scores`; 0 when the file has none).
    scores: Vec<f32>,
    /// Token of each byte: `<0xXX>`, else the one-byte string itself (llama.cpp's order).
    byte_tok: [Option<u32>; 256],
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: i32,
    next: i32,
}

/// Heap entry; the greatest is merged first.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        // llama.cpp: l < r when l.score < r.score or (equal and l.left > r.left)
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}

impl Spm {
    pub fn new(token_to_id: &HashMap<String, u32>, scores: Vec<f32>) -> Spm {
        let mut byte_tok = [None; 256];
        for (b, slot) in byte_tok.iter_mut().enumerate() {
            *slot = token_to_id.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                let s = std::str::from_utf8(&[b as u8]).ok().map(str::to_string);
                s.and_then(|s| token_to_id.get(&s).copied())
            });
        }
        Spm { scores, byte_tok }
    }

    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// The byte a `<0xXX>` token stands for.
    pub fn byte_of(text: &str) -> Option<u8> {
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        if hex.len() != 2 {
            return None;
        }
        u8::from_str_radix(hex, 16).ok()
    }

    /// Merges `text` (already escaped) and appends the ids to `out`.
    pub fn encode(&self, text: &str, token_to_id: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        let n = text.chars().count();
        for (i, (start, c)) in text.char_indices().enumerate() {
            let next = if i + 1 == n { -1 } else { i as i32 + 1 };
            syms.push(Sym { start, len: c.len_utf8(), prev: i as i32 - 1, next });
        }
        let mut heap = BinaryHeap::new();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<Bigram>, l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (a, b) = (syms[l as usize], syms[r as usize]);
            let s = &text[a.start..a.start + a.len + b.len];
            if let Some(&id) = token_to_id.get(s) {
                heap.push(Bigram { score: self.score(id), left: l as usize, right: r as usize, len: s.len() });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as i32 - 1, i as i32);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            // stale: one side was merged away, or grew since the pair was queued
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len {
                continue;
            }
            syms[bg.left].len += r.len;
            syms[bg.right].len = 0;
            syms[bg.left].next = r.next;
            if r.next >= 0 {
                syms[r.next as usize].prev = bg.left as i32;
            }
            try_add(&syms, &mut heap, l.prev, bg.left as i32);
            try_add(&syms, &mut heap, bg.left as i32, r.next);
        }
        let mut i = if syms.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = syms[i as usize];
            let piece = &text[s.start..s.start + s.len];
            match token_to_id.get(piece) {
                Some(&id) => out.push(id),
                // only single characters can be left unmerged: write their bytes
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tok[b as usize])),
            }
            i = s.next;
        }
    }
}
