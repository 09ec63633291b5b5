#!/usr/bin/env python3
"""Gives each random-weight hybrid fixture a multi-token-prediction (MTP) head with seeded random
weights, in both checkpoint formats, and records what an independent float64 implementation of the
head computes with it.

The head follows vLLM's `Qwen3NextMultiTokenPredictor` (model_executor/models/qwen3_next_mtp.py;
Qwen3.5 uses the same module): for the target's hidden state h at position p -- the one its LM head
reads, i.e. *after* the final norm, as `Qwen3NextModel.forward` returns it -- and the token t
decided at p+1:

    x   = fc([pre_fc_norm_embedding(embed(t)) ; pre_fc_norm_hidden(h)])   (embedding first)
    x   = decoder_layer(x) at position p          (gated full attention over the head's own keys
                                                   and values, then the checkpoint's MoE / MLP)
    out = norm(x);   logits = lm_head(out)        (embedding and LM head shared with the target)

Every norm is zero-centred (x * (1 + w)). Drafting more tokens feeds `out` back as h, with the
drafted token, at the next position.

Only numpy is needed (no torch): the existing tensors are copied unchanged, the head's are appended,
and running the script again gives the same files. `make_hybrid_fixtures.py` calls it last.
"""

import argparse
import hashlib
import json
import math
import pathlib
import sys

import gguf
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fixture_json import dumps  # noqa: E402

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[3] / "tests" / "data" / "hybrid"
SEEDS = {"qwen3_5_moe": 71, "qwen3_5": 72, "qwen3_next": 73}
ROWS = 6  # positions the recorded head pass runs
CHAIN = 3  # drafts chained from the last row
LOGIT_SCALE = 3.0
# The full-attention layer the head mirrors (its tensor names and shapes).
TEMPLATE_LAYER = 3

# safetensors suffix of a decoder-layer tensor -> GGUF suffix, and whether llama.cpp folds the
# zero-centred norm's +1 into it.
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "self_attn.q_proj.weight": ("attn_q.weight", False),
    "self_attn.k_proj.weight": ("attn_k.weight", False),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", True),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", True),
    "mlp.gate.weight": ("ffn_gate_inp.weight", False),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", False),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", False),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", False),
    "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", False),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
}
# The head's own tensors -> llama.cpp's `nextn` names.
GGUF_HEAD_NAMES = {
    "mtp.fc.weight": ("nextn.eh_proj.weight", False),
    "mtp.pre_fc_norm_embedding.weight": ("nextn.enorm.weight", True),
    "mtp.pre_fc_norm_hidden.weight": ("nextn.hnorm.weight", True),
    "mtp.norm.weight": ("nextn.shared_head_norm.weight", True),
}


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def head_weights(main, hidden, seed):
    """The head's tensors: the template layer's names under `mtp.layers.0.`, plus fc and the three
    norms, drawn in name order from one generator with the fixtures' rules."""
    rng = np.random.default_rng(seed)
    prefix = f"model.layers.{TEMPLATE_LAYER}."
    shapes = {f"mtp.layers.0.{k[len(prefix):]}": v.shape for k, v in main.items() if k.startswith(prefix)}
    shapes["mtp.fc.weight"] = (hidden, 2 * hidden)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        shapes[f"mtp.{norm}.weight"] = (hidden,)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            std = 0.2  # zero-centred: used as 1 + w
        elif name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
            std = 2.0 / math.sqrt(hidden)
        else:
            std = 1.0 / math.sqrt(shape[-1])
        out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def write_safetensors(path, main, head):
    save_file({**main, **head}, str(path), metadata={"format": "pt"})


def gguf_head_tensors(head, layer):
    """The head as llama.cpp's converter writes it: block `layer` (= the target's layer count)."""
    out = []
    for name, value in sorted(head.items()):
        if name in GGUF_HEAD_NAMES:
            suffix, plus_one = GGUF_HEAD_NAMES[name]
        else:
            rest = name[len("mtp.layers.0."):]
            if rest.startswith("mlp.experts."):
                continue  # stacked below
            suffix, plus_one = GGUF_LAYER_NAMES[rest]
        out.append((f"blk.{layer}.{suffix}", value + 1.0 if plus_one else value))
    experts = sorted({int(k.split(".")[5]) for k in head if ".mlp.experts." in k})
    for proj, suffix in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
        if experts:
            stacked = np.stack([head[f"mtp.layers.0.mlp.experts.{e}.{proj}.weight"] for e in experts])
            out.append((f"blk.{layer}.{suffix}.weight", stacked))
    return [(n, np.ascontiguousarray(v, dtype=np.float32)) for n, v in out]


