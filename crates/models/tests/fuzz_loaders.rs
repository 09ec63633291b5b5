//! Fuzzing the weight loaders (issue #20): truncated, bit-flipped and re-declared copies of a
//! tiny GGUF file and a tiny safetensors folder must load as an error or as a model whose
//! first forward pass returns (logits or an error) — never a panic, a hang or an allocation
//! sized by a length the file claims (the capped allocator fails the test on one).
//!
//! `SPINDLE_FUZZ_CASES=100000` runs a long campaign; the default is CI's fixed subset.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use spindle_fuzz::{mutate_bytes, mutate_json, Rng};
use spindle_models::{load_gguf, load_safetensors, CausalLm};

#[global_allocator]
static ALLOC: spindle_fuzz::CappedAlloc = spindle_fuzz::CappedAlloc;

const CI_CASES: u64 = 1_500;
/// The hybrid fixture is larger (1.6 MB of weights, eight layers): fewer cases in CI. Cases 17,
/// 41 and 259 are the regression tests of a zero rotary dimension (a panic in candle's RoPE),
/// of linear-attention sizes that disagree with the weights (a slice index past the end), and
/// of a convolution kernel of 2^32 (a 200 GB recurrent state).
const HYBRID_CI_CASES: u64 = 1_000;

/// The tiny llama both files describe: every dimension a multiple of Q8_0's 32-value block, so
/// the matrices can be stored quantized and the quantized kernels run on damaged blocks too.
const HIDDEN: usize = 32;
const FFN: usize = 64;
const VOCAB: usize = 32;
const HEADS: u32 = 2;
const KV_HEADS: u32 = 1;
const HEAD_DIM: usize = HIDDEN / HEADS as usize;

/// `(GGUF name, HF name, shape)` of every tensor of the one-layer model, whose embedding is
/// tied to its output head.
const TENSORS: &[(&str, &str, [usize; 2])] = &[
    ("token_embd.weight", "model.embed_tokens.weight", [VOCAB, HIDDEN]),
    ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight", [1, HIDDEN]),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", [HIDDEN, HIDDEN]),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", [HEAD_DIM, HIDDEN]),
    ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", [HEAD_DIM, HIDDEN]),
    ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight", [HIDDEN, HIDDEN]),
    ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight", [1, HIDDEN]),
    ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", [FFN, HIDDEN]),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", [FFN, HIDDEN]),
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", [HIDDEN, FFN]),
    ("output_norm.weight", "model.norm.weight", [1, HIDDEN]),
];

/// The tensor's values: small and varied, so a forward pass computes real numbers.
fn values(index: usize, [rows, cols]: [usize; 2]) -> Tensor {
    let data: Vec<f32> =
        (0..rows * cols).map(|i| ((i * 7 + index * 13) % 17) as f32 / 17.0 - 0.5).collect();
    let shape = if rows == 1 { vec![cols] } else { vec![rows, cols] };
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// The GGUF header's metadata, as `(key, value)`: the keys `TransformerConfig::from_gguf` reads.
fn gguf_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.vocab_size", Value::U32(VOCAB as u32)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.attention.head_count", Value::U32(HEADS)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS)),
        ("llama.context_length", Value::U32(64)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
    ]
}

/// The tiny model as GGUF bytes, matrices in Q8_0 (the attention output in F16), vectors in
/// F32; `metadata` is the header to write.
fn gguf_bytes(metadata: &[(&str, Value)]) -> Vec<u8> {
    let tensors: Vec<(&str, QTensor)> = TENSORS
        .iter()
        .enumerate()
        .map(|(i, &(name, _, shape))| {
            let dtype = match (shape[0], name) {
                (1, _) => GgmlDType::F32,
                (_, "blk.0.attn_output.weight") => GgmlDType::F16,
                _ => GgmlDType::Q8_0,
            };
            (name, QTensor::quantize(&values(i, shape), dtype).unwrap())
        })
        .collect();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    let mut bytes = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut bytes, &metadata, &tensors).unwrap();
    bytes.into_inner()
}

/// Values a header field could be damaged to: zero, one, the edges of each integer width, and
/// negative, fractional or non-numeric values where a count is expected.
fn extreme_value(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::U32(*rng.pick(&[0, 1, 3, 0x7fff_ffff, u32::MAX])),
        1 => Value::U64(*rng.pick(&[1 << 32, 1 << 40, 1 << 60, u64::MAX])),
        2 => Value::I32(*rng.pick(&[-1, i32::MIN])),
        3 => Value::I64(i64::MIN),
        4 => Value::F32(*rng.pick(&[0.0, -1.0, f32::NAN, f32::INFINITY, 1e38])),
        5 => Value::F64(*rng.pick(&[1e300, f64::NAN])),
        6 => Value::String(String::new()),
        _ => Value::Array(vec![Value::U32(1); rng.below(3)]),
    }
}

