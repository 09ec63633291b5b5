//! Streams text out of token ids: bytes are held back until they complete a UTF-8 character,
//! so a character split across tokens is emitted whole, once. The pushes plus the final flush
//! always concatenate to the lossy UTF-8 decoding of all the tokens' bytes.

use crate::Tokenizer;

/// Per-sequence detokenizer state: the bytes of an unfinished character.
#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// A decoder with nothing held back.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds token `id`; returns the text it completes (possibly empty). Bytes that can never
    /// become valid UTF-8 come out as U+FFFD at once; an unfinished character waits.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held back (an unfinished character), lossily; the decoder is then empty.
    pub fn flush(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}
