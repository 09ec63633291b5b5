#!/usr/bin/env bash
# Issue 16's side-by-side benchmark: llama-bench / llama-batched-bench (b11434, built by
# scripts/reference/build_llama_cpp.sh) and `spindle bench`, alternated on the same GGUF and
# thread count for N rounds (which tool goes first alternates too). Per model it prints median
# [min-max] over the rounds and Spindle / llama.cpp for: prefill of P tokens, decode of D, prefill
# of DP tokens and decode of DD at each depth of DEPTHS (llama-bench -d), aggregate decode of C
# concurrent sequences (llama-batched-bench; Spindle: `bench --concurrent`), peak RSS of the plain,
# depth and concurrent runs (/usr/bin/time -v), and the decode roofline: weight bytes read per
# token ÷ streaming-read bandwidth measured here at the same thread count.
# With --agent-prompt, each round also replays Qwen Code's recorded first request (system prompt and
# 15 tool schemas, ~17.7K tokens: crates/server/tests/data/agents/qwen_code.json, max_tokens 1)
# cold against a fresh llama-server and a fresh `spindle serve` on qwen2.5-coder-0.5b, both with
# default flags but the thread count, and prints the seconds each took and Spindle's share.
# Last, prefill attention alone at depth 8,192 (cargo bench --bench attention): GFLOP/s against
# the FMA peak measured on the same threads.
# Usage: against_llama_bench.sh [--rounds N] [--models a,b] [--threads T] [--prompt P] [--decode D]
#          [--depths D1,D2,..] [--depth-prompt DP] [--depth-decode DD] [--concurrent C]
#          [--concurrent-prompt CP] [--hybrid-blocks B] [--agent-prompt]
#          [--isa avx2]   (both sides on AVX2 only: llama.cpp built without AVX-512, Spindle's and
#                          candle's kernels narrowed, as an AVX2-only CPU runs them)
# Defaults: 3 rounds, smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m (add qwen2.5-coder-1.5b if wanted),
# 2 threads, P 512, D 128, DEPTHS 4096,8192,16384, DP 1024, DD 64, C 8, CP 128. --hybrid-blocks B adds
# the random-weight Qwen3.5-MoE of `spindle bench --hybrid-blocks` (35B-A3B per-layer shape, B blocks
# of 4 layers).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3 MODELS=smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m THREADS=2 PP=512 TG=128
DEPTHS=4096,8192,16384 DEPTH_PP=1024 DEPTH_TG=64 NPL=8 NPL_PP=128 HYBRID=0 ISA= AGENT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2 ;; --models) MODELS=$2 ;; --threads) THREADS=$2 ;; --prompt) PP=$2 ;; --decode) TG=$2 ;;
    --depths) DEPTHS=$2 ;; --depth-prompt) DEPTH_PP=$2 ;; --depth-decode) DEPTH_TG=$2 ;;
    --concurrent) NPL=$2 ;; --concurrent-prompt) NPL_PP=$2 ;;
    --hybrid-blocks) HYBRID=$2 ;; --isa) ISA=$2 ;; --agent-prompt) AGENT=1; shift; continue ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
  shift 2
done
echo "uptime: $(uptime)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
echo "rounds=$ROUNDS threads=$THREADS prompt=$PP decode=$TG depths=$DEPTHS depth-prompt=$DEPTH_PP depth-decode=$DEPTH_TG concurrent=$NPL concurrent-prompt=$NPL_PP agent-prompt=$AGENT"
[ -x /usr/bin/time ] || { apt-get update -qq && apt-get install -y -qq time; }
case "$ISA" in
  "") ;;
  avx2) export SPINDLE_ISA=avx2 MISTRALRS_FORCE_AVX2=1 ;;
  *) echo "--isa: only avx2 narrows both sides" >&2; exit 2 ;;
esac
LLAMA_SERVER=$(LLAMA_ISA=$ISA scripts/reference/build_llama_cpp.sh | tail -1)
LLAMA_BIN=$(dirname "$LLAMA_SERVER")
echo "llama.cpp b11434: $LLAMA_BIN${ISA:+ (isa $ISA)}"
cargo build --release -q
SPINDLE=target/release/spindle
HOME_DIR=${SPINDLE_HOME:-$HOME/.cache/spindle}
OUT=$(mktemp -d)
RESULTS=$OUT/results.tsv
echo "logs: $OUT" >&2

