#!/usr/bin/env bash
# Issue 17's burst: N chat calls at once, each with its own ~P-token prompt and no max_tokens, on
# the random-weight Qwen3.5-MoE of the 35B-A3B per-layer shape (B blocks of 3 linear + 1 full
# attention layers), against llama-server b11434 and `spindle serve` on the same GGUF. Each server
# holds CTX tokens per call (llama-server: -np N slots of CTX), so an omitted max_tokens lets a call
# generate until its context is full. Prints per server: calls that ran at once (peak of the
# server's running-requests gauge, sampled every 0.2 s), errors, latency p50 / max, total wall
# time, prompt and completion tokens, and Spindle's preemptions.
# Usage: long_prompt_burst.sh [--calls N] [--prompt-tokens P] [--ctx CTX] [--blocks B] [--threads T]
#          [--serve-arg "..."]   (defaults: 8, 16000, 16896, 2, all cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=8 PROMPT=16000 CTX=16896 BLOCKS=2 THREADS=$(nproc) SERVE_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --calls) CALLS=$2 ;; --prompt-tokens) PROMPT=$2 ;; --ctx) CTX=$2 ;; --blocks) BLOCKS=$2 ;;
    --threads) THREADS=$2 ;; --serve-arg) SERVE_ARGS=$2 ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
  shift 2
done
echo "uptime: $(uptime)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores, threads $THREADS"
LLAMA_SERVER=$(scripts/reference/build_llama_cpp.sh | tail -1)
cargo build --release -q
SPINDLE=target/release/spindle
HOME_DIR=${SPINDLE_HOME:-$HOME/.cache/spindle}
# `spindle bench --hybrid-blocks` writes the file on first use.
"$SPINDLE" bench --models smollm2-135m --hybrid-blocks "$BLOCKS" --prompt-tokens 16 --decode-tokens 2 \
  --repeats 1 >/dev/null
MODEL=$(ls "$HOME_DIR"/bench/qwen35moe-shape-random-"$BLOCKS"x4-r*.gguf | tail -1)
echo "model: $MODEL"
OUT=$(mktemp -d)
echo "logs: $OUT" >&2
PORT=$((20000 + RANDOM % 20000))
SERVER_PID=
trap '[ -n "$SERVER_PID" ] && kill $SERVER_PID 2>/dev/null || true' EXIT

wait_ready() {
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0; sleep 0.5; done
  echo "server did not come up; log tail:" >&2; tail -20 "$1" >&2; exit 1
}

burst() { # NAME GAUGE
  python3 - "http://127.0.0.1:$PORT" "$CALLS" "$PROMPT" "$1" "$2" <<'PY'
import json, random, re, statistics, sys, threading, time, urllib.error, urllib.request
url, calls, prompt_tokens, name, gauge = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
WORDS = ("the of and to in is for on that with as by at from this be are or an it not was which "
         "file function value error test server request model cache token layer memory thread "
         "prompt block state result tool call return string number list object write read path "
         "line change build check open close start stop time size order index count field").split()

def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=7200) as response:
        return json.load(response)

def text(seed, words):
    rng = random.Random(seed)
    return f"Session {seed}. " + " ".join(rng.choice(WORDS) for _ in range(words))

# Size the prompts with the server's own tokenizer (both servers read the same GGUF); the chat
# template adds a few more.
def count(content):
    try:
        return len(post("/tokenize", {"content": content})["tokens"])  # llama-server
    except urllib.error.HTTPError:
        return len(post("/v1/tokenize", {"prompt": content})["tokens"])  # Spindle
words = int(prompt_tokens * 4000 / count(text(0, 4000)))
words = int(words * prompt_tokens / count(text(999, words)))

peak, samples, stop = [0], [], threading.Event()
def watch():
    while not stop.is_set():
        try:
            metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            value = next(float(m.group(1)) for m in re.finditer(
                rf"^{re.escape(gauge)}(?:{{[^}}]*}})? ([\d.e+]+)$", metrics, re.M))
            peak[0] = max(peak[0], value)
            samples.append(value)
        except Exception:
            pass
        time.sleep(0.2)

results = [None] * calls
def call(i):
    start = time.time()
    try:
        body = {"messages": [{"role": "user", "content": text(1000 + i, words)}], "temperature": 0}
        usage = post("/v1/chat/completions", body)["usage"]
        results[i] = (time.time() - start, usage["prompt_tokens"], usage["completion_tokens"], None)
    except Exception as error:
        detail = error.read().decode()[:300] if hasattr(error, "read") else str(error)
        results[i] = (time.time() - start, 0, 0, detail)

watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
begin = time.time()
threads = [threading.Thread(target=call, args=(i,)) for i in range(calls)]
[t.start() for t in threads]
[t.join() for t in threads]
wall = time.time() - begin
stop.set()
errors = [r[3] for r in results if r[3]]
latencies = sorted(r[0] for r in results)
print(f"{name}: calls {calls}, ran at once (peak) {peak[0]:.0f}, errors {len(errors)}, "
      f"latency p50 {statistics.median(latencies):.0f} s max {latencies[-1]:.0f} s, wall {wall:.0f} s, "
      f"prompt tokens {sum(r[1] for r in results)} ({min(r[1] for r in results)}-{max(r[1] for r in results)}), "
      f"completion tokens {sum(r[2] for r in results)}")
for e in errors[:3]:
    print(f"  error: {e}")
PY
}

echo "== llama-server (log $OUT/llama-server.log)"
"$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -np "$CALLS" -c $((CALLS * CTX)) --metrics --port "$PORT" \
  >"$OUT/llama-server.log" 2>&1 &
SERVER_PID=$!
wait_ready "$OUT/llama-server.log"
burst llama-server llamacpp:requests_processing | tee "$OUT/llama-server.txt"
kill $SERVER_PID; wait $SERVER_PID 2>/dev/null || true

echo "== spindle serve (log $OUT/spindle.log)"
# shellcheck disable=SC2086
"$SPINDLE" serve --model "$MODEL" --threads "$THREADS" --ctx-size "$CTX" --port "$PORT" $SERVE_ARGS \
  >"$OUT/spindle.log" 2>&1 &
SERVER_PID=$!
wait_ready "$OUT/spindle.log"
grep -m1 "KV cache" "$OUT/spindle.log" || true
burst spindle vllm:num_requests_running | tee "$OUT/spindle.txt"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^vllm:num_preemptions" || true
kill $SERVER_PID; wait $SERVER_PID 2>/dev/null || true
