//! The safetensors path against llama.cpp: SmolLM2's GGUF is turned into an HF checkpoint
//! (HF tensor names, F16 weights, q/k rows un-permuted back to HF's layout, config.json),
//! loaded through `load_safetensors`, and teacher-forced over llama.cpp's greedy tokens
//! (tests/data/reference/smollm2-135m.json). Dense F16 weights are not llama.cpp's Q4_1 path, so
//! a differing top-1 is accepted only at a near-tie of llama.cpp's own distribution (or where it
//! reported no logprobs), and at least 90% of all steps must agree exactly.

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};

/// GGUF tensor name to the HF checkpoint key (an independent copy of the mapping under test).
fn hf_name(gguf: &str) -> String {
    let table = [
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    ];
    match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => {
            let parts: Vec<&str> = gguf.split('.').collect();
            let hf = table.iter().find(|(g, _)| *g == parts[2]).unwrap_or_else(|| panic!("unmapped {gguf}")).1;
            format!("model.layers.{}.{hf}.{}", parts[1], parts[3])
        }
    }
}

/// Undoes llama.cpp's converter permutation of q/k rows (interleaved rotary → HF halves).
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = w.dims2().unwrap();
    w.reshape((heads, out / heads / 2, 2, inp)).unwrap().transpose(1, 2).unwrap().reshape((out, inp)).unwrap()
}

fn meta_u32(meta: &HashMap<String, Value>, key: &str) -> usize {
    meta[key].to_u32().unwrap() as usize
}

fn write_checkpoint(gguf: &Path, dir: &Path) {
    let mut file = std::fs::File::open(gguf).unwrap();
    let content = Content::read(&mut file).unwrap();
    let meta = &content.metadata;
    let heads = meta_u32(meta, "llama.attention.head_count");
    let kv_heads = meta_u32(meta, "llama.attention.head_count_kv");
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let w = content.tensor(&mut file, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        let w = if name.ends_with("attn_q.weight") {
            unpermute(&w, heads)
        } else if name.ends_with("attn_k.weight") {
            unpermute(&w, kv_heads)
        } else {
            w
        };
        tensors.insert(hf_name(name), w.to_dtype(DType::F16).unwrap());
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let vocab = match &meta["tokenizer.ggml.tokens"] {
        Value::Array(a) => a.len(),
        _ => panic!("no vocabulary"),
    };
    let config = serde_json::json!({
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": meta_u32(meta, "llama.embedding_length"),
        "intermediate_size": meta_u32(meta, "llama.feed_forward_length"),
        "num_hidden_layers": meta_u32(meta, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": meta["llama.attention.layer_norm_rms_epsilon"].to_f32().unwrap(),
        "rope_theta": meta["llama.rope.freq_base"].to_f32().unwrap(),
        "max_position_embeddings": 2048,
        "tie_word_embeddings": true,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn smollm2_as_an_hf_checkpoint_follows_llama_cpp() {
    let fx = common::Fixture::smollm2();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(&fx.gguf, dir.path());
    let model = spindle_models::load_safetensors(dir.path()).unwrap().model;
    fx.assert_follows(model.as_ref(), 0.15, 0.9);
}