# Streaming-read bandwidth: a sum over 1 GiB, best of 5 passes, on THREADS threads.
cat >"$OUT/bandwidth.c" <<'C'
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(void) {
  size_t n = (1ull << 30) / sizeof(uint64_t);
  uint64_t *a = malloc(n * sizeof(uint64_t)), sum = 0;
  #pragma omp parallel for
  for (size_t i = 0; i < n; i++) a[i] = i;
  double best = 1e9;
  for (int pass = 0; pass < 5; pass++) {
    double t = omp_get_wtime();
    #pragma omp parallel for reduction(+:sum)
    for (size_t i = 0; i < n; i++) sum += a[i];
    t = omp_get_wtime() - t;
    if (t < best) best = t;
  }
  printf("%.3f\n", (double)(n * sizeof(uint64_t)) / best / 1e9);
  return sum == 42;  /* keeps the sum live */
}
C
cc -O2 -march=native -fopenmp "$OUT/bandwidth.c" -o "$OUT/bandwidth"
BANDWIDTH=$(OMP_NUM_THREADS=$THREADS "$OUT/bandwidth")
echo "streaming read: $BANDWIDTH GB/s on $THREADS threads"

# Runs a command under /usr/bin/time, appending its peak RSS (KiB) to RESULTS as METRIC.
rss() {
  local tool=$1 model=$2 metric=$3 log=$4; shift 4
  /usr/bin/time -v -o "$log.time" "$@" >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$tool" "$model" "$metric" "$(awk -F': ' '/Maximum resident/ {print $2}' "$log.time")" >>"$RESULTS"
}
# llama-bench's JSONL records → RESULTS rows named by test; batched-bench's → the aggregate decode row.
llama_rows() {
  python3 - "$1" "$2" >>"$RESULTS" <<'PY'
import json, sys
path, model = sys.argv[1], sys.argv[2]
for line in open(path):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if "speed_tg" in r:
        print(f"llama\t{model}\tconcurrent decode\t{r['speed_tg']}")
        continue
    at = f" @ d{r['n_depth']}" if r.get("n_depth", 0) else ""
    kind = "prefill" if r["n_prompt"] else "decode"
    print(f"llama\t{model}\t{kind}{at}\t{r['avg_ts']}")
PY
}
spindle_rows() {
  python3 - "$1" "$2" "$3" >>"$RESULTS" <<'PY'
import re, sys
path, model, at = sys.argv[1:]
rows = [l for l in open(path) if re.search(r"[\d.]+ \[[\d.]+-[\d.]+\]\s+[\d.]+ \[", l)]
prefill, decode = (float(m) for m in re.findall(r"([\d.]+) \[", rows[-1]))
if at == "concurrent":
    print(f"spindle\t{model}\tconcurrent decode\t{decode}")
else:
    print(f"spindle\t{model}\tprefill{at}\t{prefill}\nspindle\t{model}\tdecode{at}\t{decode}")
PY
}

