//! The tokenizer: the `tokenizers` crate plus what the model adds around it (BOS, the set of
//! tokens that end generation, raw bytes per token).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;

use crate::error::ChatError;
use crate::gguf_vocab;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    add_bos: bool,
    eos_ids: Vec<u32>,
    /// Raw bytes of each token id, for byte-exact streaming and logprob `bytes`.
    token_bytes: Vec<Vec<u8>>,
}

impl Tokenizer {
    /// Built from the `tokenizer.ggml.*` keys of a GGUF header.
    pub fn from_gguf(meta: &HashMap<String, Value>) -> Result<Self, ChatError> {
        let vocab = gguf_vocab::from_metadata(meta)?;
        let inner = tokenizers::Tokenizer::from_str(&vocab.tokenizer_json.to_string())?;
        Ok(Self::new(inner, vocab.bos_id, vocab.add_bos, vocab.eos_ids))
    }

    /// A `tokenizer.json`, with BOS/EOS taken from a sibling `tokenizer_config.json` when present.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, ChatError> {
        let inner = tokenizers::Tokenizer::from_file(path)?;
        let config = path.with_file_name("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| ChatError::Tokenizer(format!("{}: {e}", config.display())))?,
            Err(_) => serde_json::Value::Null,
        };
        let token_id = |key: &str| {
            let v = &config[key];
            let text = v.as_str().or_else(|| v["content"].as_str())?;
            inner.token_to_id(text)
        };
        let bos_id = token_id("bos_token");
        // tokenizer.json's post-processor adds BOS itself where the model wants it.
        let mut eos_ids: Vec<u32> = token_id("eos_token").into_iter().collect();
        for end in ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"] {
            eos_ids.extend(inner.token_to_id(end));
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(Self::new(inner, bos_id, false, eos_ids))
    }

    fn new(inner: tokenizers::Tokenizer, bos_id: Option<u32>, add_bos: bool, eos_ids: Vec<u32>) -> Self {
        let size = inner.get_vocab_size(true);
        let byte_level = serde_json::to_string(&inner.get_decoder()).is_ok_and(|d| d.contains("ByteLevel"));
        let token_bytes = (0..size as u32).map(|id| raw_bytes(&inner, id, byte_level)).collect();
        Self { inner, bos_id, add_bos, eos_ids, token_bytes }
    }

    /// Token ids of `text`; with `add_special_tokens`, BOS is prepended where the model uses one.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ChatError> {
        let mut ids = self.inner.encode_fast(text, add_special_tokens)?.get_ids().to_vec();
        if add_special_tokens && self.add_bos {
            if let Some(bos) = self.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ChatError> {
        Ok(self.inner.decode(ids, skip_special_tokens)?)
    }

    /// The bytes token `id` stands for (empty for unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Every id that ends generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.inner.id_to_token(id))
    }

    pub fn eos_token(&self) -> Option<String> {
        self.eos_ids.first().and_then(|id| self.inner.id_to_token(*id))
    }
}

/// Decoding a single token can't return partial UTF-8, so bytes are recovered from the
/// vocabulary string: byte-level BPE maps each byte to one printable char, SentencePiece
/// writes `<0xXX>` for raw bytes and `▁` for spaces.
fn raw_bytes(tok: &tokenizers::Tokenizer, id: u32, byte_level: bool) -> Vec<u8> {
    let Some(piece) = tok.id_to_token(id) else { return Vec::new() };
    if let Some(added) = tok.get_added_tokens_decoder().get(&id) {
        return added.content.as_bytes().to_vec();
    }
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|s| s.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    if byte_level {
        if let Some(bytes) = piece.chars().map(byte_level_char_to_byte).collect() {
            return bytes;
        }
    }
    piece.replace('▁', " ").into_bytes()
}

/// Inverse of GPT-2's bytes_to_unicode table.
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(c) {
        return Some(c as u8);
    }
    // The other 68 bytes were mapped, in order, to 256, 257, ...
    let n = c.checked_sub(256)?;
    (0u32..=255).filter(|b| !printable(*b)).nth(n as usize).map(|b| b as u8)
}
