//! Rebuilds an HF `tokenizer.json` from the `tokenizer.ggml.*` keys of a GGUF header, so one
//! tokenizer implementation (the `tokenizers` crate) serves both sources.
//!
//! Two vocabularies exist in GGUF files: `gpt2` (byte-level BPE with merges; the pre-tokenizer
//! regex is chosen by `tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` does) and `llama`
//! (SentencePiece BPE with scores, `▁` for spaces and `<0xXX>` byte fallback; its merges are
//! derived from the scores the way transformers' `SentencePieceExtractor` does).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde_json::{json, Value as Json};

use crate::error::ChatError;

/// llama.cpp token types.
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's split, used by most gpt2-style vocabularies.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What the GGUF header says about the vocabulary besides the tokenizer itself.
pub struct GgufVocab {
    pub tokenizer_json: Json,
    pub bos_id: Option<u32>,
    pub add_bos: bool,
    pub eos_ids: Vec<u32>,
}

pub fn from_metadata(meta: &HashMap<String, Value>) -> Result<GgufVocab, ChatError> {
    let model = string(meta, "tokenizer.ggml.model")?;
    let tokens: Vec<String> = array(meta, "tokenizer.ggml.tokens")?
        .iter()
        .map(|v| v.to_string().cloned().map_err(|e| ChatError::Gguf(e.to_string())))
        .collect::<Result<_, _>>()?;
    let types: Vec<i32> = match meta.get("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) => a.iter().map(|v| v.to_i32().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let added: Vec<Json> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, t))| **t == TYPE_CONTROL || **t == TYPE_USER_DEFINED)
        .map(|(id, (content, t))| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": *t == TYPE_CONTROL})
        })
        .collect();
    let id = |key: &str| meta.get(key).and_then(|v| v.to_u32().ok());
    let flag = |key: &str| meta.get(key).and_then(|v| v.to_bool().ok());
    let tokenizer_json = match model {
        "gpt2" => byte_level_bpe(meta, &tokens, added)?,
        "llama" => sentencepiece_bpe(meta, &tokens, &types, added, flag("tokenizer.ggml.add_space_prefix").unwrap_or(true))?,
        other => return Err(ChatError::Gguf(format!("unsupported tokenizer model '{other}' (supported: gpt2, llama)"))),
    };
    let mut eos_ids: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .filter_map(|k| id(k))
        .collect();
    // Chat turns end with these even where the header names another eos.
    for end in ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"] {
        if let Some(pos) = tokens.iter().position(|t| t == end) {
            eos_ids.push(pos as u32);
        }
    }
    eos_ids.sort_unstable();
    eos_ids.dedup();
    let bos_id = id("tokenizer.ggml.bos_token_id");
    Ok(GgufVocab {
        tokenizer_json,
        bos_id,
        add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(model == "llama") && bos_id.is_some(),
        eos_ids,
    })
}

fn byte_level_bpe(meta: &HashMap<String, Value>, tokens: &[String], added: Vec<Json>) -> Result<Json, ChatError> {
    let merges: Vec<Json> = array(meta, "tokenizer.ggml.merges")?
        .iter()
        .filter_map(|v| v.to_string().ok().map(|s| Json::from(s.as_str())))
        .collect();
    let pre = meta.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).map(String::as_str).unwrap_or("default");
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let mut splits = match pre {
        "qwen2" | "deepseek-r1-qwen" => vec![split(QWEN2_SPLIT)],
        "llama3" | "llama-bpe" | "smaug-bpe" => vec![split(LLAMA3_SPLIT)],
        "smollm" | "starcoder" | "refact" => vec![split(r"\p{N}"), split(GPT2_SPLIT)],
        _ => vec![split(GPT2_SPLIT)],
    };
    splits.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab_map(tokens), "merges": merges}
    }))
}

fn sentencepiece_bpe(
    meta: &HashMap<String, Value>,
    tokens: &[String],
    types: &[i32],
    added: Vec<Json>,
    add_space_prefix: bool,
) -> Result<Json, ChatError> {
    let scores: Vec<f32> = array(meta, "tokenizer.ggml.scores")?.iter().map(|v| v.to_f32().unwrap_or(0.0)).collect();
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    // A merge (left, right) exists where both halves and their join are ordinary pieces; it
    // ranks by the joined piece's score, then by the halves' ids.
    let mut merges: Vec<(f32, usize, usize, &str, &str)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types.get(id) != Some(&1) {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], li, ri, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Json> = merges.into_iter().map(|(_, _, _, l, r)| json!([l, r])).collect();
    let unk = meta.get("tokenizer.ggml.unknown_token_id").and_then(|v| v.to_u32().ok()).map(|i| tokens[i as usize].clone());
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab_map(tokens), "merges": merges}
    }))
}

fn vocab_map(tokens: &[String]) -> Json {
    Json::Object(tokens.iter().enumerate().map(|(i, t)| (t.clone(), Json::from(i))).collect())
}

fn string<'a>(meta: &'a HashMap<String, Value>, key: &str) -> Result<&'a str, ChatError> {
    match meta.get(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(ChatError::Gguf(format!("missing '{key}'"))),
    }
}

fn array<'a>(meta: &'a HashMap<String, Value>, key: &str) -> Result<&'a Vec<Value>, ChatError> {
    match meta.get(key) {
        Some(Value::Array(a)) => Ok(a),
        _ => Err(ChatError::Gguf(format!("missing '{key}'"))),
    }
}
