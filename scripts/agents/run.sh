#!/usr/bin/env bash
# Runs a real coding agent against an LLM server on a one-line bug fix and prints a verdict.
#
#   scripts/agents/run.sh CLIENT [--base-url URL] [--model M] [--timeout S] [--out DIR]
#
# CLIENT is claude (Claude Code, Messages API), codex (Codex CLI, Responses API) or qwen (Qwen
# Code, Chat Completions). The client comes from npm into $SPINDLE_HOME/agents/CLIENT on first use.
# Without --base-url the script starts `spindle serve --model M` (default qwen2.5-coder-0.5b,
# default flags; the release binary, built if missing); with it (e.g. a llama-server at
# http://127.0.0.1:8081) the agent talks to that server instead, so the two can be compared.
# Every HTTP exchange goes through a recording proxy (record.py) into DIR/exchanges.jsonl; the
# client runs in a scratch git repository whose calc.py adds where it should subtract, with a
# scratch HOME, under a time limit (--timeout, default 1800 s). DIR (default a new /tmp folder)
# keeps the log, the server log, the client's output and the repository.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/scripts/agents"
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

CLIENT="${1:-}"; shift || true
BASE_URL="" MODEL="qwen2.5-coder-0.5b" TIMEOUT=1800 OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base-url) BASE_URL="${2%/}"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) usage ;;
  esac
done
case "$CLIENT" in
  claude) PACKAGE=@anthropic-ai/claude-code ;;
  codex) PACKAGE=@openai/codex ;;
  qwen) PACKAGE=@qwen-code/qwen-code ;;
  *) usage ;;
esac
SPINDLE_HOME="${SPINDLE_HOME:-$HOME/.cache/spindle}"
OUT="${OUT:-$(mktemp -d "/tmp/agent-$CLIENT-XXXX")}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq "$2"); do curl -sf -o /dev/null "$1" && return 0; sleep 1; done; echo "no answer from $1" >&2; return 1; }

# The client, from npm, once.
PREFIX="$SPINDLE_HOME/agents/$CLIENT"
BIN="$PREFIX/node_modules/.bin/$CLIENT"
if [ ! -x "$BIN" ]; then
  echo "installing $PACKAGE into $PREFIX" >&2
  mkdir -p "$PREFIX"
  npm install --prefix "$PREFIX" --no-audit --no-fund "$PACKAGE" >"$PREFIX.install.log" 2>&1 \
    || { tail -20 "$PREFIX.install.log" >&2; exit 1; }
fi
echo "client: $("$BIN" --version 2>/dev/null | head -1)" >&2

PIDS=()
trap 'for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done' EXIT

# The server: Spindle with default flags unless a URL is given.
if [ -z "$BASE_URL" ]; then
  SPINDLE="$ROOT/target/release/spindle"
  [ -x "$SPINDLE" ] || (cd "$ROOT" && cargo build --release)
  SERVER_PORT=$(free_port)
  NO_COLOR=1 "$SPINDLE" serve --model "$MODEL" --port "$SERVER_PORT" >"$OUT/server.log" 2>&1 &
  PIDS+=($!)
  BASE_URL="http://127.0.0.1:$SERVER_PORT"
  wait_for "$BASE_URL/health" 600 || { tail -20 "$OUT/server.log" >&2; exit 1; }
  echo "server: spindle serve --model $MODEL (log: $OUT/server.log)" >&2
fi

# The recording proxy the client talks to.
PROXY_PORT=$(free_port)
python3 "$HERE/record.py" proxy --port "$PROXY_PORT" --upstream "$BASE_URL" --log "$OUT/exchanges.jsonl" \
  2>"$OUT/proxy.log" &
PIDS+=($!)
: >"$OUT/exchanges.jsonl"
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null && break; sleep 0.1; done
PROXY="http://127.0.0.1:$PROXY_PORT"

# The task: a scratch repository with a one-line bug and a check for it.
REPO="$OUT/repo"
rm -rf "$REPO" && mkdir -p "$REPO"
cat >"$REPO/calc.py" <<'PY'
def subtract(a, b):
    """Return a minus b."""
    return a + b
PY
CHECK='from calc import subtract; assert subtract(5, 3) == 2 and subtract(0, 4) == -4'
git -C "$REPO" init -q
git -C "$REPO" add calc.py
git -C "$REPO" -c user.name=agent -c user.email=agent@localhost commit -qm "calc: subtract"
PROMPT="The function subtract in calc.py returns the wrong result: subtract(5, 3) should be 2. Fix the bug in calc.py."

# A scratch HOME, so no settings, sessions or credentials of this machine's user are read or written.
export HOME="$OUT/home"
mkdir -p "$HOME"
case "$CLIENT" in
  claude)
    export ANTHROPIC_BASE_URL="$PROXY" ANTHROPIC_API_KEY=unused ANTHROPIC_MODEL="$MODEL" \
      ANTHROPIC_SMALL_FAST_MODEL="$MODEL" ANTHROPIC_DEFAULT_HAIKU_MODEL="$MODEL" \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
      DISABLE_AUTOUPDATER=1 IS_SANDBOX=1  # IS_SANDBOX: it refuses to skip permissions as root otherwise
    COMMAND=("$BIN" -p "$PROMPT" --output-format json --dangerously-skip-permissions --model "$MODEL")
    ;;
  codex)
    export CODEX_HOME="$HOME/.codex"
    mkdir -p "$CODEX_HOME"
    cat >"$CODEX_HOME/config.toml" <<TOML
model_provider = "spindle"
model = "$MODEL"
[model_providers.spindle]
name = "Spindle"
base_url = "$PROXY/v1"
wire_api = "responses"
TOML
    COMMAND=("$BIN" exec --skip-git-repo-check --ephemeral --dangerously-bypass-approvals-and-sandbox --color never
      -m "$MODEL" "$PROMPT")
    ;;
  qwen)
    COMMAND=("$BIN" --yolo -o json --auth-type openai --openai-base-url "$PROXY/v1" --openai-api-key unused
      -m "$MODEL" "$PROMPT")
    ;;
esac

echo "running $CLIENT (limit ${TIMEOUT}s, output in $OUT)" >&2
START=$(date +%s)
set +e
(cd "$REPO" && timeout --kill-after=10 "$TIMEOUT" "${COMMAND[@]}" </dev/null >"$OUT/client.out" 2>"$OUT/client.err")
STATUS=$?
set -e
WALL=$(( $(date +%s) - START ))
[ "$STATUS" = 124 ] && echo "$CLIENT ran past ${TIMEOUT}s and was stopped" >&2
FIXED=no
(cd "$REPO" && python3 -c "$CHECK" 2>/dev/null) && FIXED=yes
echo "client output (tail): $(tail -c 600 "$OUT/client.out")" >&2
echo "--- diff"; git -C "$REPO" diff --stat; git -C "$REPO" diff | head -20
echo "--- verdict ($CLIENT against $BASE_URL, $OUT)"
python3 "$HERE/record.py" verdict --log "$OUT/exchanges.jsonl" --exit-status "$STATUS" --fixed "$FIXED" --wall "$WALL"
