//! The tokenizer: the `tokenizers` crate plus what the model adds around it (BOS, the set of
//! tokens that end generation, the raw bytes behind each token).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::Value as Json;

use crate::error::ChatError;
use crate::gguf_meta::GgufMetadata;
use crate::gguf_vocab::{self, VocabKind};
use crate::sentencepiece::byte_of_piece;
use crate::vocab_model::{Pipeline, END_OF_TURN};

/// Where a token's text lies in the encoded string: `start..end` in bytes.
pub type ByteSpan = (usize, usize);

/// A model's tokenizer, from a `tokenizer.json` or a GGUF header.
pub struct Tokenizer {
    inner: Pipeline,
    kind: VocabKind,
    /// Inverse of GPT-2's bytes-to-unicode table (byte-level vocabularies only).
    byte_of_char: HashMap<char, u8>,
    /// Ids of added tokens, whose text is literal rather than encoded.
    added: HashSet<u32>,
    /// Added tokens marked special (control tokens such as `<|im_end|>`).
    special: HashSet<u32>,
    bos_id: Option<u32>,
    /// Whether `encode` must prepend BOS itself (when no post-processor does).
    add_bos: bool,
    eos_ids: Vec<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl Tokenizer {
    /// Loads `tokenizer.json`, taking BOS, EOS and `add_bos_token` from the sibling
    /// `tokenizer_config.json`, `generation_config.json` and `config.json` where present.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, ChatError> {
        let inner = Pipeline::from_file(path)
            .map_err(|e| ChatError::Tokenizer(format!("{}: {e}", path.display())))?;
        let tok_config = sibling_json(path, "tokenizer_config.json")?;
        let gen_config = sibling_json(path, "generation_config.json")?;
        let model_config = sibling_json(path, "config.json")?;

        let token_of = |v: &Json| v.as_str().or_else(|| v["content"].as_str()).map(str::to_string);
        let bos_token = token_of(&tok_config["bos_token"]);
        let bos_id = bos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .or_else(|| ids(&gen_config["bos_token_id"]).first().copied())
            .or_else(|| ids(&model_config["bos_token_id"]).first().copied());
        let eos_from_config =
            token_of(&tok_config["eos_token"]).and_then(|t| inner.token_to_id(&t));
        let mut eos_ids: Vec<u32> = eos_from_config.into_iter().collect();
        eos_ids.extend(ids(&gen_config["eos_token_id"]));
        eos_ids.extend(ids(&model_config["eos_token_id"]));
        let eos_id = eos_ids.first().copied();
        eos_ids.extend(END_OF_TURN.iter().filter_map(|t| inner.token_to_id(t)));
        eos_ids.sort_unstable();
        eos_ids.dedup();

        // Usually the post-processor adds BOS; the config flag matters only where it does not.
        let post_adds_bos = bos_id.is_some_and(|bos| {
            inner.encode_fast("", true).is_ok_and(|e| e.get_ids().contains(&bos))
        });
        let add_bos = tok_config["add_bos_token"].as_bool() == Some(true) && !post_adds_bos;
        let byte_level = inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|d| d.contains("ByteLevel"));
        let kind = if byte_level { VocabKind::ByteLevel } else { VocabKind::SentencePiece };
        Ok(Self::new(inner, kind, bos_id, add_bos, eos_id, eos_ids))
    }

    /// Builds the tokenizer a GGUF header describes (`tokenizer.ggml.*`): byte-level BPE
    /// (`gpt2`) or SentencePiece (`llama`). It consumes the header, whose vocabulary arrays
    /// it takes apart.
    pub fn from_gguf(metadata: GgufMetadata) -> Result<Self, ChatError> {
        let v = gguf_vocab::from_metadata(metadata)?;
        Ok(Self::new(v.tokenizer, v.kind, v.bos_id, v.add_bos, v.eos_id, v.eos_ids))
    }

    fn new(
        inner: Pipeline,
        kind: VocabKind,
        bos_id: Option<u32>,
        add_bos: bool,
        eos_id: Option<u32>,
        eos_ids: Vec<u32>,
    ) -> Self {
        let added_tokens = inner.get_added_tokens_decoder();
        let special = added_tokens.iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
        let added = added_tokens.into_keys().collect();
        let bos_token = bos_id.and_then(|id| inner.id_to_token(id));
        let eos_token = eos_id.and_then(|id| inner.id_to_token(id));
        Self {
            inner,
            kind,
            byte_of_char: byte_level_table(),
            added,
            special,
            bos_id,
            add_bos,
            eos_ids,
            bos_token,
            eos_token,
        }
    }

    /// Token ids of `text`. Special-token text such as `<|im_start|>` always becomes its single
    /// id; `add_special_tokens` adds BOS where the model adds it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ChatError> {
        let mut ids = self.inner.encode_fast(text, add_special_tokens)?.get_ids().to_vec();
        if let (true, true, Some(bos)) = (add_special_tokens, self.add_bos, self.bos_id) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// [`Self::encode`] without special tokens added, and the byte span in `text` of each token
    /// (tokens of one multi-byte character share its span).
    pub fn encode_with_spans(&self, text: &str) -> Result<(Vec<u32>, Vec<ByteSpan>), ChatError> {
        let encoding = self.inner.encode(text, false)?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// The text of `ids`; `skip_special_tokens` drops control tokens such as BOS.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ChatError> {
        Ok(self.inner.decode(ids, skip_special_tokens)?)
    }

    /// The raw bytes token `id` stands for (empty for ids outside the vocabulary). A token may
    /// hold part of a UTF-8 character, so this is bytes, not text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else { return Vec::new() };
        match self.kind {
            VocabKind::ByteLevel if self.added.contains(&id) => piece.into_bytes(),
            // As the ByteLevel decoder does, a char outside the table stands for itself.
            VocabKind::ByteLevel => piece
                .chars()
                .flat_map(|c| match self.byte_of_char.get(&c) {
                    Some(b) => vec![*b],
                    None => c.to_string().into_bytes(),
                })
                .collect(),
            VocabKind::SentencePiece => match byte_of_piece(&piece) {
                Some(b) if !self.added.contains(&id) => vec![b],
                _ => piece.replace('▁', " ").into_bytes(),
            },
        }
    }

    /// Whether `id` is a control token (`<|im_end|>`, BOS), as opposed to text: a grammar
    /// can ask for it by name but never spells it out.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// The vocabulary string of `id` as stored (e.g. `Ġhello` or `▁hello`), for logging.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary string, e.g. `<|im_end|>`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS id, whether or not `encode` adds it.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Every id that ends generation: EOS plus the end-of-turn tokens the vocabulary defines.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The BOS string, as chat templates see it.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The model's primary EOS string, as chat templates see it.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the other 68
