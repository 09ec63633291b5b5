#!/usr/bin/env python3
"""A tiny seeded Llama with YaRN rope scaling (factor 4 over 32 original positions) and its logits
at every position of a 100-token prompt: tests/data/yarn/{config.json, model.safetensors, fixture.json}.

The reference is a numpy transcription of transformers' code, line by line: `_compute_yarn_parameters`
(modeling_rope_utils.py, transformers 5.x), `LlamaRotaryEmbedding.forward` (cos/sin multiplied by the
attention factor, in float32 as torch computes them), and the eager `LlamaModel` forward (RMSNorm,
`rotate_half`, grouped-query attention, SwiGLU). Where torch and transformers are installed, the
written folder is also loaded with `AutoModelForCausalLM` and its inv_freq, attention factor and
logits must agree (the result is recorded in fixture.json as `transformers_check`).

Usage: python make_yarn_fixture.py   (needs: pip install numpy safetensors; optional: torch transformers)
"""

import json
import math
import pathlib

import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/data/yarn"
SEED = 0
PROMPT_LEN = 100

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    # A small base spreads the 16 frequency pairs over YaRN's whole ramp at 32 original positions.
    "rope_theta": 100.0,
    "max_position_embeddings": 128,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def compute_yarn_parameters(config):
    """transformers' `_compute_yarn_parameters`, torch ops replaced by their numpy equivalents."""
    rope = config["rope_scaling"]
    base = config["rope_theta"]
    partial_rotary_factor = config.get("partial_rotary_factor", 1.0)
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    dim = int(head_dim * partial_rotary_factor)

    factor = rope["factor"]
    attention_factor = rope.get("attention_factor")
    mscale = rope.get("mscale")
    mscale_all_dim = rope.get("mscale_all_dim")
    if "original_max_position_embeddings" in rope:
        original_max_position_embeddings = rope["original_max_position_embeddings"]
        factor = config["max_position_embeddings"] / original_max_position_embeddings
    else:
        original_max_position_embeddings = config["max_position_embeddings"]

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate):
        low = find_correction_dim(low_rot, dim, base, max_position_embeddings)
        high = find_correction_dim(high_rot, dim, base, max_position_embeddings)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (np.arange(dim, dtype=np.float32) - min) / (max - min)
        return np.clip(linear_func, 0, 1).astype(np.float32)

    pos_freqs = (base ** (np.arange(0, dim, 2).astype(np.float32) / dim)).astype(np.float32)
    inv_freq_extrapolation = (1.0 / pos_freqs).astype(np.float32)
    inv_freq_interpolation = (1.0 / (factor * pos_freqs)).astype(np.float32)

    truncate = rope.get("truncate", True)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_extrapolation_factor = (1 - linear_ramp_factor(low, high, dim // 2)).astype(np.float32)
    inv_freq = (
        inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
        + inv_freq_extrapolation * inv_freq_extrapolation_factor
    )
    return inv_freq.astype(np.float32), attention_factor


def rotary_cos_sin(inv_freq, attention_scaling, positions):
    """`LlamaRotaryEmbedding.forward`: float32 angles, cos/sin times the attention factor."""
    freqs = (inv_freq[None, :] * positions[:, None].astype(np.float32)).astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * attention_scaling, np.sin(emb) * attention_scaling


def rotate_half(x):
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([-x2, x1], axis=-1)


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x):
    return x / (1 + np.exp(-x))


def forward(cfg, w, ids):
    """Eager `LlamaForCausalLM` forward in float64: logits at every position."""
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inv_freq, scaling = compute_yarn_parameters(cfg)
    cos, sin = rotary_cos_sin(inv_freq, scaling, np.arange(len(ids)))
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    n = len(ids)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i in range(cfg["num_hidden_layers"]):
        p = lambda name: w[f"model.layers.{i}.{name}"].astype(np.float64)
        h = rms_norm(x, p("input_layernorm.weight"), cfg["rms_norm_eps"])
        q = (h @ p("self_attn.q_proj.weight").T).reshape(n, heads, hd).transpose(1, 0, 2)
        k = (h @ p("self_attn.k_proj.weight").T).reshape(n, kv_heads, hd).transpose(1, 0, 2)
        v = (h @ p("self_attn.v_proj.weight").T).reshape(n, kv_heads, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, heads // kv_heads, axis=0)
        v = np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) * hd**-0.5 + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v
        x = x + attn.transpose(1, 0, 2).reshape(n, heads * hd) @ p("self_attn.o_proj.weight").T
        h = rms_norm(x, p("post_attention_layernorm.weight"), cfg["rms_norm_eps"])
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (silu(gate) * up) @ p("mlp.down_proj.weight").T
    x = rms_norm(x, w["model.norm.weight"].astype(np.float64), cfg["rms_norm_eps"])
    return x @ w["lm_head.weight"].astype(np.float64).T


def random_weights(cfg, rng):
    hidden, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out, kv_out = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    linear = lambda rows, cols: rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
    norm = lambda: (1 + rng.normal(0, 0.1, hidden)).astype(np.float32)
    w = {"model.embed_tokens.weight": rng.normal(0, 1, (cfg["vocab_size"], hidden)).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}"
        w[f"{b}.input_layernorm.weight"] = norm()
        w[f"{b}.self_attn.q_proj.weight"] = linear(q_out, hidden)
        w[f"{b}.self_attn.k_proj.weight"] = linear(kv_out, hidden)
        w[f"{b}.self_attn.v_proj.weight"] = linear(kv_out, hidden)
        w[f"{b}.self_attn.o_proj.weight"] = linear(hidden, q_out)
        w[f"{b}.post_attention_layernorm.weight"] = norm()
        w[f"{b}.mlp.gate_proj.weight"] = linear(inter, hidden)
        w[f"{b}.mlp.up_proj.weight"] = linear(inter, hidden)
        w[f"{b}.mlp.down_proj.weight"] = linear(hidden, inter)
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = (linear(cfg["vocab_size"], hidden) * 4).astype(np.float32)
    return w


def check_with_transformers(inv_freq, attention_factor, ids, logits):
    """The same folder through transformers itself; None when it is not installed."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(str(OUT), dtype=torch.float32, attn_implementation="eager").eval()
    rotary = model.model.rotary_emb
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids.tolist()])).logits[0].double().numpy()
    check = {
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "inv_freq_max_abs_diff": float(np.abs(rotary.inv_freq.numpy() - inv_freq).max()),
        "attention_factor": float(rotary.attention_scaling),
        "logits_max_abs_diff": float(np.abs(theirs - logits).max()),
    }
    assert check["attention_factor"] == attention_factor and check["logits_max_abs_diff"] < 1e-4, check
    return check


def main():
    rng = np.random.default_rng(SEED)
    weights = random_weights(CONFIG, rng)
    ids = rng.integers(0, CONFIG["vocab_size"], PROMPT_LEN)
    logits = forward(CONFIG, weights, ids)
    inv_freq, attention_factor = compute_yarn_parameters(CONFIG)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    save_file(weights, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    fixture = {
        "reference": f"numpy {np.__version__} transcription of transformers 5.x (_compute_yarn_parameters, "
        "LlamaRotaryEmbedding, eager LlamaModel), float64 with float32 rotary tables",
        "seed": SEED,
        "inv_freq": [float(f) for f in inv_freq],
        "attention_factor": attention_factor,
        "ids": [int(i) for i in ids],
        "position_logits": [[round(float(v), 6) for v in row] for row in logits],
    }
    fixture["transformers_check"] = check_with_transformers(inv_freq, attention_factor, ids, logits)
    print(f"transformers: {fixture['transformers_check']}")
    (OUT / "fixture.json").write_text(json.dumps(fixture) + "\n")
    print(f"attention factor {attention_factor:.6f}; inv_freq {np.array2string(inv_freq, precision=4)}")
    print(f"logit range {logits.min():.2f}..{logits.max():.2f}")


if __name__ == "__main__":
    main()
