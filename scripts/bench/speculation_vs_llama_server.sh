#!/usr/bin/env bash
# Issue 36's side-by-side: `spindle bench speculation` (a whole-file rename, a tool call quoting
# its context, prose with nothing to copy; greedy, streamed) against Spindle and against
# llama-server b11434 on the same GGUF with the same threads. Configurations:
#   spindle-spec / spindle-plain   one `spindle serve`, each request "speculative": true / false
#   llama-ngram                    llama-server --spec-type ngram-mod
#   llama-plain                    llama-server without speculation
#   llama-draft                    llama-server -md DRAFT (only with --draft)
# Rounds alternate the order (round 1 Spindle then the llama-servers, round 2 the reverse, ...),
# and only one server runs at a time: each is started for its turn and stopped after it. Each
# round takes new versions of the requests (--seed ROUND), the same for every configuration.
# Prints per workload decode tok/s median [min–max] and acceptance for each configuration, and
# the ratios Spindle spec / Spindle plain, Spindle spec / llama best speculative, llama spec /
# llama plain. Reports (JSON, HTML, logs) land in a temporary folder (printed).
# Usage: speculation_vs_llama_server.sh [--model GGUF|NAME] [--draft GGUF|NAME] [--rounds N]
#          [--threads N] [--max-tokens N] [--isa avx2] [--spindle BIN] [--client BIN]
#          [--workloads LIST]
#   --model    a .gguf file or a catalogue name (default qwen2.5-coder-0.5b; a name resolves to
#              the .gguf under ~/.cache/spindle/models/NAME, downloaded by `spindle pull` first)
#   --draft    a smaller model of the same vocabulary for llama-server's -md row (and Spindle's
#              --draft-model on its spec row), e.g. qwen2.5-coder-0.5b beside a 1.5B --model
#   --isa avx2 both sides on AVX2 only: SPINDLE_ISA=avx2, llama.cpp built without AVX-512
#   --spindle  a built spindle binary (default: cargo build --release, target/release/spindle)
#   --client   the spindle binary that runs the panel (default: --spindle's)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=qwen2.5-coder-0.5b DRAFT= ROUNDS=3 THREADS=$(nproc) MAX_TOKENS=2048 ISA= SPINDLE= CLIENT= WORKLOADS=
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2 ;; --draft) DRAFT=$2 ;; --rounds) ROUNDS=$2 ;; --threads) THREADS=$2 ;;
    --max-tokens) MAX_TOKENS=$2 ;; --isa) ISA=$2 ;; --spindle) SPINDLE=$2 ;; --client) CLIENT=$2 ;;
    --workloads) WORKLOADS=$2 ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
  shift 2
done
case "$ISA" in
  "") ;;
  avx2) export SPINDLE_ISA=avx2 ;;
  *) echo "--isa: only avx2 narrows both sides" >&2; exit 2 ;;
esac
LLAMA_SERVER=$(LLAMA_ISA=$ISA scripts/reference/build_llama_cpp.sh | tail -1)
if [ -z "$SPINDLE" ]; then
  cargo build --release -q
  SPINDLE=target/release/spindle
