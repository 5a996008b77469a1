//! The prompt-lookup drafter: no weights. The last `n` tokens (n from `max_ngram` down
//! to `min_ngram`) are searched for in everything before them (prompt and text so far),
//! most recent match first; the tokens that followed the match are the drafts. Good at
//! code edits, summaries and repetitive output; costs a scan of the context per round.

/// Prompt-lookup settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub max_ngram: usize,
    pub min_ngram: usize,
}

impl Default for Lookup {
    fn default() -> Lookup {
        Lookup { max_ngram: 3, min_ngram: 1 }
    }
}

impl Lookup {
    /// Up to `n` tokens to follow `tokens` (the whole sequence, newest last).
    pub fn draft(&self, tokens: &[u32], n: usize) -> Vec<u32> {
        let len = tokens.len();
        if n == 0 {
            return Vec::new();
        }
        for g in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if g >= len {
                continue;
            }
            let key = &tokens[len - g..];
            // the most recent earlier occurrence that has a continuation
            for start in (0..len - g).rev() {
                if &tokens[start..start + g] == key {
                    let from = start + g;
                    let to = (from + n).min(len);
                    return tokens[from..to].to_vec();
                }
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
        let l = Lookup::default();
        // ... 1 2 3 [4 5] ... 9 1 2 3 [7 8] ... 1 2 3 → the latest match continues 7 8
        let t = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(l.draft(&t, 2), vec![7, 8]);
        assert_eq!(l.draft(&t, 5), vec![7, 8, 6, 1, 2]);
        // no match of any length: nothing
        assert!(l.draft(&[1, 2, 3, 4], 3).is_empty());
        // a 1-gram match when no longer one exists
        assert_eq!(l.draft(&[5, 6, 7, 8, 6], 2), vec![7, 8]);
    }
}
