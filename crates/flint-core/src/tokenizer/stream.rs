//! Streaming detokenizer: turns token ids into text as they arrive without ever emitting half
//! of a UTF-8 character (byte-fallback and byte-level tokens can split one across tokens).

use super::Tokenizer;

/// Push ids, get text; incomplete UTF-8 at the end is held back until the next push or
/// [`finish`](StreamDecoder::finish). The concatenated output equals
/// `tokenizer.decode(ids, skip_special)`: invalid bytes become U+FFFD exactly as there.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder {
    /// A decoder that renders every token, control tokens included (like `decode(ids, false)`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether control and unknown tokens, and markers of non-text input, are left out (a
    /// reply without special tokens; `decode(ids, true)` leaves out the first two).
    pub fn skip_special(mut self, skip: bool) -> Self {
        self.skip_special = skip;
        self
    }

    /// Adds one token; returns the text that is now complete (possibly empty). Ids outside the
    /// vocabulary contribute nothing.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if !(self.skip_special && tok.is_hidden_in_replies(id)) {
            self.pending.extend_from_slice(tok.piece(id));
        }
        self.drain(false)
    }

    /// Flushes what is still buffered; an incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, flush: bool) -> String {
        let mut out = String::new();
        let mut used = 0;
        while used < self.pending.len() {
            let rest = &self.pending[used..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    used = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    if let Ok(s) = std::str::from_utf8(&rest[..valid]) {
                        out.push_str(s);
                    }
                    used += valid;
                    match e.error_len() {
                        // Definitely invalid: one replacement per maximal invalid sequence.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            used += n;
                        }
                        // Incomplete: wait for more bytes unless this is the end.
                        None => {
                            if flush {
                                out.push(char::REPLACEMENT_CHARACTER);
                                used = self.pending.len();
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..used);
        out
    }
}
