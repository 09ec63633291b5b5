#!/usr/bin/env python3
"""Greedy continuations and per-step top-5 logprobs from Hugging Face transformers (CPU, float32,
eager attention) for the same GGUF files Spindle loads: transformers dequantizes the GGUF weights
and runs its own modeling code, an implementation independent of Spindle and of llama.cpp.

The prompts are the token ids of the llama.cpp fixtures (tests/data/reference/<model>.json), so
both references see identical input. Output: tests/data/reference/transformers/<model>.json.

Usage: python make_transformers_fixtures.py [--home ~/.cache/spindle] [model ...]
Needs: pip install torch transformers gguf sentencepiece
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import pathlib
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/data/reference"
STEPS = 24
TOP_N = 5


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@torch.no_grad()
def greedy(model, prompt_ids):
    """24 greedy steps with the KV cache; each step's top-5 [id, logprob] and its top-1/top-2 gap."""
    ids, tops, gaps = [], [], []
    past = None
    inputs = torch.tensor([prompt_ids])
    for _ in range(STEPS):
        out = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logprobs = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
        values, indices = torch.topk(logprobs, TOP_N)
        tops.append([[int(i), round(float(v), 6)] for v, i in zip(values, indices)])
        gaps.append(round(float(values[0] - values[1]), 5))
        ids.append(int(indices[0]))
        inputs = indices[:1].view(1, 1)
    return ids, tops, gaps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", default=os.environ.get("SPINDLE_HOME", os.path.expanduser("~/.cache/spindle")))
    parser.add_argument("models", nargs="*", default=["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
    args = parser.parse_args()
    torch.manual_seed(0)
    out_dir = FIXTURES / "transformers"
    out_dir.mkdir(exist_ok=True)
    for name in args.models:
        llama_cpp = json.loads((FIXTURES / f"{name}.json").read_text())
        path = pathlib.Path(args.home) / "models" / name / llama_cpp["gguf_file"]
        digest = sha256(path)
        if digest != llama_cpp["gguf_sha256"]:
            sys.exit(f"{path}: sha256 {digest} differs from the llama.cpp fixture's")
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        generations = []
        for g in llama_cpp["generations"]:
            ids, tops, gaps = greedy(model, g["prompt_ids"])
            generations.append({"prompt": g["prompt"], "prompt_ids": g["prompt_ids"], "greedy_ids": ids,
                                "top_logprobs": tops, "top2_gap": gaps})
            print(f"{name}: {g['prompt'][:30]!r}: agrees with llama.cpp on "
                  f"{sum(a == b for a, b in zip(ids, g['greedy_ids']))}/{STEPS}, min gap {min(gaps):.4f}")
        doc = {
            "model": name,
            "gguf_file": path.name,
            "gguf_sha256": digest,
            "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                         f"gguf {importlib.metadata.version('gguf')}; "
                         "float32, eager attention, CPU",
            "generations": generations,
        }
        (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
