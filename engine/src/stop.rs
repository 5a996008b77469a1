//! Stop strings: text that ends generation and is never emitted.
//!
//! Generated text arrives in pieces (one decoded token at a time). A stop string may span
//! pieces, so the matcher holds back the longest tail of the pending text that could still
//! grow into a stop string, and releases it once it cannot. Callers print (or stream) only
//! what [`StopMatcher::push`] returns, then [`StopMatcher::finish`] at the end.

/// The outcome of one piece of text.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that is safe to emit now.
    pub emit: String,
    /// The stop string that matched; generation must end and nothing after it is emitted.
    pub stopped: Option<String>,
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    done: bool,
}

impl StopMatcher {
    /// Empty stop strings are an error (they would match before any text).
    pub fn new(stops: &[String]) -> Result<StopMatcher, String> {
        if let Some(i) = stops.iter().position(|s| s.is_empty()) {
            return Err(format!("stop string {i}: expected a non-empty string, found \"\""));
        }
        Ok(StopMatcher { stops: stops.to_vec(), pending: String::new(), done: false })
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Add a piece of generated text. After a match, further pieces are ignored.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.done {
            return StopOutput::default();
        }
        self.pending.push_str(piece);
        // The earliest match wins; among matches at one position, the longest.
        let mut hit: Option<(usize, &String)> = None;
        for s in &self.stops {
            if let Some(at) = self.pending.find(s.as_str()) {
                let better = match hit {
                    None => true,
                    Some((h, hs)) => at < h || (at == h && s.len() > hs.len()),
                };
                if better {
                    hit = Some((at, s));
                }
            }
        }
        if let Some((at, s)) = hit {
            let s = s.clone();
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            self.done = true;
            return StopOutput { emit, stopped: Some(s) };
        }
        let keep = self.held_tail_len();
        let cut = self.pending.len() - keep;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutput { emit, stopped: None }
    }

    /// The text still held back, released when generation ends without a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of some stop string (the
    /// longest such tail), cut at a char boundary.
    fn held_tail_len(&self) -> usize {
        let p = self.pending.as_str();
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(p.len());
            for n in (best + 1..=max).rev() {
                let start = p.len() - n;
                if p.is_char_boundary(start) && s.as_bytes().starts_with(&p.as_bytes()[start..]) {
                    best = n;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops).unwrap();
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.emit);
            if o.stopped.is_some() {
                return (out, o.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_across_pieces_is_never_emitted() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), Some("END".into())));
        assert_eq!(run(&["\n\n"], &["x\n", "\ny"]), ("x".into(), Some("\n\n".into())));
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops).unwrap();
        assert_eq!(m.push("ab E").emit, "ab ");
        assert_eq!(m.push("x").emit, "Ex");
        assert_eq!(m.push("EN").emit, "");
        assert_eq!(m.finish(), "EN");
    }

    #[test]
    fn earliest_match_wins_then_longest() {
        assert_eq!(run(&["bc", "abcd"], &["xabcd"]), ("x".into(), Some("abcd".into())));
        assert_eq!(run(&["ab", "abc"], &["zabc"]), ("z".into(), Some("abc".into())));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), Some("é!".into())));
        assert_eq!(run(&["😀x"], &["a😀", "b"]), ("a😀b".into(), None));
    }

    #[test]
    fn no_stops_passes_everything_and_empty_is_rejected() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert!(StopMatcher::new(&["".to_string()]).unwrap_err().contains("non-empty"));
    }
}
