//! The prompt-lookup drafter: no weights. The last `n` tokens (n from `max_ngram` down
//! to `min_ngram`) are searched for in the reference (a predicted output: a text the
//! answer is expected to repeat, e.g. the file a code edit rewrites), read in order from
//! where the last match was, then in everything before them (prompt and text so far),
//! most recent match first; the tokens that followed the match are the drafts. Good at
//! code edits, summaries and repetitive output; costs a scan of the context per round.

use std::sync::Arc;

/// Prompt-lookup settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub max_ngram: usize,
    pub min_ngram: usize,
    /// Tokens of a predicted output (`--draft-ref`, the API's `prediction`); empty: none.
    pub reference: Arc<[u32]>,
    /// Where the last reference match started: the next search starts there (the
    /// answer follows the prediction in order), then wraps to its start.
    cursor: usize,
}

impl Default for Lookup {
    fn default() -> Lookup {
        Lookup { max_ngram: 3, min_ngram: 1, reference: Arc::from([]), cursor: 0 }
    }
}

impl Lookup {
    /// The default settings with a predicted output.
    pub fn with_reference(reference: Arc<[u32]>) -> Lookup {
        Lookup { reference, ..Lookup::default() }
    }

    /// A new predicted output (searched from its start).
    pub fn set_reference(&mut self, reference: Arc<[u32]>) {
        self.reference = reference;
        self.cursor = 0;
    }

    /// Up to `n` tokens to follow `tokens` (the whole sequence, newest last). The longest
    /// n-gram wins; at equal length, one in the reference before one in the context.
    pub fn draft(&mut self, tokens: &[u32], n: usize) -> Vec<u32> {
        let len = tokens.len();
        if n == 0 {
            return Vec::new();
        }
        for g in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if g > len {
                continue;
            }
            let key = &tokens[len - g..];
            // the reference: the first occurrence from the cursor on, else from its start,
            // that has a continuation
            let r = &self.reference;
            let last = r.len().saturating_sub(g);
            let at = |s: &usize| &r[*s..*s + g] == key;
            if let Some(start) = (self.cursor.min(last)..last).find(at).or_else(|| (0..self.cursor.min(last)).find(at)) {
                self.cursor = start + 1;
                let from = start + g;
                return r[from..(from + n).min(r.len())].to_vec();
            }
            // the most recent earlier occurrence in the context (it has a continuation)
            if let Some(start) = (0..len - g).rev().find(|&s| &tokens[s..s + g] == key) {
                let from = start + g;
                return tokens[from..(from + n).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_latest_match() {
        let mut l = Lookup::default();
        // ... 1 2 3 [4 5] ... 9 1 2 3 [7 8] ... 1 2 3 → the latest match continues 7 8
        let t = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(l.draft(&t, 2), vec![7, 8]);
        assert_eq!(l.draft(&t, 5), vec![7, 8, 6, 1, 2]);
        // no match of any length: nothing
        assert!(l.draft(&[1, 2, 3, 4], 3).is_empty());
        // a 1-gram match when no longer one exists
        assert_eq!(l.draft(&[5, 6, 7, 8, 6], 2), vec![7, 8]);
    }

    #[test]
    fn a_reference_is_followed_in_order() {
        let mut l = Lookup::with_reference(Arc::from([10, 11, 12, 13, 14, 15, 12, 13, 20]));
        // the reference's first "12 13" continues 14 15 12
        assert_eq!(l.draft(&[1, 12, 13], 3), vec![14, 15, 12]);
        // the next search starts after that match: the second "12 13" continues 20
        assert_eq!(l.draft(&[1, 12, 13, 14, 15, 12, 13], 3), vec![20]);
        // nothing after the cursor: the search wraps to the start
        assert_eq!(l.draft(&[11], 2), vec![12, 13]);
        // the reference wins at equal length, and a longer match in the context beats a
        // shorter one in the reference
        assert_eq!(l.draft(&[14, 9, 14], 1), vec![15]);
        assert_eq!(l.draft(&[9, 14, 7, 9, 14], 1), vec![7]);
        // the reference's end: no continuation, no draft from it
        assert!(l.draft(&[13, 20], 2).is_empty());
        // an empty reference changes nothing
        assert_eq!(Lookup::with_reference(Arc::from([])).draft(&[5, 6, 7, 8, 6], 2), vec![7, 8]);
    }
}