llama_round() {
  local model=$1 gguf=$2 log=$OUT/$1.r$3.llama
  local threads=(-t "$THREADS")
  rss llama "$model" rss "$log.plain" "$LLAMA_BIN/llama-bench" -m "$gguf" "${threads[@]}" -p "$PP" -n "$TG" -r 1 -o jsonl
  llama_rows "$log.plain" "$model"
  rss llama "$model" "rss @ depth" "$log.depth" "$LLAMA_BIN/llama-bench" -m "$gguf" "${threads[@]}" -d "$DEPTHS" \
    -p "$DEPTH_PP" -n "$DEPTH_TG" -r 1 -o jsonl
  llama_rows "$log.depth" "$model"
  rss llama "$model" "rss concurrent" "$log.batched" "$LLAMA_BIN/llama-batched-bench" -m "$gguf" "${threads[@]}" \
    -c $((NPL * (NPL_PP + TG))) -b 2048 -ub 512 -npp "$NPL_PP" -ntg "$TG" -npl "$NPL" --output-format jsonl
  llama_rows "$log.batched" "$model"
}
spindle_round() {
  local model=$1 log=$OUT/$1.r$2.spindle
  local bench=("$SPINDLE" bench --threads "$THREADS" --repeats 1 --models "${SPINDLE_MODEL[$model]}")
  [ "$model" = hybrid ] && bench+=(--hybrid-blocks "$HYBRID")
  rss spindle "$model" rss "$log.plain" "${bench[@]}" --prompt-tokens "$PP" --decode-tokens "$TG"
  spindle_rows "$log.plain" "$model" ""
  for depth in ${DEPTHS//,/ }; do
    rss spindle "$model" "rss @ depth" "$log.d$depth" "${bench[@]}" --prompt-tokens "$DEPTH_PP" \
      --decode-tokens "$DEPTH_TG" --depth "$depth"
    spindle_rows "$log.d$depth" "$model" " @ d$depth"
  done
  rss spindle "$model" "rss concurrent" "$log.concurrent" "${bench[@]}" --prompt-tokens "$NPL_PP" \
    --decode-tokens "$TG" --concurrent "$NPL"
  spindle_rows "$log.concurrent" "$model" concurrent
}

# Seconds a fresh server takes to answer the recorded agent request (max_tokens 1), appended to
# RESULTS as "agent prompt". Both servers keep their default flags but the thread count.
agent_round() {
  local tool=$1 log=$OUT/agent.r$2.$1 port=$((20000 + RANDOM % 20000)) pid
  if [ "$tool" = llama ]; then
    "$LLAMA_SERVER" -m "${GGUF[$AGENT_MODEL]}" -t "$THREADS" --port "$port" >"$log.server" 2>&1 &
  else
    "$SPINDLE" serve --model "$AGENT_MODEL" --threads "$THREADS" --port "$port" >"$log.server" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.update(max_tokens=1, stream=False); r.pop("stream_options", None); print(json.dumps(r))' \
    crates/server/tests/data/agents/qwen_code.json >"$log.request"
  local seconds
  seconds=$(curl -sf -o "$log.response" -w '%{time_total}' -H 'content-type: application/json' \
    --data @"$log.request" "http://127.0.0.1:$port/v1/chat/completions") || { kill $pid; tail "$log.server" >&2; exit 1; }
  kill $pid; wait $pid 2>/dev/null || true
  printf '%s\t%s\tagent prompt\t%s\n' "$tool" "$AGENT_MODEL" "$seconds" >>"$RESULTS"
  python3 -c 'import json,sys; print("  agent prompt:", sys.argv[2], json.load(open(sys.argv[1]))["usage"]["prompt_tokens"], "tokens in", sys.argv[3], "s")' \
    "$log.response" "$tool" "$seconds" >&2
}

declare -A GGUF SPINDLE_MODEL
NAMES=()
for model in ${MODELS//,/ }; do
  "$SPINDLE" pull "$model" >/dev/null
  GGUF[$model]=$(ls "$HOME_DIR/models/$model/"*.gguf | head -1)
  SPINDLE_MODEL[$model]=$model
  NAMES+=("$model")
done
if [ "$HYBRID" -gt 0 ]; then
  # Spindle measures the hybrid after the default model (its tokenizer); the last row is the hybrid's.
  "$SPINDLE" bench --models smollm2-135m --hybrid-blocks "$HYBRID" --prompt-tokens 16 --decode-tokens 2 --repeats 1 >/dev/null
  GGUF[hybrid]=$(ls "$HOME_DIR"/bench/*-"$HYBRID"x4-r*.gguf | tail -1)
  SPINDLE_MODEL[hybrid]=smollm2-135m
  NAMES+=(hybrid)
fi
AGENT_MODEL=qwen2.5-coder-0.5b
if [ "$AGENT" = 1 ] && [ -z "${GGUF[$AGENT_MODEL]:-}" ]; then
  "$SPINDLE" pull "$AGENT_MODEL" >/dev/null
  GGUF[$AGENT_MODEL]=$(ls "$HOME_DIR/models/$AGENT_MODEL/"*.gguf | head -1)
fi
for round in $(seq "$ROUNDS"); do
  if [ "$AGENT" = 1 ]; then
    echo "round $round: agent prompt" >&2
    if [ $((round % 2)) -eq 1 ]; then agent_round llama "$round"; agent_round spindle "$round"
    else agent_round spindle "$round"; agent_round llama "$round"; fi
  fi
  for model in "${NAMES[@]}"; do
    echo "round $round: $model" >&2
    if [ $((round % 2)) -eq 1 ]; then
      llama_round "$model" "${GGUF[$model]}" "$round"; spindle_round "$model" "$round"
    else
      spindle_round "$model" "$round"; llama_round "$model" "${GGUF[$model]}" "$round"
    fi
  done
done

[ "$AGENT" = 1 ] && [[ " ${NAMES[*]} " != *" $AGENT_MODEL "* ]] && NAMES+=("$AGENT_MODEL")
for model in "${NAMES[@]}"; do printf 'gguf\t%s\t%s\n' "$model" "${GGUF[$model]}"; done >>"$RESULTS"
python3 scripts/bench/summarize_llama_bench.py "$RESULTS" "$BANDWIDTH" "$PP" "$TG" "$DEPTHS" "$DEPTH_PP" "$DEPTH_TG" "$NPL"
echo
echo "prefill attention alone at depth 8192 (1024 new rows, f16 KV, $THREADS threads):"
RAYON_NUM_THREADS=$THREADS cargo bench -q -p spindle-models --bench attention -- --depth 8192 --rows 1024 2>/dev/null
