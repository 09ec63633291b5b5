#!/usr/bin/env python3
"""Reference fixtures for the hybrid (Gated DeltaNet + gated attention) Qwen architectures.

For each architecture that transformers ships -- Qwen3.5-MoE (`qwen3_5_moe_text`), Qwen3.5 dense
(`qwen3_5_text`) and Qwen3-Next (`qwen3_next`) -- this builds a tiny model with transformers' own
modeling code, overwrites every parameter with seeded random values, runs it on CPU in float32
with eager attention (the torch fallbacks, no fla / causal-conv1d kernels), and writes

    tests/data/hybrid/<name>/config.json        transformers' config (save_pretrained)
    tests/data/hybrid/<name>/model.safetensors  transformers' checkpoint (save_pretrained), f32
    tests/data/hybrid/<name>/model.gguf         the same weights as llama.cpp's converter writes them, F32
    tests/data/hybrid/<name>/fixture.json       prompts, logits, greedy decode, recurrent state checksums

Besides transformers, the script checks the GGUF file with an independent forward pass written
here (`gguf_forward`, float64, llama.cpp's semantics: tiled V heads, -exp(A), +1 norms, ...),
so every GGUF transformation listed in README.md is exercised, not just written down.

Usage: /tmp/tfenv/bin/python scripts/reference/hybrid/make_hybrid_fixtures.py [--out DIR] [name ...]
Needs: pip install torch transformers gguf safetensors   (CPU only; ~1 min on 2 cores)
Deterministic: running it twice gives byte-identical files.
"""

import argparse
import hashlib
import importlib.metadata
import json
import math
import pathlib
import platform
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import gguf
import transformers
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from add_mtp_head import add_head  # noqa: E402
from fixture_json import dumps  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEFAULT_OUT = ROOT / "tests/data/hybrid"

# ---------------------------------------------------------------------------------------------
# Tiny configurations
# ---------------------------------------------------------------------------------------------

VOCAB = 512
ENDOFTEXT = 509  # "<|endoftext|>": pad and bos
IM_START = 510  # "<|im_start|>"
IM_END = 511  # "<|im_end|>": eos
PROMPT_LENGTHS = [5, 17, 80]  # 80 > 64 = chunk size of torch_chunk_gated_delta_rule
STEPS = 16
CHUNK_SIZE = 64  # default `chunk_size` of torch_chunk_gated_delta_rule; the models never override it
STATE_PROMPT = 2  # the prompt whose layer-0 states are written out in full
SPLIT_AT = 48  # the long prompt is also prefilled as 48 + 32 tokens through the cache
LOGIT_SCALE = 3.0  # std of the logits (lm_head init scale), keeps top-1/top-2 margins mostly > 0.05
ROUTER_MIN_GAP = 1e-3  # weight draws with a closer k-th/(k+1)-th router logit are rejected
LOGIT_MIN_GAP = 2e-3  # ... and so are draws with a closer top-1/top-2 logit on any prompt position

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=8,  # full_attention_interval 4: L L L F L L L F
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # 2 value heads per key head: exercises the GQA-style repeat
    pad_token_id=ENDOFTEXT,
    bos_token_id=ENDOFTEXT,
    eos_token_id=IM_END,
)
MROPE = dict(mrope_section=[2, 1, 1], mrope_interleaved=True)  # sums to rotary_dim / 2 = 4
ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)  # 8 of 32 dims rotate
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32)

SPECS = {
    "qwen3_5_moe": dict(
        seed=1,
        config_cls=Qwen3_5MoeTextConfig,
        model_cls=Qwen3_5MoeForCausalLM,
        gguf_arch=gguf.MODEL_ARCH.QWEN35MOE,
        config=dict(**MOE, tie_word_embeddings=False, rope_parameters=dict(**ROPE, **MROPE)),
    ),
    "qwen3_5": dict(
        seed=2,
        config_cls=Qwen3_5TextConfig,
        model_cls=Qwen3_5ForCausalLM,
        gguf_arch=gguf.MODEL_ARCH.QWEN35,
        # tied like the small Qwen3.5 checkpoints: no lm_head / output.weight in the files
        config=dict(intermediate_size=128, tie_word_embeddings=True, rope_parameters=dict(**ROPE, **MROPE)),
    ),
    "qwen3_next": dict(
        seed=3,
        config_cls=Qwen3NextConfig,
        model_cls=Qwen3NextForCausalLM,
        gguf_arch=gguf.MODEL_ARCH.QWEN3NEXT,
        config=dict(**MOE, intermediate_size=96, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                    tie_word_embeddings=False, rope_parameters=dict(ROPE)),
    ),
}

