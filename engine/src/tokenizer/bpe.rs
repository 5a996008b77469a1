//! Byte-level BPE merging (llama.cpp `llm_tokenizer_bpe_session::tokenize`).
//!
//! Every string that takes part in a merge is interned: vocabulary tokens keep their
//! ids, other merge operands/results get ids from `n_vocab` up. Merge rules are a hash
//! map `(left id, right id) -> (rank, result id)`; a word is merged with a binary heap
//! ordered by (rank, left position), exactly llama.cpp's `llm_bigram_bpe::comparator`.
//! Byte-level vocabularies start from one symbol per byte (its GPT-2 character); raw
//! ones (gemma4: UTF-8 token texts, `▁` for spaces) from one symbol per character,
//! with `<0xXX>` tokens for the bytes of what does not end as a token.

use super::TokenizerError;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// GPT-2 `bytes_to_unicode`: byte -> the code point that stands for it in token texts.
pub fn byte_to_char(b: u8) -> char {
    let b32 = b as u32;
    let printable = (0x21..=0x7E).contains(&b32)
        || (0xA1..=0xAC).contains(&b32)
        || (0xAE..=0xFF).contains(&b32);
    if printable {
        return char::from_u32(b32).unwrap_or('\u{FFFD}');
    }
    // Non-printable bytes map, in order, to 256, 257, ...
    let mut n = 0u32;
    for x in 0..b32 {
        let p =
            (0x21..=0x7E).contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap_or('\u{FFFD}')
}

/// Inverse of [`byte_to_char`] for all code points below 0x200 (the map's range).
pub fn char_to_byte_table() -> Vec<i16> {
    let mut t = vec![-1i16; 0x200];
    for b in 0..=255u8 {
        t[byte_to_char(b) as usize] = b as i16;
    }
    t
}

/// FxHash-style hasher for integer keys.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);
impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        // Mix the high bits down: hashbrown indexes buckets by the low bits.
        let h = self.0;
        (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let mut tail = 0u64;
        for (i, &b) in chunks.remainder().iter().enumerate() {
            tail |= (b as u64) << (8 * i);
        }
        self.write_u64(tail);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64)
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
    }
}
pub type FxBuild = BuildHasherDefault<FxHasher>;

pub struct Bpe {
    n_vocab: u32,
    /// (left << 32 | right) -> (rank, merged id)
    merges: HashMap<u64, (u32, u32), FxBuild>,
    /// Interned id of the one-character string for each byte.
    byte_sym: [u32; 256],
    /// Texts of interned non-vocabulary strings (id - n_vocab).
    extra: Vec<String>,
    /// Vocabulary id of each one-byte ASCII string (llama.cpp's per-byte fallback).
    ascii_tok: [Option<u32>; 128],
    /// Raw (not byte-encoded) vocabularies: the id of every interned one-character
    /// string and the `<0xXX>` byte tokens.
    raw: Option<Raw>,
}

struct Raw {
    char_id: HashMap<char, u32>,
    byte_tok: [Option<u32>; 256],
}

/// Ids from here up name characters of a word that no token or merge contains
/// (`BpeScratch::unknown`).
const UNKNOWN_BASE: u32 = u32::MAX / 2;

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: i32,
    next: i32,
}

/// Heap entry: (rank, left index, right index, left id, right id, merged id).
type Bigram = (u32, u32, u32, u32, u32, u32);

/// Scratch buffers reused across words.
#[derive(Default)]
pub struct BpeScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Bigram>>,
    unknown: Vec<char>,
    ids: Vec<u32>,
}

