#!/usr/bin/env bash
# Issue 18's side-by-side: `spindle eval --tier standard`, `spindle bench agentic` and
# `spindle bench burst --concurrency 8,30` against `spindle serve` and against llama-server
# b11434 on the same GGUF (default: the catalogue's smollm2-135m), one server at a time. Each
# side's JSON / HTML reports land in $OUT/<server>/ (printed).
# Usage: compare_servers.sh [MODEL] [BURSTS]   (catalogue name; comma-separated, default 8,30)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-smollm2-135m}
BURSTS=${2:-8,30}
SLOTS=$(tr ',' '\n' <<<"$BURSTS" | sort -n | tail -1)
echo "uptime: $(uptime)"
LLAMA_SERVER=$(scripts/reference/build_llama_cpp.sh | tail -1)
cargo build --release -q
SPINDLE=target/release/spindle
"$SPINDLE" pull "$MODEL" >/dev/null
GGUF=$(ls "${SPINDLE_HOME:-$HOME/.cache/spindle}/models/$MODEL/"*.gguf | head -1)
OUT=$(mktemp -d)
echo "model: $GGUF; reports: $OUT" >&2
PORT=$((20000 + RANDOM % 20000))
SERVER_PID=
trap '[ -n "$SERVER_PID" ] && kill $SERVER_PID 2>/dev/null || true' EXIT

measure() { # NAME [EVAL ARGS…]: the panels against the server on $PORT
  local url="http://127.0.0.1:$PORT"
  for _ in $(seq 240); do curl -sf "$url/health" >/dev/null && break; sleep 0.5; done
  local name=$1; shift
  echo "== $name"
  "$SPINDLE" eval --tier standard --base-url "$url" "$@" --output "$OUT/$name" || true
  "$SPINDLE" bench agentic --base-url "$url" --output "$OUT/$name" || true
  "$SPINDLE" bench burst --base-url "$url" --concurrency "$BURSTS" --output "$OUT/$name" || true
}

# Spindle's defaults: 16 running + 64 waiting (the 429 check); llama-server queues without limit.
"$SPINDLE" serve --model "$GGUF" --port "$PORT" >"$OUT/spindle.log" 2>&1 &
SERVER_PID=$!
measure spindle --queue-capacity 80 2>&1 | tee "$OUT/spindle.txt"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
PORT=$((PORT + 1))
"$LLAMA_SERVER" -m "$GGUF" -t "$(nproc)" -np "$SLOTS" -c $((SLOTS * 4096)) --metrics --port "$PORT" \
  >"$OUT/llama-server.log" 2>&1 &
SERVER_PID=$!
measure llama-server 2>&1 | tee "$OUT/llama-server.txt"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
