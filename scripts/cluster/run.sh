#!/usr/bin/env bash
# A fleet on one machine: N `spindle serve` replicas of MODEL on local ports behind vllm-router
# (from PyPI, installed into a venv under $SPINDLE_HOME), which picks a replica per request.
#
#   scripts/cluster/run.sh N [MODEL]       (default model: smollm2-135m)
#
# Environment: POLICY (cache_aware; or consistent_hash, round_robin, power_of_two, kv_aware),
# ROUTER_PORT (8000), BASE_PORT (8100: replicas on 8100, 8101, ...), THREADS (CPU threads per
# replica, 1), SPINDLE (the binary; default target/release/spindle, built if missing), and
# SERVE_ARGS (more `spindle serve` flags for every replica). Each replica publishes its KV-cache
# events on tcp://127.0.0.1:(EVENTS_PORT + 2i) (EVENTS_PORT: 5557) with replays on the next
# port; POLICY=kv_aware points the router at them. Prints the router's URL, then runs until Ctrl-C, which drains and stops
# every process.
set -euo pipefail
N="${1:?usage: scripts/cluster/run.sh N [MODEL]}"
MODEL="${2:-smollm2-135m}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SPINDLE_HOME="${SPINDLE_HOME:-$HOME/.cache/spindle}"
POLICY="${POLICY:-cache_aware}"
ROUTER_PORT="${ROUTER_PORT:-8000}"
BASE_PORT="${BASE_PORT:-8100}"
THREADS="${THREADS:-1}"
EVENTS_PORT="${EVENTS_PORT:-5557}"
SPINDLE="${SPINDLE:-$ROOT/target/release/spindle}"
LOGS="${LOGS:-$(mktemp -d -t spindle-cluster-XXXXXX)}"
mkdir -p "$LOGS"

if [ ! -x "$SPINDLE" ]; then
    (cd "$ROOT" && cargo build --release --bin spindle)
fi
venv="$SPINDLE_HOME/venv-vllm-router"
if [ ! -x "$venv/bin/vllm-router" ]; then
    mkdir -p "$SPINDLE_HOME"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade vllm-router
fi
"$SPINDLE" pull "$MODEL" >/dev/null

pids=()
stop_all() {
    # SIGTERM drains each process; its own grace period bounds the wait.
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT INT TERM

urls=()
event_args=()
for ((i = 0; i < N; i++)); do
    port=$((BASE_PORT + i))
    events="tcp://127.0.0.1:$((EVENTS_PORT + 2 * i))"
    replay="tcp://127.0.0.1:$((EVENTS_PORT + 1 + 2 * i))"
    # shellcheck disable=SC2086
    "$SPINDLE" serve --model "$MODEL" --port "$port" --threads "$THREADS" \
        --batch-dir "$LOGS/batches-$i" --kv-events-endpoint "$events" \
        --kv-events-replay-endpoint "$replay" ${SERVE_ARGS:-} >"$LOGS/replica-$i.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$port")
    event_args+=(--kv-event-source "http://127.0.0.1:$port=$events"
        --kv-event-replay-source "http://127.0.0.1:$port=$replay")
done
for ((i = 0; i < N; i++)); do
    until curl -sf "${urls[$i]}/health" >/dev/null; do
        kill -0 "${pids[$i]}" 2>/dev/null || { cat "$LOGS/replica-$i.log" >&2; exit 1; }
        sleep 0.5
    done
done

router_args=(--host 127.0.0.1 --port "$ROUTER_PORT" --worker-urls "${urls[@]}" --policy "$POLICY")
if [ "$POLICY" = kv_aware ]; then
    router_args+=("${event_args[@]}" --kv-event-block-size 16 --kv-event-model "$MODEL")
fi
"$venv/bin/vllm-router" "${router_args[@]}" >"$LOGS/router.log" 2>&1 &
pids+=($!)
until curl -sf "http://127.0.0.1:$ROUTER_PORT/health" >/dev/null; do sleep 0.5; done
echo "router ($POLICY) over ${urls[*]}: http://127.0.0.1:$ROUTER_PORT (logs in $LOGS)"
wait "${pids[@]}"
