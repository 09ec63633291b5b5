//! GGUF-built tokenizers against llama.cpp's tokenization of the same files
//! (tests/data/reference/<model>.json, made by scripts/reference/make_fixtures.py).

use std::path::PathBuf;

use crate::common;

use serde::Deserialize;
use spindle_chat::{GgufMetadata, IncrementalDecoder, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    gguf_file: String,
    tokenization: Vec<Case>,
    generations: Vec<Generation>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids_no_special: Vec<u32>,
    ids_with_special: Vec<u32>,
    detokenized: String,
}

#[derive(Deserialize)]
struct Generation {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn load(model: &str) -> (Fixture, GgufMetadata) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(format!("tests/data/reference/{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fx: Fixture = serde_json::from_str(&text).unwrap();
    let meta = common::gguf_metadata(model, &fx.gguf_file);
    (fx, meta)
}

fn check(model: &str) {
    let (fx, meta) = load(model);
    let tok = Tokenizer::from_gguf(meta).unwrap();
    for case in &fx.tokenization {
        assert_eq!(
            tok.encode(&case.text, false).unwrap(),
            case.ids_no_special,
            "{model}: {:?}",
            case.text
        );
        assert_eq!(
            tok.encode(&case.text, true).unwrap(),
            case.ids_with_special,
            "{model}: {:?} with BOS",
            case.text
        );
        assert_eq!(
            tok.decode(&case.ids_no_special, false).unwrap(),
            case.detokenized,
            "{model}: decode {:?}",
            case.text
        );
        let streamed: Vec<u8> =
            case.ids_no_special.iter().flat_map(|id| tok.token_bytes(*id)).collect();
        assert_eq!(
            String::from_utf8_lossy(&streamed),
            case.detokenized,
            "{model}: token_bytes of {:?}",
            case.text
        );
    }
    for g in &fx.generations {
        assert_eq!(tok.encode(&g.prompt, true).unwrap(), g.prompt_ids, "{model}: {:?}", g.prompt);
        // Streaming the prompt's and continuation's tokens one by one gives exactly the full decode,
        // multi-byte characters included.
        let ids: Vec<u32> = g
            .prompt_ids
            .iter()
            .chain(&g.greedy_ids)
            .copied()
            .filter(|id| Some(*id) != tok.bos_token_id())
            .collect();
        let mut dec = IncrementalDecoder::new();
        let mut streamed: String = ids.iter().map(|id| dec.push(&tok, *id)).collect();
        streamed.push_str(&dec.flush());
        assert_eq!(streamed, tok.decode(&ids, false).unwrap(), "{model}");
    }
    assert!(!tok.eos_token_ids().is_empty());
}

#[test]
fn smollm2_tokenizer_matches_llama_cpp() {
    check("smollm2-135m");
}

#[test]
fn qwen25_tokenizer_matches_llama_cpp() {
    check("qwen2.5-coder-0.5b");
}

#[test]
fn gemma3_tokenizer_matches_llama_cpp() {
    check("gemma3-270m");
}

#[test]
fn multibyte_character_split_across_tokens_is_emitted_once_whole() {
    let (_, meta) = load("smollm2-135m");
    let tok = Tokenizer::from_gguf(meta).unwrap();
    let ids = tok.encode("🚀", false).unwrap();
    assert!(ids.len() > 1, "the emoji should take several byte-level tokens: {ids:?}");
    let mut dec = IncrementalDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|id| dec.push(&tok, *id)).collect();
    assert!(pieces[..pieces.len() - 1].iter().all(String::is_empty), "{pieces:?}");
    assert_eq!(pieces.last().unwrap(), "🚀");
    assert_eq!(tok.decode(&ids, false).unwrap(), "🚀");
}

#[test]
fn special_tokens_are_single_ids_and_end_generation() {
    let (_, meta) = load("qwen2.5-coder-0.5b");
    let tok = Tokenizer::from_gguf(meta).unwrap();
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    let end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(ids.first(), tok.token_to_id("<|im_start|>").as_ref());
    assert_eq!(ids.last(), Some(&end));
    assert!(tok.eos_token_ids().contains(&end));
}

#[test]
fn end_of_generation_ids_and_template_strings() {
    let expect = [
        (
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            &["<|im_end|>", "<|endoftext|>"][..],
            Some("<|im_start|>"),
            "<|im_end|>",
        ),
        (
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            &["<|im_end|>", "<|endoftext|>"][..],
            Some("<|endoftext|>"),
            "<|im_end|>",
        ),
        (
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            &["<eos>", "<end_of_turn>"][..],
            Some("<bos>"),
            "<eos>",
        ),
    ];
    for (model, file, ends, bos, eos) in expect {
        let tok = Tokenizer::from_gguf(common::gguf_metadata(model, file)).unwrap();
        for end in ends {
            let id = tok.token_to_id(end).unwrap_or_else(|| panic!("{model}: no {end}"));
            assert!(tok.eos_token_ids().contains(&id), "{model}: {end} should end generation");
        }
        assert_eq!(tok.bos_token(), bos, "{model}");
        assert_eq!(tok.eos_token(), Some(eos), "{model}");
        assert_eq!(tok.bos_token_id(), bos.and_then(|b| tok.token_to_id(b)), "{model}");
    }
}
