//! The safetensors path against llama.cpp: SmolLM2's GGUF is turned into an HF checkpoint
//! (HF tensor names, F16 weights, q/k rows un-permuted back to HF's layout, config.json),
//! loaded through `load_safetensors`, and teacher-forced over llama.cpp's greedy tokens
//! (tests/data/reference/smollm2-135m.json). Dense F16 weights are not llama.cpp's Q4_1 path, so
//! a differing top-1 is accepted only at a near-tie of llama.cpp's own distribution (or where it
//! reported no logprobs), and at least 90% of all steps must agree exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};

fn home() -> PathBuf {
    std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/spindle"))
}

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

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as u32
}

#[test]
fn smollm2_as_an_hf_checkpoint_follows_llama_cpp() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tests/data/reference/smollm2-135m.json")).unwrap()).unwrap();
    let gguf = home().join("models/smollm2-135m").join(fx["gguf_file"].as_str().unwrap());
    assert!(gguf.is_file(), "{}: run `spindle pull smollm2-135m` first", gguf.display());
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(&gguf, dir.path());
    let model = spindle_models::load_safetensors(dir.path()).unwrap().model;
    let (mut steps, mut agree) = (0, 0);
    for g in fx["generations"].as_array().unwrap() {
        let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let mut cache = model.new_cache(2048);
        let mut logits = model.forward(&ids(&g["prompt_ids"]), &mut cache).unwrap();
        for (step, expected) in ids(&g["greedy_ids"]).into_iter().enumerate() {
            let ours = argmax(&logits);
            steps += 1;
            agree += usize::from(ours == expected);
            let top = &g["top_logprobs"][step];
            if ours != expected && !top.is_null() {
                let lp = |id: u32| top.as_array()?.iter().find(|p| p[0] == id).and_then(|p| p[1].as_f64());
                let gap = lp(expected).zip(lp(ours)).map(|(a, b)| a - b);
                assert!(gap.is_some_and(|g| g <= 0.15), "prompt {:?} step {step}: {ours} vs llama.cpp {expected} (gap {gap:?})", g["prompt"]);
            }
            logits = model.forward(&[expected], &mut cache).unwrap();
        }
    }
    assert!(agree * 10 >= steps * 9, "only {agree} of {steps} steps agree with llama.cpp");
}
