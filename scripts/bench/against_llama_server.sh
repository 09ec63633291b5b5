#!/usr/bin/env bash
# The issue-5 bar, measured on this machine: the agent benchmark (`spindle bench agentic` and
# `spindle bench burst`) against
# llama-server and against Spindle, on the same random-weight Qwen3.5-MoE file (8 layers, hidden
# 1024, 64 experts top-8, Q4_K), each phase side by side with Spindle's time as a fraction of
# llama-server's. Builds llama-server b11434 first (scripts/reference/build_llama_cpp.sh, ~10 min
# once). llama-server gets one slot per call of the largest burst, so a burst runs concurrently.
# Each side's JSON and HTML reports land in $OUT/spindle and $OUT/llama-server (printed).
# Usage: against_llama_server.sh [BURSTS]   (comma-separated, default 8)
set -euo pipefail
cd "$(dirname "$0")/../.."
BURSTS="${1:-8}"
SLOTS=$(tr ',' '\n' <<<"$BURSTS" | sort -n | tail -1)
LLAMA_SERVER=$(scripts/reference/build_llama_cpp.sh | tail -1)
cargo build --release -q
OUT=$(mktemp -d)
echo "== Spindle" >&2
{ target/release/spindle bench agentic --hybrid --output "$OUT/spindle"
  target/release/spindle bench burst --hybrid --concurrency "$BURSTS" --output "$OUT/spindle"; } 2>&1 |
  tee "$OUT/spindle.txt"
MODEL=$(grep -o -- '--model [^ ]*' "$OUT/spindle.txt" | head -1 | cut -d' ' -f2)
PORT=$((20000 + RANDOM % 20000))
"$LLAMA_SERVER" -m "$MODEL" -t "$(nproc)" -np "$SLOTS" -c $((SLOTS * 4096)) --port "$PORT" \
  >"$OUT/llama-server.log" 2>&1 &
LLAMA_PID=$!
trap 'kill $LLAMA_PID 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
echo "== llama-server (log: $OUT/llama-server.log)" >&2
URL="http://127.0.0.1:$PORT"
{ target/release/spindle bench agentic --base-url "$URL" --output "$OUT/llama-server"
  target/release/spindle bench burst --base-url "$URL" --concurrency "$BURSTS" --output "$OUT/llama-server"; } 2>&1 |
  tee "$OUT/llama-server.txt"
python3 - "$OUT/llama-server.txt" "$OUT/spindle.txt" <<'PY'
import re, sys
def phases(path):
    found = {}
    for line in open(path):
        m = re.match(r"(cold|warm|prefix-test-\d|cold-prefix)\s+([\d.]+)", line)
        if m:
            found[m.group(1)] = float(m.group(2))
        m = re.match(r"burst\s+(\d+): errors (\d+) .*?latency p50 (\d+) p95 \d+ max (\d+) ms.*re-read whole prompt (\d+)/", line)
        if m:
            n, errors, p50, peak, rereads = m.groups()
            found[f"burst {n} p50"] = float(p50)
            found[f"burst {n} max"] = float(peak)
            found[f"burst {n} re-reads"] = f"{rereads}/{n}, {errors} errors"
    return found
llama, ours = phases(sys.argv[1]), phases(sys.argv[2])
print(f"\n{'phase (ms)':<20} {'llama-server':>14} {'Spindle':>14} {'Spindle/llama':>14}")
for key in llama:
    a, b = llama[key], ours.get(key)
    if isinstance(a, float) and isinstance(b, float):
        print(f"{key:<20} {a:>14.1f} {b:>14.1f} {b / a:>14.3f}")
    elif b is not None:
        print(f"{key:<20} {a:>14} {b:>14}")
PY
