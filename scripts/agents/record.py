#!/usr/bin/env python3
"""A recording reverse proxy between a coding agent and an LLM server, and the verdict on what it
recorded. Standard library only.

  record.py proxy --port P --upstream URL --log FILE   forward every request to URL, streaming
      responses through unbuffered (server-sent events arrive as the server sends them), and
      append one JSON line per exchange to FILE: method, path, status, both bodies, timings, and
      whether the client hung up first (then the upstream connection is closed too, so the
      server sees the drop as it would without the proxy).
  record.py verdict --log FILE [--exit-status N] [--fixed yes|no] [--wall S]   print the verdict.
  record.py fixture --log FILE --out JSON --model M --run-dir DIR   the first model request as a
      replay fixture (crates/server/tests/data/agents/).
"""
import argparse
import collections
import gzip
import http.client
import http.server
import json
import re
import select
import socket
import sys
import threading
import time
import urllib.parse
import zlib

# Hop-by-hop headers, and the ones the proxy rewrites itself.
SKIP_REQUEST = {"host", "connection", "keep-alive", "transfer-encoding", "accept-encoding", "content-length",
                "proxy-connection", "te", "upgrade"}
SKIP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "content-length"}


# ---------------------------------------------------------------------------------------------
# The proxy


class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: urllib.parse.SplitResult
    log_lock = threading.Lock()
    log_path: str

    def log_message(self, *_):  # the JSONL log is the record; keep stderr quiet
        pass

    def do_GET(self):
        self.forward()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = do_GET

    def read_request_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length", 0) or 0))

    def forward(self):
        started = time.time()
        body = self.read_request_body()
        record = {"time": started, "method": self.command, "path": self.path,
                  "request_headers": {k.lower(): v for k, v in self.headers.items()
                                      if k.lower() not in ("authorization", "x-api-key")},
                  "request": decode_body(body, self.headers.get("content-encoding"))}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in SKIP_REQUEST}
        headers["Content-Length"] = str(len(body))
        base = self.upstream.path.rstrip("/")
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port or 80, timeout=3600)
        chunks, done, hung_up = [], threading.Event(), threading.Event()
        try:
            conn.request(self.command, base + self.path, body=body if body or self.command not in ("GET", "HEAD") else None,
                         headers=headers)
            threading.Thread(target=watch_client, args=(self.connection, conn, done, hung_up), daemon=True).start()
            response = conn.getresponse()
            record["status"] = response.status
            record["response_headers"] = {k.lower(): v for k, v in response.getheaders()}
            record["first_byte_s"] = round(time.time() - started, 3)
            self.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in SKIP_RESPONSE:
                    self.send_header(key, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            while self.command != "HEAD":
                chunk = response.read1(65536)
                if chunk:
                    chunks.append(chunk)
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    hung_up.set()
                    break
                if not chunk:
                    break
        except OSError as error:
            record["error"] = f"{type(error).__name__}: {error}"
        finally:
            done.set()  # stops the watcher
            conn.close()
        raw = b"".join(chunks)
        record["client_gone"] = hung_up.is_set()
        record["response"] = decode_body(raw, record.get("response_headers", {}).get("content-encoding"))
        record["duration_s"] = round(time.time() - started, 3)
        with self.log_lock, open(self.log_path, "a") as log:
            log.write(json.dumps(record) + "\n")


def watch_client(client: socket.socket, upstream: http.client.HTTPConnection, done: threading.Event,
                 hung_up: threading.Event):
    """Closes the upstream connection when the client hangs up while the server is still working
    (a non-streamed request sends nothing until it ends, so no write would notice)."""
    while not done.is_set():
        readable, _, _ = select.select([client], [], [], 0.5)
        if readable and not done.is_set():
            try:
                if client.recv(1, socket.MSG_PEEK) == b"":
                    hung_up.set()
                    if upstream.sock:
                        upstream.sock.shutdown(socket.SHUT_RDWR)
                    return
            except OSError:
                return
            time.sleep(0.5)  # pipelined bytes, not a hang-up: look again later


def decode_body(raw: bytes, encoding):
    encoding = (encoding or "").lower()
    try:
        if encoding == "gzip":
            raw = gzip.decompress(raw)
        elif encoding == "deflate":
            raw = zlib.decompress(raw)
    except Exception:
        return {"undecodable": encoding, "bytes": len(raw)}
    if encoding in ("br", "zstd"):
        return {"undecodable": encoding, "bytes": len(raw)}
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return text


def run_proxy(args):
    Recorder.upstream = urllib.parse.urlsplit(args.upstream)
    Recorder.log_path = args.log
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Recorder)
    server.daemon_threads = True
    print(f"recording proxy on 127.0.0.1:{args.port} -> {args.upstream}", file=sys.stderr, flush=True)
    server.serve_forever()


