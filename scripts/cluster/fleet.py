"""The fleet workload of issue 40: 8 simulated agents x 5 turns, each with its own ~2K-token
system prompt and X-Session-ID, against 2 Spindle replicas behind vllm-router, per policy;
then one replica killed mid-run, then a rolling restart under a steady load (each replica taken
out of the router's rotation, drained by SIGTERM, restarted, put back). Prints a table.

Usage: python3 scripts/cluster/fleet.py SPINDLE_BIN [MODEL]   (vllm-router on PATH or in
$SPINDLE_HOME/venv-vllm-router). Standard library only.
"""

import json, os, signal, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

SPINDLE, MODEL = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m")
HOME = os.environ.get("SPINDLE_HOME", os.path.expanduser("~/.cache/spindle"))
ROUTER = os.path.join(HOME, "venv-vllm-router/bin/vllm-router")
LOGS = tempfile.mkdtemp(prefix="spindle-fleet-")
AGENTS, TURNS, BASE, EVENTS = 8, 5, 18200, 18400


def wait_health(url, proc=None, bound=600):
    start = time.time()
    while time.time() - start < bound:
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return
        except Exception:
            pass
        assert proc is None or proc.poll() is None, f"{url} exited"
        time.sleep(0.3)
    raise TimeoutError(url)


def replica(i):
    log = open(f"{LOGS}/replica-{i}.log", "a")
    args = [SPINDLE, "serve", "--model", MODEL, "--port", str(BASE + i), "--threads", "1",
            "--batch-dir", f"{LOGS}/batches-{i}", "--shutdown-grace-seconds", "120",
            "--kv-events-endpoint", f"tcp://127.0.0.1:{EVENTS + 2 * i}",
            "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{EVENTS + 2 * i + 1}"]
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    wait_health(f"http://127.0.0.1:{BASE + i}", proc)
    return proc


def router(policy, urls, port):
    log = open(f"{LOGS}/router-{policy}.log", "a")
    args = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
            "--policy", policy, "--health-check-interval-secs", "1"]
    if policy == "kv_aware":
        # The router follows each replica's KV-cache events (and replays what it missed).
        for i, url in enumerate(urls):
            args += ["--kv-event-source", f"{url}=tcp://127.0.0.1:{EVENTS + 2 * i}",
                     "--kv-event-replay-source", f"{url}=tcp://127.0.0.1:{EVENTS + 2 * i + 1}"]
        args += ["--kv-event-block-size", "16", "--kv-event-model", MODEL]
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    wait_health(f"http://127.0.0.1:{port}", proc)
    return proc


def system_prompt(agent):
    words = " ".join(f"rule{agent}.{i} keep tool output short;" for i in range(190))
    return f"You are agent {agent}. Follow these rules: {words}"


def call(base, agent, history):
    body = {"model": MODEL, "messages": history, "max_tokens": 16, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json",
                                      "X-Session-ID": f"agent-{agent}"})
    start, ttft, text, usage = time.time(), None, "", None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                if ttft is None and choice["delta"].get("content"):
                    ttft = time.time() - start
                text += choice["delta"].get("content") or ""
            usage = chunk.get("usage") or usage
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft or time.time() - start, cached, text


def workload(base, salt):
    results, errors = [], []

    def agent(a):
        history = [{"role": "system", "content": system_prompt(a)}]
        for turn in range(TURNS):
            history.append({"role": "user", "content": f"Step {turn} of task {salt}-{a}."})
            try:
                ttft, cached, text = call(base, a, history)
                results.append((ttft, cached))
                history.append({"role": "assistant", "content": text})
            except Exception as e:
                errors.append(repr(e))

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(AGENTS)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    ttfts = sorted(r[0] for r in results)
    p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")
    return sum(r[1] for r in results), p(0.5), p(0.95), errors


def main():
    rows = []
    single = replica(0)
    rows.append(("one replica alone", *workload(f"http://127.0.0.1:{BASE}", "single")))
    terminate(single)
    for n, policy in enumerate(["cache_aware", "kv_aware", "consistent_hash", "round_robin"]):
        procs = [replica(0), replica(1)]
        urls = [f"http://127.0.0.1:{BASE + i}" for i in range(2)]
        r = router(policy, urls, BASE + 50 + n)
        rows.append((f"2 replicas, {policy}", *workload(f"http://127.0.0.1:{BASE + 50 + n}", policy)))
        if policy == "consistent_hash":
            rows.append(kill_one(procs, f"http://127.0.0.1:{BASE + 50 + n}"))
        terminate(r, *procs)
    rows.append(rolling_restart_phase())
    print(f"{'run':56} {'cached tokens':>13} {'TTFT p50 s':>10} {'TTFT p95 s':>10} {'errors':>6}")
    for name, cached, p50, p95, errors in rows:
        print(f"{name:56} {cached:>13} {p50:>10.2f} {p95:>10.2f} {len(errors):>6}")
    for name, *_, errors in rows:
        for error in sorted(set(errors)):
            print(f"{name}: {errors.count(error)} x {error}")
    print(f"logs: {LOGS}")


def steady(base, stop, outcome):
    n = 0
    while not stop.is_set():
        try:
            call(base, 100 + n % 4, [{"role": "user", "content": f"ping {n}"}])
            outcome.append("ok")
        except Exception as e:
            outcome.append(repr(e))
        n += 1


def kill_one(procs, base):
    stop, outcome = threading.Event(), []
    load = threading.Thread(target=steady, args=(base, stop, outcome))
    load.start()
    time.sleep(5)
    procs[1].kill(); procs[1].wait()
    killed_at = len(outcome)
    time.sleep(20)
    stop.set(); load.join()
    failed_after = [o for o in outcome[killed_at + 4:] if o != "ok"]
    errors = [o for o in outcome if o != "ok"]
    return (f"kill 1 of 2 ({len(outcome)} calls; {len(failed_after)} failed after the first 4)",
            0, float("nan"), float("nan"), errors)


def terminate(*procs):
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait()


def rolling_restart_phase():
    """A rolling restart of a steady fleet, behind a router of its own: one that just saw a
    replica killed keeps that replica's circuit breaker open for a while and, with the other
    replica out of rotation, would have nowhere to send a request."""
    procs = [replica(0), replica(1)]
    base = f"http://127.0.0.1:{BASE + 60}"
    r = router("consistent_hash", [f"http://127.0.0.1:{BASE + i}" for i in range(2)], BASE + 60)
    row = rolling_restart(procs, base)
    terminate(r, *procs)
    return row


def router_workers(base, verb, i):
    """Takes replica i out of the router's rotation (`remove_worker`) or puts it back."""
    url = f"http://127.0.0.1:{BASE + i}"
    urllib.request.urlopen(urllib.request.Request(f"{base}/{verb}_worker?url={url}", b"",
                                                  method="POST"), timeout=30).read()


def rolling_restart(procs, base):
    """Each replica in turn: out of the router's rotation first, so no new request reaches it;
    SIGTERM, which lets the requests it still runs finish; a fresh start; back in once healthy."""
    stop, outcome = threading.Event(), []
    load = threading.Thread(target=steady, args=(base, stop, outcome))
    load.start()
    for i in range(2):
        router_workers(base, "remove", i)
        procs[i].send_signal(signal.SIGTERM)
        procs[i].wait()
        procs[i] = replica(i)
        router_workers(base, "add", i)
        time.sleep(3)
    stop.set(); load.join()
    errors = [o for o in outcome if o != "ok"]
    return (f"rolling restart ({len(outcome)} calls)", 0, float("nan"), float("nan"), errors)


if __name__ == "__main__":
    main()
