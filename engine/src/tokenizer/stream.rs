//! Streaming detokenization: bytes of a UTF-8 character split over several tokens are
//! held back until the character is complete; invalid sequences become U+FFFD.

use super::{DecodeOptions, Tokenizer};

#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    opts: DecodeOptions,
}

impl StreamDecoder {
    /// A decoder that renders control tokens empty (like [`Tokenizer::decode`]).
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    pub fn with_options(opts: DecodeOptions) -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            opts,
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.push_bytes(tok.token_piece(id, self.opts.special))
    }

    /// Adds raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(std::str::from_utf8(&rest[..good]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &rest[good + bad..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for later.
                            rest = &rest[good..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let n = self.pending.len();
        self.pending.drain(..n - keep);
        out
    }

    /// Whether bytes are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: held-back bytes of an incomplete character become U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