# ---------------------------------------------------------------------------------------------
# The verdict


def sse_events(text: str):
    """(event name or None, data text) for each event of a server-sent-event body."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            yield name, "\n".join(data)


class Findings:
    def __init__(self):
        self.malformed = []  # (exchange number, problem)
        self.tool_calls = []  # (exchange number, tool name, call id)
        self.text_tool_calls = []  # (exchange number, snippet): a call that reached the client as text
        self.cut = 0  # streams the client hung up on


def check_messages_stream(n, events, findings, complete):
    """Anthropic Messages: message_start, blocks (start, deltas of the block's kind, stop) by index,
    message_delta, message_stop; ping anywhere; the event name is the data's type."""
    delta_kinds = {"text": {"text_delta", "citations_delta"}, "tool_use": {"input_json_delta"},
                   "thinking": {"thinking_delta", "signature_delta"}, "redacted_thinking": set()}
    phase, open_block, next_index, tool_args = "start", None, 0, {}
    for name, data in events:
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            findings.malformed.append((n, f"data is not JSON: {data[:80]!r}"))
            continue
        kind = event.get("type")
        bad = lambda why: findings.malformed.append((n, f"{kind}: {why}"))
        if name is not None and name != kind:
            bad(f"event name {name!r} differs from type")
        if kind == "ping":
            continue
        if kind == "error":
            bad(f"error event {event.get('error')}")
        elif kind == "message_start":
            if phase != "start":
                bad("not first")
            usage = event.get("message", {}).get("usage", {})
            if not isinstance(usage.get("input_tokens"), int):
                bad("no usage.input_tokens")
            phase = "blocks"
        elif kind == "content_block_start":
            index, block = event.get("index"), event.get("content_block", {})
            if phase != "blocks" or open_block is not None or index != next_index:
                bad(f"index {index} out of order")
            open_block = (index, block.get("type"))
            if block.get("type") == "tool_use":
                if not block.get("id") or not block.get("name"):
                    bad("tool_use without id or name")
                tool_args[index] = (block.get("name"), block.get("id"), "")
        elif kind == "content_block_delta":
            delta_type = event.get("delta", {}).get("type")
            if open_block is None or event.get("index") != open_block[0]:
                bad(f"delta for index {event.get('index')} outside its block")
            elif delta_type not in delta_kinds.get(open_block[1], set()):
                bad(f"{delta_type} inside a {open_block[1]} block")
            if delta_type == "input_json_delta" and event.get("index") in tool_args:
                tool_name, call_id, args = tool_args[event["index"]]
                tool_args[event["index"]] = (tool_name, call_id, args + event["delta"].get("partial_json", ""))
            if delta_type == "text_delta" and "<tool_call>" in event["delta"].get("text", ""):
                findings.text_tool_calls.append((n, event["delta"]["text"][:80]))
        elif kind == "content_block_stop":
            if open_block is None or event.get("index") != open_block[0]:
                bad(f"stop for index {event.get('index')} that is not open")
            else:
                next_index, open_block = open_block[0] + 1, None
        elif kind == "message_delta":
            if open_block is not None or phase != "blocks":
                bad("while a block is open or before message_start")
            if not event.get("delta", {}).get("stop_reason"):
                bad("no stop_reason")
            phase = "delta"
        elif kind == "message_stop":
            if phase != "delta":
                bad("before message_delta")
            phase = "stopped"
        else:
            bad("unknown event type")
    for tool_name, call_id, args in tool_args.values():
        try:
            json.loads(args or "{}")
        except json.JSONDecodeError:
            findings.malformed.append((n, f"tool_use {tool_name} arguments are not JSON: {args[:80]!r}"))
        findings.tool_calls.append((n, tool_name, call_id))
    if complete and phase != "stopped":
        findings.malformed.append((n, "stream ended without message_stop"))


def check_responses_stream(n, events, findings, complete):
    """OpenAI Responses: sequence numbers 0, 1, 2, …; response.created first; a terminal
    response.completed / failed / incomplete last; function calls with a call_id and a name."""
    expected_seq, terminal, first = 0, None, True
    for name, data in events:
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            findings.malformed.append((n, f"data is not JSON: {data[:80]!r}"))
            continue
        kind = event.get("type", "")
        bad = lambda why: findings.malformed.append((n, f"{kind}: {why}"))
        if name is not None and name != kind:
            bad(f"event name {name!r} differs from type")
        if "sequence_number" not in event:
            findings.malformed.append((n, "an event without sequence_number"))
        elif event["sequence_number"] != expected_seq:
            bad(f"sequence_number {event['sequence_number']}, expected {expected_seq}")
        expected_seq = (event.get("sequence_number") or expected_seq) + 1
        if first and kind != "response.created":
            bad("first event is not response.created")
        first = False
        if terminal:
            bad(f"after {terminal}")
        if not kind.startswith("response."):
            bad("unknown event type")
        if kind in ("response.completed", "response.failed", "response.incomplete"):
            terminal = kind
            if kind == "response.completed" and not isinstance(event.get("response", {}).get("usage"), dict):
                bad("no usage")
        if kind == "response.output_item.done":
            item = event.get("item", {})
            if item.get("type") == "function_call":
                if not item.get("call_id") or not item.get("name"):
                    bad("function_call without call_id or name")
                try:
                    json.loads(item.get("arguments") or "{}")
                except json.JSONDecodeError:
                    bad(f"arguments are not JSON: {item.get('arguments', '')[:80]!r}")
                findings.tool_calls.append((n, item.get("name"), item.get("call_id")))
            if item.get("type") == "message":
                text = "".join(part.get("text", "") for part in item.get("content", []))
                if "<tool_call>" in text:
                    findings.text_tool_calls.append((n, text[:80]))
    if complete and not terminal:
        findings.malformed.append((n, "stream ended without response.completed"))


def check_chat_stream(n, events, findings, complete):
    """Chat Completions: chat.completion.chunk objects, then [DONE]; each tool call's first piece
    carries its id and function name."""
    done, calls, text = False, {}, ""
    for _, data in events:
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            findings.malformed.append((n, f"data is not JSON: {data[:80]!r}"))
            continue
        if done:
            findings.malformed.append((n, "chunk after [DONE]"))
        if "error" in chunk:
            findings.malformed.append((n, f"error event {chunk['error']}"))
            continue
        if chunk.get("object") != "chat.completion.chunk":
            findings.malformed.append((n, f"object {chunk.get('object')!r}"))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                index = call.get("index")
                if index not in calls:
                    if not call.get("id") or not call.get("function", {}).get("name"):
                        findings.malformed.append((n, f"tool call {index} starts without id or name"))
                    calls[index] = [call.get("function", {}).get("name"), call.get("id"), ""]
                calls[index][2] += call.get("function", {}).get("arguments") or ""
    for tool_name, call_id, args in calls.values():
        try:
            json.loads(args or "{}")
        except json.JSONDecodeError:
            findings.malformed.append((n, f"tool call {tool_name} arguments are not JSON: {args[:80]!r}"))
        findings.tool_calls.append((n, tool_name, call_id))
    if "<tool_call>" in text:
        findings.text_tool_calls.append((n, text[:80]))
    if complete and not done:
        findings.malformed.append((n, "stream ended without [DONE]"))


def whole_tool_calls(n, path, body, findings):
    """Tool calls in a non-streamed response."""
    if not isinstance(body, dict):
        return
    if path.startswith("/v1/messages"):
        for block in body.get("content") or []:
            if block.get("type") == "tool_use":
                findings.tool_calls.append((n, block.get("name"), block.get("id")))
            if block.get("type") == "text" and "<tool_call>" in block.get("text", ""):
                findings.text_tool_calls.append((n, block["text"][:80]))
    elif path.startswith("/v1/responses"):
        for item in body.get("output") or []:
            if item.get("type") == "function_call":
                findings.tool_calls.append((n, item.get("name"), item.get("call_id")))
    elif path.startswith("/v1/chat/completions"):
        for choice in body.get("choices") or []:
            for call in choice.get("message", {}).get("tool_calls") or []:
                findings.tool_calls.append((n, call.get("function", {}).get("name"), call.get("id")))


def answered_call_ids(request):
    """Call ids a request sends results for: the client ran those calls as tools."""
    ids = set()
    if not isinstance(request, dict):
        return ids
    for message in request.get("messages") or []:  # Messages and Chat Completions
        if message.get("role") == "tool" and message.get("tool_call_id"):
            ids.add(message["tool_call_id"])
        if isinstance(message.get("content"), list):
            ids |= {b.get("tool_use_id") for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_result"}
    if isinstance(request.get("input"), list):  # Responses
        ids |= {i.get("call_id") for i in request["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"}
    ids.discard(None)
    return ids


def verdict(args):
    records = [json.loads(line) for line in open(args.log)] if args.log else []
    findings = Findings()
    by_endpoint = collections.Counter()
    statuses_bad = []
    answered = set()
    for n, rec in enumerate(records, 1):
        path = urllib.parse.urlsplit(rec["path"]).path
        status = rec.get("status", "client hung up first" if rec.get("client_gone") else "no response")
        by_endpoint[(rec["method"], path, status)] += 1
        if status == "no response" or isinstance(status, int) and status >= 400:
            statuses_bad.append((n, rec["method"], rec["path"], status, str(rec.get("response"))[:300]))
        answered |= answered_call_ids(rec.get("request"))
        content_type = rec.get("response_headers", {}).get("content-type", "")
        if content_type.startswith("text/event-stream") and rec.get("client_gone"):
            findings.cut += 1
        if content_type.startswith("text/event-stream") and isinstance(rec.get("response"), str):
            events = list(sse_events(rec["response"]))
            complete = not rec.get("client_gone")
            if path.startswith("/v1/messages"):
                check_messages_stream(n, events, findings, complete)
            elif path.startswith("/v1/responses"):
                check_responses_stream(n, events, findings, complete)
            else:
                check_chat_stream(n, events, findings, complete)
        elif status == 200:
            whole_tool_calls(n, path, rec.get("response"), findings)

    print(f"exchanges: {len(records)}")
    for (method, path, status), count in sorted(by_endpoint.items(), key=str):
        print(f"  {method:<6} {path:<32} {status}  x{count}")
    for n, method, path, status, body in statuses_bad:
        print(f"  ! #{n} {method} {path} -> {status}: {body}")
    durations = [(n, rec.get("duration_s", 0), rec.get("client_gone")) for n, rec in enumerate(records, 1)
                 if rec["method"] == "POST"]
    if durations:
        print("request durations (s): " + ", ".join(f"#{n} {d:.0f}{' (client hung up)' if gone else ''}" for n, d, gone in durations))
    print(f"streams cut by the client: {findings.cut}")
    print(f"malformed stream events: {len(findings.malformed)}")
    kinds = collections.defaultdict(list)  # the same problem on many events is one line
    for n, problem in findings.malformed:
        kinds[re.sub(r"\d+", "N", problem)].append((n, problem))
    for seen in list(kinds.values())[:20]:
        n, problem = seen[0]
        print(f"  ! #{n} {problem}" + (f" (and {len(seen) - 1} more like it)" if len(seen) > 1 else ""))
    ran = [call for call in findings.tool_calls if call[2] in answered]
    print(f"tool calls sent: {len(findings.tool_calls)}, answered by the client as tool results: {len(ran)}")
    for n, tool_name, call_id in findings.tool_calls:
        print(f"  #{n} {tool_name} ({call_id}){' -> result sent back' if call_id in answered else ''}")
    if findings.text_tool_calls:
        print(f"tool calls that reached the client as text: {len(findings.text_tool_calls)}")
    if args.fixed is not None:
        print(f"bug fixed: {args.fixed}")
    if args.exit_status is not None:
        print(f"client exit status: {args.exit_status}")
    if args.wall is not None:
        print(f"wall time: {args.wall} s")
    ok = bool(records) and not statuses_bad and not findings.malformed and args.exit_status in (None, 0)
    print("VERDICT: " + ("PASS (every exchange 2xx, well-formed streams, client exit 0)" if ok else "FAIL"))
    return 0 if ok else 1


def fixture(args):
    """The first model request of a recorded run as a replay fixture: the served model's name
    replaced by --model, and the run's folder (which the client puts in its prompt as the working
    directory) by a fixed path."""
    for line in open(args.log):
        rec = json.loads(line)
        if rec["method"] == "POST" and isinstance(rec.get("request"), dict) and "model" in rec["request"]:
            text = json.dumps(rec["request"], indent=1, ensure_ascii=False)
            text = text.replace(json.dumps(rec["request"]["model"]), json.dumps(args.model))
            run_dir = args.run_dir.rstrip("/")
            text = text.replace(run_dir, "/tmp/agent").replace(run_dir.replace("/", "-"), "-tmp-agent")
            open(args.out, "w").write(text + "\n")
            print(f"{args.out}: {urllib.parse.urlsplit(rec['path']).path}, {len(text)} bytes", file=sys.stderr)
            return
    sys.exit("no model request in the log")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    proxy = sub.add_parser("proxy")
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--upstream", required=True)
    proxy.add_argument("--log", required=True)
    report = sub.add_parser("verdict")
    report.add_argument("--log", required=True)
    report.add_argument("--exit-status", type=int)
    report.add_argument("--fixed")
    report.add_argument("--wall")
    replay = sub.add_parser("fixture")
    replay.add_argument("--log", required=True)
    replay.add_argument("--out", required=True)
    replay.add_argument("--model", required=True)
    replay.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    if args.command == "proxy":
        run_proxy(args)
    elif args.command == "fixture":
        fixture(args)
    else:
        sys.exit(verdict(args))


if __name__ == "__main__":
    main()