def rewrite_gguf(path, head, n_layer):
    """Copies every key and tensor of the target, then adds the head as llama.cpp does: block_count
    counts it, `{arch}.nextn_predict_layers` = 1, the layer pattern gains a full-attention entry."""
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    fields = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    tensors = [(t.name, np.array(t.data, dtype=np.float32).reshape(list(reversed(t.shape.tolist()))))
               for t in reader.tensors if not t.name.startswith(f"blk.{n_layer}.")]
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    for f in fields:
        name, value = f.name, f.contents()
        if name in ("general.architecture", f"{arch}.nextn_predict_layers"):
            continue
        if name == f"{arch}.block_count":
            value = n_layer + 1
        if name == f"{arch}.attention.recurrent_layers":
            value = list(value[:n_layer]) + [False]
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, value, f.types[0], sub)
        if name == f"{arch}.block_count":
            w.add_key_value(f"{arch}.nextn_predict_layers", 1, gguf.GGUFValueType.UINT32)
    names = []
    for name, arr in tensors + gguf_head_tensors(head, n_layer):
        w.add_tensor(name, arr)
        names.append([name, list(arr.shape), list(reversed(arr.shape))])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return names


# ---------------------------------------------------------------------------------------------
# The reference forward (float64, from the safetensors values, HF conventions)
# ---------------------------------------------------------------------------------------------