GDN_FUNCS = ["causal_conv1d_fn", "causal_conv1d_update", "torch_chunk_gated_delta_rule",
             "torch_recurrent_gated_delta_rule"]


def versions():
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "safetensors": importlib.metadata.version("safetensors"),
        "numpy": np.__version__,
    }


# ---------------------------------------------------------------------------------------------
# Seeded weights
# ---------------------------------------------------------------------------------------------

def randomize(model, seed):
    """Overwrites every parameter with `base + noise` from one seeded generator, in name order.

    transformers' _init_weights leaves norms at 0 (zero-centred RMSNorm) or 1 (gated norm),
    dt_bias at 1 and draws A_log in log U(0.01, 16); each of those gets noise here so that a
    wrong offset, a missing exp or a swapped head shows up in the logits."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    hidden = cfg.hidden_size
    tied = cfg.tie_word_embeddings

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64).mul(std).add(mean).float()

    rules = []
    for name, p in sorted(model.named_parameters()):  # tied lm_head appears once, as embed_tokens
        shape = tuple(p.shape)
        if name.endswith("embed_tokens.weight"):
            # tied: the embedding is also the LM head, so give it the LM head's scale
            value, rule = normal(shape, LOGIT_SCALE / math.sqrt(hidden) if tied else 1.0), "embedding"
        elif name == "lm_head.weight":
            value, rule = normal(shape, LOGIT_SCALE / math.sqrt(hidden)), "lm_head"
        elif name.endswith("linear_attn.norm.weight"):
            value, rule = normal(shape, 0.2, mean=1.0), "gated norm (plain weight): 1 + N(0, 0.2)"
        elif name.endswith("norm.weight"):
            value, rule = normal(shape, 0.2), "zero-centred RMSNorm: N(0, 0.2), used as 1 + w"
        elif name.endswith("linear_attn.A_log"):
            a = torch.rand(shape, generator=gen, dtype=torch.float64) * (math.log(1.5) - math.log(0.02)) + math.log(0.02)
            value, rule = a.float(), "A_log: log U(0.02, 1.5)"
        elif name.endswith("linear_attn.dt_bias"):
            value, rule = normal(shape, 0.5, mean=0.5), "dt_bias: N(0.5, 0.5)"
        elif name.endswith("conv1d.weight"):
            value, rule = normal(shape, 0.5), "conv1d: N(0, 0.5)"
        elif name.endswith("mlp.gate.weight"):
            value, rule = normal(shape, 2.0 / math.sqrt(hidden)), "router: N(0, 2/sqrt(H))"
        elif name.endswith("shared_expert_gate.weight"):
            value, rule = normal(shape, 2.0 / math.sqrt(hidden)), "shared expert gate: N(0, 2/sqrt(H))"
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            value, rule = normal(shape, 1.0 / math.sqrt(shape[-1])), "experts: N(0, 1/sqrt(fan_in))"
        elif name.endswith(".weight") and p.dim() == 2:
            value, rule = normal(shape, 1.0 / math.sqrt(shape[-1])), "linear: N(0, 1/sqrt(fan_in))"
        elif name.endswith(".bias"):
            value, rule = normal(shape, 0.1), "bias: N(0, 0.1)"
        else:
            raise SystemExit(f"no randomization rule for parameter {name} {shape}")
        with torch.no_grad():
            p.copy_(value)
        rules.append((name, rule))
    return rules


# ---------------------------------------------------------------------------------------------
# Running transformers
# ---------------------------------------------------------------------------------------------

class PathCounter:
    """Counts calls to the Gated DeltaNet fallbacks, to record which one prefill and decode use."""

    def __init__(self, model):
        self.counts = dict.fromkeys(GDN_FUNCS, 0)
        modules = {sys.modules[type(m).forward.__module__] for m in model.modules() if hasattr(m, "A_log")}
        self.patched = []
        for mod in modules:
            for fname in GDN_FUNCS:
                orig = getattr(mod, fname)
                self.patched.append((mod, fname, orig))
                setattr(mod, fname, self._wrap(fname, orig))

    def _wrap(self, fname, orig):
        def wrapper(*args, **kwargs):
            self.counts[fname] += 1
            return orig(*args, **kwargs)
        return wrapper

    def take(self):
        used = {k: v for k, v in self.counts.items() if v}
        self.counts = dict.fromkeys(GDN_FUNCS, 0)
        return used

    def restore(self):
        for mod, fname, orig in self.patched:
            setattr(mod, fname, orig)


class RouterProbe:
    """Records the smallest gap between the k-th and (k+1)-th router logit (softmax keeps the
    order), so that a reimplementation cannot pick different experts through rounding."""

    def __init__(self, model):
        self.min_gap = math.inf
        self.hooks = []
        for name, m in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(m, "top_k"):
                self.hooks.append(m.register_forward_hook(self._hook))

    def _hook(self, module, args, output):
        top = torch.topk(output[0].double(), module.top_k + 1, dim=-1).values
        self.min_gap = min(self.min_gap, float((top[:, -2] - top[:, -1]).min()))

    def remove(self):
        for h in self.hooks:
            h.remove()


def rounded(t):
    return [round(float(x), 6) for x in t.reshape(-1).tolist()]


def significant(t):
    """7 significant digits: the recurrent state is small (|x| ~ 1e-2), so absolute rounding would lose it."""
    return [float(f"{float(x):.7g}") for x in t.reshape(-1).tolist()]


def top2_gap(logits):
    v = torch.topk(logits.double(), 2).values
    return float(v[0] - v[1])


def checksum(t):
    """sum, abs_sum and weighted = sum_i x[i] * ((i % 7) + 1), i the row-major index (batch dim dropped)."""
    flat = t.reshape(-1).double()
    w = (torch.arange(flat.numel(), dtype=torch.float64) % 7) + 1
    values = {"sum": flat.sum(), "abs_sum": flat.abs().sum(), "weighted": (flat * w).sum()}
    return {k: float(f"{float(v):.9g}") for k, v in values.items()}


@torch.no_grad()
def run_prompt(model, ids, counter):
    """Prefill with a cache, then STEPS-1 single-token greedy decode steps."""
    counter.take()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    prefill_paths = counter.take()
    past = out.past_key_values
    all_logits = out.logits[0]
    state = {}
    for i, kind in enumerate(model.config.layer_types):
        if kind == "linear_attention":
            conv = past.get_conv_state(i)[0].clone()
            rec = past.get_recurrent_state(i)[0].clone()
            state[i] = (conv, rec)
    logits = all_logits[-1]
    step_logits, greedy = [], []
    decode_paths = {}
    for step in range(STEPS):
        tok = int(torch.argmax(logits))
        step_logits.append(logits.clone())
        greedy.append(tok)
        if step == STEPS - 1:
            break
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        for k, v in counter.take().items():
            decode_paths[k] = decode_paths.get(k, 0) + v
        logits = out.logits[0, -1]
    # the same positions, recomputed in one no-cache forward (chunked rule everywhere)
    full = model(input_ids=torch.tensor([ids + greedy[:-1]]), use_cache=False).logits[0, len(ids) - 1:]
    counter.take()
    diff = float((full - torch.stack(step_logits)).abs().max())
    # the prompt prefilled in two pieces through the cache, as when resuming from a snapshot:
    # the second piece runs the chunked rule from the cached state and the conv window
    split = None
    if len(ids) > SPLIT_AT:
        out = model(input_ids=torch.tensor([ids[:SPLIT_AT]]), use_cache=True)
        out = model(input_ids=torch.tensor([ids[SPLIT_AT:]]), past_key_values=out.past_key_values, use_cache=True)
        split_paths = counter.take()
        rest = out.logits[0]
        split = {"split_at": SPLIT_AT, "paths": split_paths,
                 "max_abs_diff_vs_single_prefill": float(f"{float((rest - all_logits[SPLIT_AT:]).abs().max()):.3g}"),
                 "last_logits": rounded(rest[-1])}
    return all_logits, step_logits, greedy, state, prefill_paths, decode_paths, diff, split


# ---------------------------------------------------------------------------------------------
# GGUF export (llama.cpp convert_hf_to_gguf semantics) and an independent GGUF forward pass
# ---------------------------------------------------------------------------------------------

def reorder_v_heads(t, dim, n_k, n_v_per_k, head_dim):
    """llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads: V heads grouped by K head
    [G0v0, G0v1, G1v0, G1v1] -> tiled [G0v0, G1v0, G0v1, G1v1] along `dim`."""
    shape = list(t.shape)
    dim = dim % len(shape)
    t = t.reshape(*shape[:dim], n_k, n_v_per_k, head_dim, *shape[dim + 1:])
    perm = list(range(t.dim()))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return t.permute(*perm).contiguous().reshape(*shape)


def gguf_tensors(model, arch):
    """Yields (gguf_name, f32 numpy array) exactly as llama.cpp's converter would for this model."""
    cfg = model.config
    tmap = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    reorder = arch in (gguf.MODEL_ARCH.QWEN35, gguf.MODEL_ARCH.QWEN35MOE) and nk != nv
    r = nv // nk
    out = []

    def emit(hf_name, t):
        name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise SystemExit(f"cannot map {hf_name} for {arch.name}")
        out.append((name, t.detach().float().contiguous().numpy()))

    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: llama.cpp reuses token_embd
        t = t.detach().clone()
        # 1. Qwen3.5: V heads from grouped to tiled order (before everything else, as llama.cpp)
        if reorder and "linear_attn." in name:
            if ".in_proj_qkv." in name:
                qk = nk * dk * 2
                t = torch.cat([t[:qk], reorder_v_heads(t[qk:], 0, nk, r, dv)], 0)
            elif ".in_proj_z." in name:
                t = reorder_v_heads(t, 0, nk, r, dv)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                t = reorder_v_heads(t, 0, nk, r, 1)
            elif name.endswith(".A_log") or name.endswith(".dt_bias"):
                t = reorder_v_heads(t.unsqueeze(-1), 0, nk, r, 1).squeeze(-1)
            elif ".conv1d." in name:
                t = t.squeeze()
                qk = nk * dk * 2
                t = torch.cat([t[:qk], reorder_v_heads(t[qk:], 0, nk, r, dv)], 0)
            elif ".out_proj." in name:
                t = reorder_v_heads(t, 1, nk, r, dv)
        # 2. Qwen3NextModel.modify_tensors
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        elif name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if "in_proj_qkvz.weight" in name:
            # [q, k, v, z] per key head -> [q all heads; k all heads; v all heads] and z
            split = [dk, dk, r * dv, r * dv]
            w = t.permute(1, 0).reshape(-1, nk, sum(split))
            q, k, v, z = torch.split(w, split, dim=-1)
            hidden = cfg.hidden_size
            qkv = torch.cat([x.reshape(hidden, -1) for x in (q, k, v)], -1).permute(1, 0)
            emit(name.replace("in_proj_qkvz", "in_proj_qkv"), qkv)  # -> blk.N.attn_qkv.weight
            emit(name.replace("in_proj_qkvz", "in_proj_z"), z.reshape(hidden, -1).permute(1, 0))  # attn_gate
            continue
        # 3. fused experts [E, 2I, H] -> gate [E, I, H] (first half) and up [E, I, H] (second half)
        if name.endswith("mlp.experts.gate_up_proj"):
            n_ff = t.shape[1] // 2
            base = name[: -len(".gate_up_proj")]
            emit(base + ".gate_proj.weight", t[:, :n_ff])
            emit(base + ".up_proj.weight", t[:, n_ff:])
            continue
        if name.endswith("mlp.experts.down_proj"):
            emit(name + ".weight", t)
            continue
        emit(name, t)
    return out