fi
CLIENT=${CLIENT:-$SPINDLE}
HOME_DIR=${SPINDLE_HOME:-$HOME/.cache/spindle}
# A catalogue name becomes its .gguf (both servers must read the same file).
gguf() {
  case "$1" in
    *.gguf) echo "$1" ;;
    *) [ -d "$HOME_DIR/models/$1" ] || "$SPINDLE" pull "$1" >&2
       ls "$HOME_DIR/models/$1"/*.gguf | head -1 ;;
  esac
}
MODEL_FILE=$(gguf "$MODEL")
DRAFT_FILE=
[ -n "$DRAFT" ] && DRAFT_FILE=$(gguf "$DRAFT")
OUT=$(mktemp -d)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; uptime: $(uptime)"
echo "model $MODEL_FILE${DRAFT_FILE:+, draft $DRAFT_FILE}; threads $THREADS; rounds $ROUNDS; max_tokens $MAX_TOKENS${ISA:+; isa $ISA}"
echo "llama-server: $LLAMA_SERVER; spindle: $SPINDLE; reports and logs: $OUT"

PORT=$((20000 + RANDOM % 20000))
URL="http://127.0.0.1:$PORT"
SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "$URL/health" >/dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited; see $1" >&2; exit 1; }
    sleep 0.5
  done
  echo "the server did not get ready; see $1" >&2; exit 1
}
# Starts configuration $1's server (one slot, greedy) and waits for it.
start_server() {
  local log="$OUT/$1-round$2.log"
  case "$1" in
    spindle)
      "$SPINDLE" serve --model "$MODEL_FILE" --threads "$THREADS" --host 127.0.0.1 --port "$PORT" \
        ${DRAFT_FILE:+--draft-model "$DRAFT_FILE"} >"$log" 2>&1 & ;;
    llama-*)
      local spec=()
      case "$1" in
        llama-ngram) spec=(--spec-type ngram-mod) ;;
        llama-draft) spec=(-md "$DRAFT_FILE") ;;
      esac
      "$LLAMA_SERVER" -m "$MODEL_FILE" -t "$THREADS" -np 1 -c 8192 --port "$PORT" "${spec[@]}" \
        >"$log" 2>&1 & ;;
  esac
  SERVER_PID=$!
  wait_ready "$log"
}
# One panel run against configuration $1 in round $2.
measure() {
  local rows=server
  [ "$1" = spindle ] && rows=both
  start_server "$1" "$2"
  echo "== round $2: $1" >&2
  # The client only streams and waits; `nice` keeps it out of the server's way.
  nice "$CLIENT" bench speculation --base-url "$URL" --speculative "$rows" --runs 1 --seed "$2" \
    --max-tokens "$MAX_TOKENS" ${WORKLOADS:+--workloads "$WORKLOADS"} \
    --output "$OUT/$1/round$2" 2>&1 | tee -a "$OUT/$1.txt" >&2
  stop_server
}
CONFIGS=(spindle llama-ngram llama-plain)
[ -n "$DRAFT_FILE" ] && CONFIGS+=(llama-draft)
for round in $(seq "$ROUNDS"); do
  order=("${CONFIGS[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[$i]}"); done
  fi
  for config in "${order[@]}"; do measure "$config" "$round"; done
done
python3 - "$OUT" "${CONFIGS[@]}" <<'PY'
import glob, json, statistics, sys
out, configs = sys.argv[1], sys.argv[2:]
# (config, workload) -> per-round tok/s, and drafted / accepted summed over rounds
speeds, drafted, accepted = {}, {}, {}
for config in configs:
    for path in sorted(glob.glob(f"{out}/{config}/round*/speculation.json")):
        for row in json.load(open(path))["speculation"]["rows"]:
            name = {"spindle": f"spindle-{row['mode']}"}.get(config, config)
            key = (name, row["workload"])
            for call in row["calls"]:
                if call["decode_tokens_per_second"] is not None:
                    speeds.setdefault(key, []).append(call["decode_tokens_per_second"])
                if call["drafted"] is not None:
                    drafted[key] = drafted.get(key, 0) + call["drafted"]
                    accepted[key] = accepted.get(key, 0) + call["accepted"]
def spread(v):
    return f"{statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]" if v else "-"
def med(key):
    v = speeds.get(key)
    return statistics.median(v) if v else None
def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "-"
names = [n for n in ["spindle-spec", "spindle-plain", "llama-ngram", "llama-draft", "llama-plain"]
         if any(k[0] == n for k in speeds)]
workloads = []
for _, w in speeds:
    if w not in workloads:
        workloads.append(w)
for w in workloads:
    print(f"\n{w}")
    print(f"  {'configuration':<14} {'decode tok/s median [min–max]':>32} {'drafted':>9} {'accepted':>9} {'acceptance':>10}")
    for n in names:
        key = (n, w)
        d, a = drafted.get(key), accepted.get(key)
        rate = f"{100 * a / d:.1f}%" if d else "-"
        print(f"  {n:<14} {spread(speeds.get(key, [])):>32} {d if d is not None else '-':>9} "
              f"{a if a is not None else '-':>9} {rate:>10}")
    spec, plain = med(("spindle-spec", w)), med(("spindle-plain", w))
    llama = {n: med((n, w)) for n in ["llama-ngram", "llama-draft"] if med((n, w))}
    best = max(llama, key=llama.get) if llama else None
    print(f"  Spindle spec / Spindle plain        {ratio(spec, plain)}")
    if best:
        print(f"  Spindle spec / llama best spec      {ratio(spec, llama[best])} ({best})")
        for n, v in llama.items():
            print(f"  {n} / llama-plain{' ' * (20 - len(n))}{ratio(v, med(('llama-plain', w)))}")
PY