/// were mapped in order to U+0100 onwards.
fn byte_level_table() -> HashMap<char, u8> {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                next += 1;
                (char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER), b)
            }
        })
        .collect()
}

/// A JSON file next to `path`, or `Null` when there is none.
fn sibling_json(path: &Path, name: &str) -> Result<Json, ChatError> {
    let file = path.with_file_name(name);
    match std::fs::read_to_string(&file) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| ChatError::Tokenizer(format!("{}: {e}", file.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Json::Null),
        Err(source) => Err(ChatError::Io { path: file, source }),
    }
}

/// Token ids written as one number or a list of numbers.
fn ids(v: &Json) -> Vec<u32> {
    match v {
        Json::Array(items) => items.iter().filter_map(Json::as_u64).map(|i| i as u32).collect(),
        other => other.as_u64().map(|i| i as u32).into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_inverts_gpt2_mapping() {
        let t = byte_level_table();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'A'], b'A');
        assert_eq!(t[&'\u{100}'], 0);
    }

    #[test]
    fn ids_accept_number_or_list() {
        assert_eq!(ids(&serde_json::json!(7)), [7]);
        assert_eq!(ids(&serde_json::json!([1, 106])), [1, 106]);
        assert!(ids(&Json::Null).is_empty());
    }
}