impl Bpe {
    pub fn new(
        token_to_id: &HashMap<String, u32>,
        n_vocab: u32,
        merges: &[String],
    ) -> Result<Bpe, TokenizerError> {
        let mut extra: Vec<String> = Vec::new();
        let mut extra_map: HashMap<String, u32> = HashMap::new();
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = token_to_id.get(s) {
                return id;
            }
            if let Some(&id) = extra_map.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.push(s.to_string());
            extra_map.insert(s.to_string(), id);
            id
        };
        let mut byte_sym = [0u32; 256];
        for b in 0..=255u8 {
            byte_sym[b as usize] = intern(byte_to_char(b).encode_utf8(&mut [0; 4]));
        }
        let mut map: HashMap<u64, (u32, u32), FxBuild> =
            HashMap::with_capacity_and_hasher(merges.len(), FxBuild::default());
        let mut cat = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // "left right", split at the first space after position 0 (llama.cpp `find(' ', 1)`).
            let pos = m
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1);
            let Some(pos) = pos else {
                return Err(TokenizerError::MalformedMerge {
                    index: rank,
                    text: m.clone(),
                });
            };
            let (left, right) = (&m[..pos], &m[pos + 1..]);
            let l = intern(left);
            let r = intern(right);
            cat.clear();
            cat.push_str(left);
            cat.push_str(right);
            let res = intern(&cat);
            // The first occurrence of a pair keeps its rank (std::map::emplace).
            map.entry(((l as u64) << 32) | r as u64)
                .or_insert((rank as u32, res));
        }
        let mut ascii_tok = [None; 128];
        for (b, slot) in ascii_tok.iter_mut().enumerate() {
            *slot = token_to_id
                .get((b as u8 as char).encode_utf8(&mut [0; 4]) as &str)
                .copied();
        }
        Ok(Bpe {
            n_vocab,
            merges: map,
            byte_sym,
            extra,
            ascii_tok,
            raw: None,
        })
    }

    /// A raw-UTF-8 vocabulary (no byte-level encoding of token texts).
    pub fn new_raw(token_to_id: &HashMap<String, u32>, n_vocab: u32, merges: &[String]) -> Result<Bpe, TokenizerError> {
        let mut b = Bpe::new(token_to_id, n_vocab, merges)?;
        let mut char_id = HashMap::new();
        let one_char = |s: &str| {
            let mut c = s.chars();
            c.next().filter(|_| c.next().is_none())
        };
        for (t, &id) in token_to_id {
            char_id.extend(one_char(t).map(|c| (c, id)));
        }
        for (i, t) in b.extra.iter().enumerate() {
            if let Some(c) = one_char(t) {
                char_id.entry(c).or_insert(n_vocab + i as u32);
            }
        }
        let mut byte_tok = [None; 256];
        for (v, slot) in byte_tok.iter_mut().enumerate() {
            *slot = token_to_id.get(&format!("<0x{v:02X}>")).copied();
        }
        b.raw = Some(Raw { char_id, byte_tok });
        Ok(b)
    }

    #[inline]
    fn rule(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        self.merges.get(&(((l as u64) << 32) | r as u64)).copied()
    }

    /// `s.ids`: one symbol id per byte (byte-level) or per character (raw).
    fn initial_ids(&self, word: &[u8], s: &mut BpeScratch) {
        s.ids.clear();
        let Some(raw) = &self.raw else {
            s.ids.extend(word.iter().map(|&b| self.byte_sym[b as usize]));
            return;
        };
        s.unknown.clear();
        for c in String::from_utf8_lossy(word).chars() {
            let id = raw.char_id.get(&c).copied().unwrap_or_else(|| {
                s.unknown.push(c);
                UNKNOWN_BASE + s.unknown.len() as u32 - 1
            });
            s.ids.push(id);
        }
    }

    /// Tokenizes one pre-tokenizer piece (raw bytes) and appends the ids to `out`.
    pub fn encode_word(&self, word: &[u8], s: &mut BpeScratch, out: &mut Vec<u32>) {
        if word.len() == 1 && self.raw.is_none() {
            self.push_sym(self.byte_sym[word[0] as usize], &[], out);
            return;
        }
        self.initial_ids(word, s);
        let ids = &s.ids;
        let syms = &mut s.syms;
        let heap = &mut s.heap;
        syms.clear();
        heap.clear();
        let n = ids.len();
        for (i, &id) in ids.iter().enumerate() {
            let next = if i + 1 == n { -1 } else { i as i32 + 1 };
            syms.push(Sym {
                id,
                prev: i as i32 - 1,
                next,
            });
        }
        for i in 1..n {
            let (l, r) = (syms[i - 1].id, syms[i].id);
            if let Some((rank, res)) = self.rule(l, r) {
                heap.push(Reverse((rank, (i - 1) as u32, i as u32, l, r, res)));
            }
        }
        // A symbol is dead when it was merged into its left neighbour (id = u32::MAX).
        while let Some(Reverse((_, li, ri, lid, rid, res))) = heap.pop() {
            let (li, ri) = (li as usize, ri as usize);
            let (left, right) = (syms[li], syms[ri]);
            // Stale unless both are alive, still adjacent and unchanged.
            if left.id != lid || right.id != rid || left.next != ri as i32 {
                continue;
            }
            syms[li].id = res;
            syms[li].next = right.next;
            syms[ri].id = u32::MAX;
            if right.next >= 0 {
                syms[right.next as usize].prev = li as i32;
            }
            if left.prev >= 0 {
                let p = left.prev as usize;
                if let Some((rank, r2)) = self.rule(syms[p].id, res) {
                    heap.push(Reverse((rank, p as u32, li as u32, syms[p].id, res, r2)));
                }
            }
            if right.next >= 0 {
                let q = right.next as usize;
                if let Some((rank, r2)) = self.rule(res, syms[q].id) {
                    heap.push(Reverse((rank, li as u32, q as u32, res, syms[q].id, r2)));
                }
            }
        }
        let mut i = if n == 0 { -1 } else { 0 };
        while i >= 0 {
            let sym = syms[i as usize];
            self.push_sym(sym.id, &s.unknown, out);
            i = sym.next;
        }
    }

    /// Appends a final symbol: its vocabulary id, or llama.cpp's per-byte fallback
    /// (byte-level: the one-byte strings of the symbol's text that exist in the
    /// vocabulary; raw: the `<0xXX>` tokens of its bytes).
    #[inline]
    fn push_sym(&self, id: u32, unknown: &[char], out: &mut Vec<u32>) {
        if id < self.n_vocab {
            out.push(id);
            return;
        }
        let mut buf = [0u8; 4];
        let text: &str = if id >= UNKNOWN_BASE {
            unknown[(id - UNKNOWN_BASE) as usize].encode_utf8(&mut buf)
        } else {
            &self.extra[(id - self.n_vocab) as usize]
        };
        for &b in text.as_bytes() {
            let t = match &self.raw {
                Some(r) => r.byte_tok[b as usize],
                None => self.ascii_tok.get(b as usize).copied().flatten(),
            };
            out.extend(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), '\u{120}'); // 'Ġ'
        assert_eq!(byte_to_char(b'\n'), '\u{10A}'); // 'Ċ'
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        let t = char_to_byte_table();
        for b in 0..=255u8 {
            assert_eq!(t[byte_to_char(b) as usize], b as i16);
        }
    }
}