def zc_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w.astype(np.float64))


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class HeadReference:
    """The head over its own key/value cache: `step` runs rows at the positions after those it
    holds and returns (logits, out) per row."""

    def __init__(self, cfg, main, head):
        self.cfg, self.eps = cfg, cfg["rms_norm_eps"]
        self.W = {k: v.astype(np.float64) for k, v in head.items()}
        self.embed = main["model.embed_tokens.weight"].astype(np.float64)
        self.lm_head = main.get("lm_head.weight", main["model.embed_tokens.weight"]).astype(np.float64)
        self.keys, self.values = [], []

    def w(self, name):
        return self.W[f"mtp.{name}"]

    def rope(self, t, start):
        cfg = self.cfg
        hd = cfg["head_dim"]
        rot = int(hd * cfg["rope_parameters"]["partial_rotary_factor"])
        theta = cfg["rope_parameters"]["rope_theta"]
        pos = np.arange(start, start + t.shape[0], dtype=np.float64)
        ang = pos[:, None] * (1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot))[None, :]
        cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)
        r, rest = t[..., :rot], t[..., rot:]
        half = rot // 2
        turned = np.concatenate([-r[..., half:], r[..., :half]], -1)
        return np.concatenate([r * cos[:, None] + turned * sin[:, None], rest], -1)

    def ffn(self, h):
        L = lambda s: self.W[f"mtp.layers.0.mlp.{s}.weight"]
        if "mtp.layers.0.mlp.gate.weight" not in self.W:
            return (silu(h @ L("gate_proj").T) * (h @ L("up_proj").T)) @ L("down_proj").T
        logits = h @ L("gate").T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        k = self.cfg["num_experts_per_tok"]
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            top = np.argsort(-probs[t], kind="stable")[:k]
            weights = probs[t][top] / probs[t][top].sum()  # every fixture renormalises the top-k
            for wgt, e in zip(weights, top):
                y = silu(L(f"experts.{e}.gate_proj") @ h[t]) * (L(f"experts.{e}.up_proj") @ h[t])
                out[t] += wgt * (L(f"experts.{e}.down_proj") @ y)
        shared = (silu(h @ L("shared_expert.gate_proj").T) * (h @ L("shared_expert.up_proj").T)) @ L("shared_expert.down_proj").T
        return out + shared * sigmoid(h @ L("shared_expert_gate").T)

    def step(self, hidden, tokens):
        cfg, eps = self.cfg, self.eps
        n, heads, kv_heads, hd = len(tokens), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        L = lambda s: self.W[f"mtp.layers.0.{s}.weight"]
        e = zc_norm(self.embed[np.array(tokens)], self.w("pre_fc_norm_embedding.weight"), eps)
        h = zc_norm(np.asarray(hidden, dtype=np.float64), self.w("pre_fc_norm_hidden.weight"), eps)
        x = np.concatenate([e, h], -1) @ self.w("fc.weight").T
        a = zc_norm(x, L("input_layernorm"), eps)
        qg = (a @ L("self_attn.q_proj").T).reshape(n, heads, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(n, heads * hd)
        k = (a @ L("self_attn.k_proj").T).reshape(n, kv_heads, hd)
        v = (a @ L("self_attn.v_proj").T).reshape(n, kv_heads, hd)
        start = len(self.keys)
        q = self.rope(zc_norm(q, L("self_attn.q_norm"), eps), start)
        k = self.rope(zc_norm(k, L("self_attn.k_norm"), eps), start)
        self.keys += list(k)
        self.values += list(v)
        K, V = np.stack(self.keys), np.stack(self.values)  # [positions, kv_heads, hd]
        group = heads // kv_heads
        att = np.zeros((n, heads, hd))
        for i in range(n):
            visible = start + i + 1
            for hh in range(heads):
                s = K[:visible, hh // group] @ q[i, hh] / math.sqrt(hd)
                p = np.exp(s - s.max())
                att[i, hh] = (p / p.sum()) @ V[:visible, hh // group]
        x = x + (att.reshape(n, heads * hd) * sigmoid(gate)) @ L("self_attn.o_proj").T
        x = x + self.ffn(zc_norm(x, L("post_attention_layernorm"), eps))
        out = zc_norm(x, self.w("norm.weight"), eps)
        return out @ self.lm_head.T, out


def rounded(a):
    return [round(float(v), 6) for v in a]


def top2_gap(logits):
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def add_head(out_dir, name):
    seed = SEEDS[name]
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    with safe_open(str(out_dir / "model.safetensors"), "np") as f:
        main = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("mtp.")}
    hidden, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
    head = head_weights(main, hidden, seed)
    write_safetensors(out_dir / "model.safetensors", main, head)
    # Qwen3.5 configs say how many MTP layers the checkpoint carries; Qwen3-Next's do not (the
    # loader then goes by the tensors).
    if name != "qwen3_next":
        cfg["mtp_num_hidden_layers"] = 1
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gguf_names = rewrite_gguf(out_dir / "model.gguf", head, n_layer)

    # Stand-ins for the target's final hidden states (post-norm scale), rounded so that the recorded
    # values are exactly the inputs used here.
    rng = np.random.default_rng(1000 + seed)
    rows = np.round(rng.standard_normal((ROWS, hidden)), 6).astype(np.float32)
    tokens = [int(t) for t in rng.integers(0, 509, ROWS)]
    ref = HeadReference(cfg, main, head)
    logits, outs = ref.step(rows, tokens)
    chain_ids, chain_logits, chain_out = [], [], outs[-1]
    draft = int(np.argmax(logits[-1]))
    for _ in range(CHAIN - 1):
        chain_ids.append(draft)
        step_logits, step_out = ref.step(chain_out[None, :], [draft])
        chain_logits.append(step_logits[0])
        chain_out, draft = step_out[0], int(np.argmax(step_logits[0]))
    chain_ids.append(draft)

    fixture_path = out_dir / "fixture.json"
    fixture = json.loads(fixture_path.read_text())
    fixture["files"] = {f: {"bytes": (out_dir / f).stat().st_size, "sha256": sha256(out_dir / f)}
                        for f in ("config.json", "model.safetensors", "model.gguf")}
    fixture["gguf_tensors"] = gguf_names
    fixture["mtp"] = {
        "reference": f"scripts/reference/hybrid/add_mtp_head.py HeadReference: numpy {np.__version__}, "
                     "float64, written from vLLM's Qwen3NextMultiTokenPredictor",
        "seed": seed,
        "hidden_states": [[float(v) for v in r] for r in rows],
        "next_tokens": tokens,
        "row_logits": [rounded(lg) for lg in logits],
        "row_argmax": [int(np.argmax(lg)) for lg in logits],
        "row_top2_gap": [round(top2_gap(lg), 6) for lg in logits],
        "chain_drafts": chain_ids,
        "chain_logits": [rounded(lg) for lg in chain_logits],
        "chain_top2_gap": [round(top2_gap(lg), 6) for lg in [logits[-1]] + chain_logits],
    }
    fixture_path.write_text(dumps(fixture) + "\n")
    gaps = fixture["mtp"]["row_top2_gap"] + fixture["mtp"]["chain_top2_gap"]
    print(f"{name}: head rows argmax {fixture['mtp']['row_argmax']}, chain {chain_ids}, min top-2 gap {min(gaps):.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("models", nargs="*", default=list(SEEDS))
    args = parser.parse_args()
    for name in args.models:
        add_head(args.out / name, name)


if __name__ == "__main__":
    main()
