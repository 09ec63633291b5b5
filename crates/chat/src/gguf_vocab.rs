//! Rebuilds a Hugging Face tokenizer from the `tokenizer.ggml.*` keys of a GGUF header, so one
//! tokenizer implementation (the `tokenizers` crate) serves both sources.
//!
//! Two vocabularies exist in GGUF files: `gpt2` (byte-level BPE with merges; the pre-tokenizer
//! regex is chosen by `tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` does) and `llama`
//! (SentencePiece BPE with scores, `▁` for spaces and `<0xXX>` byte fallback, run by our
//! [`SentencePiece`] model inside the same pipeline).

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::ChatError;
use crate::gguf_meta::{GgufMetadata, GgufValue};
use crate::sentencepiece::SentencePiece;
use crate::vocab_model::{Pipeline, VocabModel, END_OF_TURN};

/// llama.cpp token types (`llama_token_type`).
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's split, used by most gpt2-style vocabularies.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The two vocabulary families a GGUF header can describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// GPT-2 byte-level BPE: every byte is written as one printable character.
    ByteLevel,
    /// SentencePiece: `▁` for spaces, `<0xXX>` pieces for raw bytes.
    SentencePiece,
}

/// A GGUF vocabulary: the tokenizer plus what the header says around it.
pub struct GgufVocab {
    pub tokenizer: Pipeline,
    pub kind: VocabKind,
    pub bos_id: Option<u32>,
    pub add_bos: bool,
    pub eos_id: Option<u32>,
    /// Every id that ends generation, `eos_id` included.
    pub eos_ids: Vec<u32>,
}

/// Reads the `tokenizer.ggml.*` keys. The vocabulary's arrays are taken out of `meta` as they
/// are read, so a large vocabulary is not held twice while the tokenizer is built.
pub fn from_metadata(mut meta: GgufMetadata) -> Result<GgufVocab, ChatError> {
    let tokens: Vec<String> = take_array(&mut meta, "tokenizer.ggml.tokens")?
        .into_iter()
        .map(|v| match v {
            GgufValue::String(s) => Ok(s),
            v => Err(ChatError::Gguf(format!("tokenizer.ggml.tokens: not a string: {v:?}"))),
        })
        .collect::<Result<_, _>>()?;
    let types: Vec<i32> = match take_array(&mut meta, "tokenizer.ggml.token_type") {
        Ok(a) => a.iter().map(|v| v.as_i32().unwrap_or(TYPE_NORMAL)).collect(),
        Err(_) => vec![TYPE_NORMAL; tokens.len()],
    };
    let merges = take_array(&mut meta, "tokenizer.ggml.merges");
    let scores = take_array(&mut meta, "tokenizer.ggml.scores");
    let model = string(&meta, "tokenizer.ggml.model")?;
    let count = tokens.len();
    let id =
        |key: &str| meta.get(key).and_then(GgufValue::as_u32).filter(|&i| (i as usize) < count);
    let flag = |key: &str| meta.get(key).and_then(GgufValue::as_bool);
    // Control and user-defined tokens are matched whole in the input, before any splitting,
    // so "<|im_start|>" is one id; only control tokens count as special when decoding.
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| **t == TYPE_CONTROL || **t == TYPE_USER_DEFINED)
        .map(|(content, t)| AddedToken::from(content.clone(), *t == TYPE_CONTROL).normalized(false))
        .collect();
    drop(types);
    let eos_id = id("tokenizer.ggml.eos_token_id");
    let mut eos_ids: Vec<u32> =
        [eos_id, id("tokenizer.ggml.eot_token_id"), id("tokenizer.ggml.eom_token_id")]
            .into_iter()
            .flatten()
            .collect();
    eos_ids.extend(
        END_OF_TURN.iter().filter_map(|end| tokens.iter().position(|t| t == end)).map(|p| p as u32),
    );
    eos_ids.sort_unstable();
    eos_ids.dedup();
    let unk = id("tokenizer.ggml.unknown_token_id");
    // The token strings move into the vocabulary.
    let (kind, mut tokenizer) = match model {
        "gpt2" => (VocabKind::ByteLevel, byte_level_bpe(&meta, tokens, merges?)?),
        "llama" => {
            let add_space_prefix = flag("tokenizer.ggml.add_space_prefix").unwrap_or(true);
            (VocabKind::SentencePiece, sentencepiece_bpe(tokens, scores?, unk, add_space_prefix)?)
        }
        other => {
            return Err(ChatError::Gguf(format!(
                "unsupported tokenizer model '{other}' (supported: gpt2, llama)"
            )))
        }
    };
    tokenizer.add_tokens(added)?;

    let bos_id = id("tokenizer.ggml.bos_token_id");
    // llama.cpp adds BOS by default for SentencePiece vocabularies only.
    let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(kind == VocabKind::SentencePiece)
        && bos_id.is_some();
    Ok(GgufVocab { tokenizer, kind, bos_id, add_bos, eos_id, eos_ids })
}

