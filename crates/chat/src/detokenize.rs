//! Streams text out of token ids: bytes are held back until they complete a UTF-8
//! character, so a character split across tokens is emitted whole, once.

use crate::Tokenizer;

#[derive(Default)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_bytes(id));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // A sequence that can never become valid is emitted lossily rather than held forever.
            Err(e) if e.error_len().is_some() => return String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned(),
            Err(e) => e.valid_up_to(),
        };
        let rest = self.pending.split_off(valid);
        let text = String::from_utf8(std::mem::replace(&mut self.pending, rest)).unwrap_or_default();
        text
    }

    /// Whatever is still held back, lossily.
    pub fn flush(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}