def byte_level_vocab():
    """A small real byte-level BPE vocabulary (256 byte tokens, 253 merges, 3 specials), only so the
    GGUF carries complete tokenizer metadata; the fixtures use raw token ids."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_char = dict(zip(bs, (chr(c) for c in cs)))
    tokens = [byte_char[b] for b in range(256)]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    space = byte_char[ord(" ")]
    merges = [(space, c) for c in letters] + [(a, b) for a in letters for b in letters]
    merges = merges[: ENDOFTEXT - 256]
    tokens += [a + b for a, b in merges]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * ENDOFTEXT + [gguf.TokenType.CONTROL] * 3
    assert len(tokens) == VOCAB and len(set(tokens)) == VOCAB
    return tokens, types, [f"{a} {b}" for a, b in merges]


def write_gguf(model, name, arch, path):
    cfg = model.config
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    w = gguf.GGUFWriter(str(path), arch_name)
    w.add_type("model")
    w.add_name(f"spindle-tiny-{name}")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    if getattr(cfg, "intermediate_size", None) is not None and arch != gguf.MODEL_ARCH.QWEN35MOE:
        w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters
    if "mrope_section" in rope:
        w.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch != gguf.MODEL_ARCH.QWEN35:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    # llama.cpp b11434 writes the layer pattern explicitly (and keeps the interval as a fallback)
    w.add_array(f"{arch_name}.attention.recurrent_layers", [t == "linear_attention" for t in cfg.layer_types])
    w.add_full_attention_interval(4)
    w.add_rope_dimension_count(int(cfg.head_dim * rope["partial_rotary_factor"]))
    tokens, types, merges = byte_level_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ENDOFTEXT)
    w.add_eos_token_id(IM_END)
    w.add_pad_token_id(ENDOFTEXT)
    w.add_add_bos_token(False)
    names = []
    for tname, arr in gguf_tensors(model, arch):
        assert arr.dtype == np.float32
        w.add_tensor(tname, arr)
        names.append((tname, list(arr.shape), list(reversed(arr.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def read_gguf(path):
    reader = gguf.GGUFReader(str(path))
    meta = {}
    for field in reader.fields.values():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        meta[field.name] = field.contents()
    tensors = {}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]  # ggml ne is reversed numpy order
        tensors[t.name] = torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(shape)).double()
    return meta, tensors


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@torch.no_grad()
def gguf_forward(path, ids):
    """Logits for every position of `ids`, from the GGUF file alone, in float64, token by token for
    the linear-attention layers (the plain recurrence, no chunking) -- llama.cpp's reading of the
    tensors: norms already +1, ssm_a = -exp(A_log), Qwen3.5 V heads tiled (v head j uses k head
    j % n_k), Qwen3-Next V heads grouped (v head j uses k head j // (n_v / n_k))."""
    meta, T = read_gguf(path)
    arch = meta["general.architecture"]
    key = lambda k: meta[f"{arch}.{k}"]
    n_layer, hidden = key("block_count"), key("embedding_length")
    n_head, n_kv, hd = key("attention.head_count"), key("attention.head_count_kv"), key("attention.key_length")
    eps, n_rot, theta = key("attention.layer_norm_rms_epsilon"), key("rope.dimension_count"), key("rope.freq_base")
    interval, kconv = key("full_attention_interval"), key("ssm.conv_kernel")
    dk, nk, nv = key("ssm.state_size"), key("ssm.group_count"), key("ssm.time_step_rank")
    dv = key("ssm.inner_size") // nv
    r = nv // nk
    tiled = arch in ("qwen35", "qwen35moe")
    n = len(ids)
    x = T["token_embd.weight"][torch.tensor(ids)]
    pos = torch.arange(n, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot))
    ang = pos[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)

    def rope(t):  # t: [n, heads, hd]; NEOX halves on the first n_rot dims
        rot, rest = t[..., :n_rot], t[..., n_rot:]
        half = n_rot // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], -1)
        return torch.cat([rot * cos[:, None] + rotated * sin[:, None], rest], -1)

    def l2(t):
        return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)

    for il in range(n_layer):
        p = lambda s: T[f"blk.{il}.{s}"]
        h = rms(x, p("attn_norm.weight"), eps)
        if (il + 1) % interval != 0:  # Gated DeltaNet
            qkv = h @ p("attn_qkv.weight").T  # [n, 2*nk*dk + nv*dv]
            z = (h @ p("attn_gate.weight").T).reshape(n, nv, dv)
            if tiled:
                b, a = h @ p("ssm_beta.weight").T, h @ p("ssm_alpha.weight").T
            else:
                ba = (h @ p("ssm_ba.weight").T).reshape(n, nk, 2 * r)
                b, a = ba[..., :r].reshape(n, nv), ba[..., r:].reshape(n, nv)
            wconv = p("ssm_conv1d.weight")  # [channels, kconv]
            padded = torch.cat([torch.zeros(kconv - 1, qkv.shape[1], dtype=qkv.dtype), qkv], 0)
            conv = sum(padded[j:j + n] * wconv[:, j] for j in range(kconv))
            conv = F.silu(conv)
            q = l2(conv[:, : nk * dk].reshape(n, nk, dk))
            k = l2(conv[:, nk * dk: 2 * nk * dk].reshape(n, nk, dk))
            v = conv[:, 2 * nk * dk:].reshape(n, nv, dv)
            kh = [(j % nk) if tiled else (j // r) for j in range(nv)]
            q, k = q[:, kh], k[:, kh]
            q = q / math.sqrt(dk)
            beta = torch.sigmoid(b)
            g = p("ssm_a") * F.softplus(a + p("ssm_dt.bias"))
            S = torch.zeros(nv, dk, dv, dtype=torch.float64)
            outs = []
            for t in range(n):
                S = S * torch.exp(g[t])[:, None, None]
                kv_mem = (S * k[t][:, :, None]).sum(1)
                delta = (v[t] - kv_mem) * beta[t][:, None]
                S = S + k[t][:, :, None] * delta[:, None, :]
                outs.append((S * q[t][:, :, None]).sum(1))
            o = torch.stack(outs)  # [n, nv, dv]
            o = rms(o, p("ssm_norm.weight"), eps) * F.silu(z)
            x = x + o.reshape(n, nv * dv) @ p("ssm_out.weight").T
        else:  # gated full attention
            qg = (h @ p("attn_q.weight").T).reshape(n, n_head, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(n, n_head * hd)
            k = (h @ p("attn_k.weight").T).reshape(n, n_kv, hd)
            v = (h @ p("attn_v.weight").T).reshape(n, n_kv, hd)
            q, k = rope(rms(q, p("attn_q_norm.weight"), eps)), rope(rms(k, p("attn_k_norm.weight"), eps))
            kvh = torch.arange(n_head) // (n_head // n_kv)
            scores = torch.einsum("qhd,khd->hqk", q, k[:, kvh]) / math.sqrt(hd)
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            att = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v[:, kvh]).reshape(n, n_head * hd)
            x = x + (att * torch.sigmoid(gate)) @ p("attn_output.weight").T
        h = rms(x, p("post_attention_norm.weight"), eps)
        if f"blk.{il}.ffn_gate_inp.weight" in T:
            probs = torch.softmax(h @ p("ffn_gate_inp.weight").T, -1)
            top_w, top_i = torch.topk(probs, key("expert_used_count"), -1)
            top_w = top_w / top_w.sum(-1, keepdim=True)
            moe = torch.zeros_like(h)
            for t in range(n):
                for wgt, e in zip(top_w[t], top_i[t]):
                    y = F.silu(p("ffn_gate_exps.weight")[e] @ h[t]) * (p("ffn_up_exps.weight")[e] @ h[t])
                    moe[t] += wgt * (p("ffn_down_exps.weight")[e] @ y)
            shared = (F.silu(h @ p("ffn_gate_shexp.weight").T) * (h @ p("ffn_up_shexp.weight").T)) @ p("ffn_down_shexp.weight").T
            shared = shared * torch.sigmoid(h @ p("ffn_gate_inp_shexp.weight").reshape(-1))[:, None]
            x = x + moe + shared
        else:
            x = x + (F.silu(h @ p("ffn_gate.weight").T) * (h @ p("ffn_up.weight").T)) @ p("ffn_down.weight").T
    x = rms(x, T["output_norm.weight"], eps)
    head = T.get("output.weight", T["token_embd.weight"])
    return x @ head.T


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def well_conditioned(model, prompts):
    """Router and logit margins of one candidate weight draw, over every position of each prompt
    and its greedy continuation (no cache)."""
    probe = RouterProbe(model)
    gaps = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(STEPS - 1):
                seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
            logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
            gaps += [top2_gap(lg) for lg in logits]
    probe.remove()
    return probe.min_gap, min(gaps), sum(g < 0.05 for g in gaps) / len(gaps)


def build(name, out_root):
    spec = SPECS[name]
    gen = torch.Generator().manual_seed(spec["seed"])
    prompts = [torch.randint(0, ENDOFTEXT, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    # Draw weights until no routing decision is a near-tie (the k-th and (k+1)-th router
    # logits at least ROUTER_MIN_GAP apart) and the logits have clear margins.
    for attempt in range(100):
        torch.manual_seed(spec["seed"])  # transformers' own init draws from the global generator
        cfg = spec["config_cls"](**COMMON, **spec["config"])
        cfg._attn_implementation = "eager"
        if hasattr(cfg, "num_experts"):
            cfg._experts_implementation = "eager"
        model = spec["model_cls"](cfg).eval()
        randomize_seed = 1000 * spec["seed"] + attempt
        rules = randomize(model, randomize_seed)
        router_gap, min_gap, frac_small = well_conditioned(model, prompts)
        if router_gap >= ROUTER_MIN_GAP and min_gap >= LOGIT_MIN_GAP and frac_small <= 0.1:
            break
    else:
        raise SystemExit(f"{name}: no well-conditioned weights in 100 draws")
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for fname in ("config.json", "model.safetensors"):
            (out / fname).write_bytes((pathlib.Path(tmp) / fname).read_bytes())
    # from here on, run the model exactly as a user would load it from the saved files
    # eager attention and the eager per-expert loop (not torch._grouped_mm): the plainest paths
    extra = {"experts_implementation": "eager"} if hasattr(cfg, "num_experts") else {}
    model = spec["model_cls"].from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager", **extra).eval()
    assert model.config._attn_implementation == "eager"
    assert not extra or model.config._experts_implementation == "eager"
    gguf_names = write_gguf(model, name, spec["gguf_arch"], out / "model.gguf")

    counter = PathCounter(model)
    probe = RouterProbe(model)
    results, paths = [], {}
    all_gaps = []
    state_full = None
    gguf_diff = 0.0
    for pi, ids in enumerate(prompts):
        all_logits, step_logits, greedy, state, pre, dec, diff, split = run_prompt(model, ids, counter)
        paths = {"prefill": pre, "decode_15_steps": dec}
        gaps = [top2_gap(lg) for lg in step_logits]
        pos_gaps = [top2_gap(lg) for lg in all_logits]
        all_gaps += gaps + pos_gaps
        linear_state = []
        for il, (conv, rec) in state.items():
            linear_state.append({
                "layer": il,
                "conv_state_shape": list(conv.shape),
                "conv_state": checksum(conv),
                "conv_state_last_k_minus_1": checksum(conv[:, 1:]),
                "recurrent_state_shape": list(rec.shape),
                "recurrent_state": checksum(rec),
                "recurrent_state_per_head_sum": [float(f"{float(x):.9g}") for x in rec.double().sum((1, 2))],
            })
            if pi == STATE_PROMPT and state_full is None:
                state_full = {"prompt": pi, "layer": il,
                              "conv_state_shape": list(conv.shape), "conv_state": significant(conv),
                              "recurrent_state_shape": list(rec.shape), "recurrent_state": significant(rec)}
        # independent check of the GGUF file: every position of prompt + generated tokens
        seq = ids + greedy[:-1]
        ref = gguf_forward(out / "model.gguf", seq).float()
        tf_all = torch.cat([all_logits[:-1], torch.stack(step_logits)], 0)
        gguf_diff = max(gguf_diff, float((ref - tf_all).abs().max()))
        assert [int(i) for i in ref[len(ids) - 1:].argmax(-1)] == greedy, f"{name}: GGUF forward disagrees on greedy ids"
        entry = {
            "ids": ids,
            "last_logits": rounded(all_logits[-1]),
            "position_argmax": [int(i) for i in all_logits.argmax(-1)],
            "position_max_logit": [round(float(v), 6) for v in all_logits.max(-1).values],
            "position_top2_gap": [round(g, 6) for g in pos_gaps],
            "greedy_ids": greedy,
            "step_top2_gap": [round(g, 6) for g in gaps],
            "step_logits": [rounded(lg) for lg in step_logits],
            "cached_decode_vs_full_forward_max_abs_diff": float(f"{diff:.3g}"),
            "linear_state_after_prefill": linear_state,
        }
        if split is not None:
            entry["split_prefill"] = split
        if pi == 0:
            entry["position_logits"] = [rounded(lg) for lg in all_logits]
        results.append(entry)
    counter.restore()
    probe.remove()

    c = model.config
    fixture = {
        "model": name,
        "hf_model_type": c.model_type,
        "hf_architecture": type(model).__name__,
        "gguf_architecture": gguf.MODEL_ARCH_NAMES[spec["gguf_arch"]],
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, "
                     f"eager attention, CPU, torch fallbacks for the Gated DeltaNet",
        "versions": versions(),
        "seeds": {"transformers_init": spec["seed"], "randomize": randomize_seed, "prompts": spec["seed"],
                  "draws_rejected": attempt},
        "config": {
            "layer_types": c.layer_types,
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "rotary_dim": int(c.head_dim * c.rope_parameters["partial_rotary_factor"]),
            "rope_parameters": c.rope_parameters,
            "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
            "linear_num_key_heads": c.linear_num_key_heads, "linear_num_value_heads": c.linear_num_value_heads,
            "linear_key_head_dim": c.linear_key_head_dim, "linear_value_head_dim": c.linear_value_head_dim,
            "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": c.tie_word_embeddings,
            **({"num_experts": c.num_experts, "num_experts_per_tok": c.num_experts_per_tok,
                "moe_intermediate_size": c.moe_intermediate_size,
                "shared_expert_intermediate_size": c.shared_expert_intermediate_size,
                "norm_topk_prob": getattr(c, "norm_topk_prob", True)} if hasattr(c, "num_experts") else
               {"intermediate_size": c.intermediate_size}),
            "pad_token_id": c.pad_token_id, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        },
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None) if hasattr(c, "num_experts") else None,
        "chunk_size": CHUNK_SIZE,
        "gdn_paths": paths,
        "files": {f: {"bytes": (out / f).stat().st_size, "sha256": sha256(out / f)}
                  for f in ("config.json", "model.safetensors", "model.gguf")},
        "gguf_tensors": [[n, s, ne] for n, s, ne in gguf_names],
        "checks": {
            "min_top2_gap": round(min(all_gaps), 6),
            "fraction_top2_gap_below_0.05": round(sum(g < 0.05 for g in all_gaps) / len(all_gaps), 4),
            "router_min_logit_gap_kth_vs_next": None if probe.min_gap == math.inf else float(f"{probe.min_gap:.3g}"),
            "gguf_forward_max_abs_diff": float(f"{gguf_diff:.3g}"),
        },
        "state_after_prefill_full": state_full,
        "prompts": results,
        "randomization": [[n, r] for n, r in rules if ".layers." not in n or ".layers.0." in n or ".layers.3." in n],
    }
    (out / "fixture.json").write_text(dumps(fixture) + "\n")
    ck = fixture["checks"]
    add_head(out, name)  # last: it appends the MTP head's tensors and records its reference
    print(f"{name}: greedy {[r['greedy_ids'][:6] for r in results]}, min gap {ck['min_top2_gap']:.4f} "
          f"(<0.05: {ck['fraction_top2_gap_below_0.05']}), router gap {ck['router_min_logit_gap_kth_vs_next']}, "
          f"gguf diff {ck['gguf_forward_max_abs_diff']}, decode-vs-full "
          f"{max(r['cached_decode_vs_full_forward_max_abs_diff'] for r in results)}, paths {paths}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("models", nargs="*", default=list(SPECS))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the same reduction order on every machine
    torch.use_deterministic_algorithms(True)
    for name in args.models:
        build(name, args.out)


if __name__ == "__main__":
    main()
