//! A model's own sampling settings, read from the files the test writes: `general.sampling.*`
//! keys in a GGUF header and `generation_config.json` beside safetensors. A request that leaves a
//! field out gets the model's value, a server flag beats the model, and the startup summary says
//! where each default came from. (Request fields over flags, and every protocol, are tested
//! in-process in `crates/server/tests/routes/sampling.rs`.)

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::Device;

use crate::common::{smollm2, LoggedServer};

/// SmolLM2's GGUF rewritten with `keys` added to its header.
fn smollm2_with(dir: &Path, keys: &[(&str, Value)]) -> PathBuf {
    let mut source = std::fs::File::open(smollm2()).unwrap();
    let content = gguf_file::Content::read(&mut source).unwrap();
    let tensors: Vec<_> = content
        .tensor_infos
        .keys()
        .map(|name| (name.clone(), content.tensor(&mut source, name, &Device::Cpu).unwrap()))
        .collect();
    let mut metadata: Vec<(&str, &Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    metadata.extend(keys.iter().map(|(k, v)| (*k, v)));
    let tensors: Vec<_> = tensors.iter().map(|(name, t)| (name.as_str(), t)).collect();
    let path = dir.join("smollm2-sampling.gguf");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    path
}

fn sampling_keys() -> Vec<(&'static str, Value)> {
    vec![
        ("general.sampling.temp", Value::F32(0.0)),
        ("general.sampling.top_k", Value::I32(1)),
        ("general.sampling.top_p", Value::F32(0.9)),
        ("general.sampling.penalty_last_n", Value::I32(64)),
    ]
}

fn content_of(response: &str) -> String {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"));
    json["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

fn chat(temperature: Option<f32>) -> String {
    let mut body = serde_json::json!({"max_tokens": 12,
        "messages": [{"role": "user", "content": "Name three colours."}]});
    if let Some(t) = temperature {
        body["temperature"] = t.into();
    }
    body.to_string()
}

#[test]
fn a_gguf_s_sampling_keys_are_the_defaults_and_the_startup_line_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2_with(dir.path(), &sampling_keys());
    let server = LoggedServer::serving(&model, &[]);
    let log = server.log();
    let expected = "sampling defaults: temperature 0 (general.sampling.*), top_k 1 \
        (general.sampling.*), top_p 0.9 (general.sampling.*), min_p 0 (built-in), \
        repetition_penalty 1 (built-in)";
    assert!(log.contains(expected), "{expected:?} not in\n{log}");
    assert!(log.contains("general.sampling.penalty_last_n"), "the ignored key named:\n{log}");
    // The model asks for greedy decoding: a request without a temperature is greedy too.
    let greedy = content_of(&server.post("/v1/chat/completions", &chat(Some(0.0))));
    for _ in 0..2 {
        assert_eq!(content_of(&server.post("/v1/chat/completions", &chat(None))), greedy);
    }
    let models = server.get("/v1/models");
    assert!(models.contains(r#""temperature":{"value":0.0,"source":"model"}"#), "{models}");
    server.stop();
}

#[test]
fn a_server_flag_beats_the_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2_with(dir.path(), &sampling_keys());
    let server = LoggedServer::serving(&model, &["--temperature", "0.8", "--top-k", "40"]);
    let log = server.stop();
    let log = String::from_utf8(log).unwrap();
    let expected = "sampling defaults: temperature 0.8 (--temperature), top_k 40 (--top-k), \
        top_p 0.9 (general.sampling.*)";
    assert!(log.contains(expected), "{expected:?} not in\n{log}");
}

#[test]
fn generation_config_json_sets_the_defaults_of_each_thinking_mode() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let model = root.join("tests/data/hybrid/qwen3_5");
    let tokenizer = root.join("crates/chat/tests/data/qwen3");
    for (from, name) in [
        (model.join("config.json"), "config.json"),
        (model.join("model.safetensors"), "model.safetensors"),
        (tokenizer.join("tokenizer.json"), "tokenizer.json"),
        (tokenizer.join("tokenizer_config.json"), "tokenizer_config.json"),
    ] {
        std::fs::copy(from, dir.path().join(name)).unwrap();
    }
    let generation_config = r#"{"bos_token_id": 1, "do_sample": true, "temperature": 0.7,
        "top_p": 0.8, "top_k": 20, "thinking": {"temperature": 0.6, "top_p": 0.95}}"#;
    std::fs::write(dir.path().join("generation_config.json"), generation_config).unwrap();
    let server = LoggedServer::serving(dir.path(), &["--top-p", "0.5"]);
    let log = String::from_utf8(server.stop()).unwrap();
    for expected in [
        "sampling defaults: temperature 0.7 (generation_config.json), top_k 20 \
         (generation_config.json), top_p 0.5 (--top-p), min_p 0 (built-in)",
        "sampling defaults when thinking: temperature 0.6 (generation_config.json), top_k 20 \
         (generation_config.json), top_p 0.5 (--top-p)",
    ] {
        assert!(log.contains(expected), "{expected:?} not in\n{log}");
    }
    assert!(log.contains("do_sample"), "the ignored key named:\n{log}");
}

#[test]
fn a_model_not_loaded_yet_shows_its_files_defaults_in_v1_models() {
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2_with(dir.path(), &sampling_keys());
    let spindle_hub::ModelFiles::Safetensors { dir: first } = spindle_testkit::tiny_model() else {
        unreachable!("the tiny model is a safetensors folder")
    };
    let (first, model) = (first.to_str().unwrap(), model.to_str().unwrap());
    let server = LoggedServer::with_args(&["--model", first, "--model", model]);
    let models = server.get_json("/v1/models");
    server.stop();
    let card = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|card| card["id"] == "smollm2-sampling")
        .unwrap_or_else(|| panic!("no card for the second model: {models}"));
    assert_eq!(card["status"], "not-loaded", "{card}");
    let non_thinking = &card["sampling_defaults"]["non_thinking"];
    assert_eq!(non_thinking["temperature"], serde_json::json!({"value": 0.0, "source": "model"}));
    assert_eq!(non_thinking["top_k"], serde_json::json!({"value": 1, "source": "model"}));
}