fn byte_level_bpe(
    meta: &GgufMetadata,
    tokens: Vec<String>,
    merges: Vec<GgufValue>,
) -> Result<Pipeline, ChatError> {
    // Consumed, so the header's merge strings are gone before the BPE is built.
    let merges: Vec<(String, String)> = merges
        .into_iter()
        .filter_map(|v| match v {
            GgufValue::String(m) => Some(m),
            _ => None,
        })
        .map(|m| {
            m.split_once(' ')
                .map(|(l, r)| (l.to_string(), r.to_string()))
                .ok_or_else(|| ChatError::Gguf(format!("merge '{m}' is not two pieces")))
        })
        .collect::<Result<_, _>>()?;
    let pre = meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let split = |pattern: &str| -> Result<Split, ChatError> {
        Ok(Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )?)
    };
    let splits = match pre {
        "qwen2" | "deepseek-r1-qwen" => vec![split(QWEN2_SPLIT)?],
        "llama3" | "llama-bpe" | "smaug-bpe" => vec![split(LLAMA3_SPLIT)?],
        "smollm" | "starcoder" | "refact" => vec![split(r"\p{N}")?, split(GPT2_SPLIT)?],
        _ => vec![split(GPT2_SPLIT)?],
    };
    let mut pre_tokenizers: Vec<_> = splits.into_iter().map(Into::into).collect();
    pre_tokenizers.push(ByteLevel::new(false, false, false).into());
    let model = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        // llama.cpp looks a whole pre-token up in the vocabulary first for llama-3 style vocabularies.
        .ignore_merges(matches!(pre, "llama3" | "llama-bpe" | "smaug-bpe"))
        .build()?;
    let mut tokenizer = Pipeline::new(VocabModel::Hf(model.into()));
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(pre_tokenizers)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tokenizer)
}

fn sentencepiece_bpe(
    tokens: Vec<String>,
    scores: Vec<GgufValue>,
    unk: Option<u32>,
    add_space_prefix: bool,
) -> Result<Pipeline, ChatError> {
    let scores: Vec<f32> = scores.iter().map(|v| v.as_f32().unwrap_or(0.0)).collect();
    let model = SentencePiece::new(tokens, scores, unk);
    let mut tokenizer = Pipeline::new(VocabModel::SentencePiece(model));
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new("▁".to_string()).into());
    }
    normalizers.push(Replace::new(" ", "▁")?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)))?;
    let mut decoders =
        vec![Replace::new("▁", " ")?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if add_space_prefix {
        // The space the normalizer prepended is not part of the text.
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

fn vocab_map(tokens: Vec<String>) -> Vocab {
    tokens.into_iter().enumerate().map(|(i, t)| (t, i as u32)).collect()
}

fn string<'a>(meta: &'a GgufMetadata, key: &str) -> Result<&'a str, ChatError> {
    meta.get(key)
        .and_then(GgufValue::as_str)
        .ok_or_else(|| ChatError::Gguf(format!("missing string '{key}'")))
}

/// The array under `key`, taken out of `meta`.
fn take_array(meta: &mut GgufMetadata, key: &str) -> Result<Vec<GgufValue>, ChatError> {
    match meta.remove(key) {
        Some(GgufValue::Array(items)) => Ok(items),
        _ => Err(ChatError::Gguf(format!("missing array '{key}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;

    fn strings(items: &[&str]) -> GgufValue {
        GgufValue::Array(items.iter().map(|s| GgufValue::String(s.to_string())).collect())
    }

    /// A six-piece SentencePiece vocabulary: "ab" outscores "bc", so "abc" splits as ab|c.
    fn toy_spm() -> GgufMetadata {
        HashMap::from([
            ("tokenizer.ggml.model".to_string(), GgufValue::String("llama".into())),
            (
                "tokenizer.ggml.tokens".to_string(),
                strings(&["<unk>", "<s>", "a", "b", "c", "ab", "bc", "<0x41>", "▁", "▁a"]),
            ),
            (
                "tokenizer.ggml.scores".to_string(),
                GgufValue::Array(
                    [0., 0., -1., -1., -1., -2., -3., 0., -1., -1.5].map(GgufValue::Float).to_vec(),
                ),
            ),
            (
                "tokenizer.ggml.token_type".to_string(),
                GgufValue::Array([2, 3, 1, 1, 1, 1, 1, 6, 1, 1].map(GgufValue::Int).to_vec()),
            ),
            ("tokenizer.ggml.bos_token_id".to_string(), GgufValue::UInt(1)),
            ("tokenizer.ggml.unknown_token_id".to_string(), GgufValue::UInt(0)),
            ("tokenizer.ggml.add_space_prefix".to_string(), GgufValue::Bool(false)),
        ])
    }

    #[test]
    fn sentencepiece_merges_follow_scores_and_bytes_fall_back() {
        let vocab = from_metadata(toy_spm()).unwrap();
        assert_eq!(vocab.kind, VocabKind::SentencePiece);
        assert!(
            vocab.add_bos,
            "SentencePiece vocabularies add BOS unless the header says otherwise"
        );
        let ids = vocab.tokenizer.encode_fast("abcA", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, [5, 4, 7]);
    }

    #[test]
    fn space_prefix_is_added_per_segment_and_stripped_on_decode() {
        let mut meta = toy_spm();
        meta.insert("tokenizer.ggml.add_space_prefix".into(), GgufValue::Bool(true));
        let vocab = from_metadata(meta).unwrap();
        let ids = vocab.tokenizer.encode_fast("a ab", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, [9, 9, 3]);
        assert_eq!(vocab.tokenizer.decode(&ids, false).unwrap(), "a ab");
    }

    #[test]
    fn unknown_tokenizer_model_is_named_in_the_error() {
        let mut meta = toy_spm();
        meta.insert("tokenizer.ggml.model".into(), GgufValue::String("rwkv".into()));
        let err = from_metadata(meta).err().unwrap();
        assert!(err.to_string().contains("rwkv"), "{err}");
    }
}