/// A damaged copy of the GGUF file: a header value replaced by an extreme one, then written
/// out well-formed (what a buggy converter makes), or the valid bytes damaged (what a bad
/// disk or an interrupted download makes).
fn damaged_gguf(rng: &mut Rng, valid: &[u8]) -> Vec<u8> {
    if rng.one_in(3) {
        let mut metadata = gguf_metadata();
        let field = rng.below(metadata.len());
        metadata[field].1 = extreme_value(rng);
        return gguf_bytes(&metadata);
    }
    let mut bytes = valid.to_vec();
    mutate_bytes(rng, &mut bytes);
    bytes
}

/// A load that succeeded must give a model whose first forward pass returns (logits or an
/// error). The logits' length is not checked: a real header may state a vocabulary smaller than
/// the embedding (Qwen2.5 pads its embedding past its tokenizer), and the head decides.
fn forward_once(model: &dyn CausalLm) {
    let mut cache = model.new_cache(4);
    let _ = model.forward(&[1, 2], &mut cache);
}

#[test]
fn damaged_gguf_files_fail_to_load_without_panicking() {
    let valid = gguf_bytes(&gguf_metadata());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &valid).unwrap();
    forward_once(load_gguf(&path).expect("the undamaged file loads").as_ref());
    spindle_fuzz::run(
        "gguf",
        CI_CASES,
        |rng| damaged_gguf(rng, &valid),
        |bytes| {
            std::fs::write(&path, bytes).unwrap();
            match load_gguf(&path) {
                Ok(model) => forward_once(model.as_ref()),
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        },
    );
}

/// `config.json` of the tiny model, in HF's shape.
fn hf_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": null,
        "tie_word_embeddings": true,
        "torch_dtype": "float32"
    })
}

fn safetensors_bytes() -> Vec<u8> {
    let tensors: HashMap<String, Tensor> = TENSORS
        .iter()
        .enumerate()
        .map(|(i, &(_, hf, shape))| (hf.to_string(), values(i, shape)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    std::fs::read(path).unwrap()
}

/// Config keys a damaged config might gain, beyond the ones it has.
const HF_KEYS: &[&str] = &[
    "head_dim",
    "sliding_window",
    "rope_scaling",
    "rope_type",
    "factor",
    "original_max_position_embeddings",
    "rope_parameters",
    "full_attention",
    "layer_types",
    "text_config",
];

/// The safetensors folder's two files, either of them damaged.
#[derive(Debug)]
struct Folder {
    config: Vec<u8>,
    weights: Vec<u8>,
}

fn damaged_folder(rng: &mut Rng, weights: &[u8]) -> Folder {
    let mut config = hf_config();
    let mut weights = weights.to_vec();
    if rng.one_in(2) {
        let mut keys: Vec<&str> = config.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.extend(HF_KEYS);
        let keys: Vec<String> = keys.into_iter().map(str::to_string).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        mutate_json(rng, &mut config, &keys);
    } else {
        mutate_bytes(rng, &mut weights);
    }
    Folder { config: serde_json::to_vec(&config).unwrap(), weights }
}

fn write_folder(dir: &Path, folder: &Folder) {
    std::fs::write(dir.join("config.json"), &folder.config).unwrap();
    std::fs::write(dir.join("model.safetensors"), &folder.weights).unwrap();
}

#[test]
fn damaged_safetensors_folders_fail_to_load_without_panicking() {
    let valid = safetensors_bytes();
    let dir = tempfile::tempdir().unwrap();
    let undamaged = Folder { config: serde_json::to_vec(&hf_config()).unwrap(), weights: valid };
    write_folder(dir.path(), &undamaged);
    forward_once(load_safetensors(dir.path()).expect("the undamaged folder loads").as_ref());
    spindle_fuzz::run(
        "safetensors",
        CI_CASES,
        |rng| damaged_folder(rng, &undamaged.weights),
        |folder| {
            write_folder(dir.path(), folder);
            match load_safetensors(dir.path()) {
                Ok(model) => forward_once(model.as_ref()),
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        },
    );
}

/// A damaged `config.json` beside the weights of the tiny hybrid (Qwen3.5: linear and full
/// attention layers) fixture, whose config has the most fields a loader reads sizes from.
#[test]
fn damaged_hybrid_configs_fail_to_load_without_panicking() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let mut keys = Vec::new();
    collect_keys(&config, &mut keys);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    spindle_fuzz::run(
        "hybrid config",
        HYBRID_CI_CASES,
        |rng| {
            let mut damaged = config.clone();
            mutate_json(rng, &mut damaged, &keys);
            serde_json::to_vec(&damaged).unwrap()
        },
        |config| {
            std::fs::write(dir.path().join("config.json"), config).unwrap();
            match load_safetensors(dir.path()) {
                Ok(model) => forward_once(model.as_ref()),
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        },
    );
}

/// Every key of `value`, nested ones included.
fn collect_keys(value: &serde_json::Value, keys: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => map.iter().for_each(|(key, value)| {
            keys.push(key.clone());
            collect_keys(value, keys);
        }),
        serde_json::Value::Array(items) => items.iter().for_each(|item| collect_keys(item, keys)),
        _ => {}
    }
}
