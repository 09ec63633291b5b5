"""Subscribes to a running Spindle server's KV-cache events with pyzmq and msgpack, as llm-d's
subscriber does, while it sends chat requests, and checks what the events say.

Usage: python kv_events_subscriber.py BASE_URL EVENTS_ENDPOINT REPLAY_ENDPOINT

1. Three prompts run before the subscriber connects: their batches are missed.
2. It connects and sends prompts until a batch arrives live, then asks the replay socket for
   everything from sequence 0: the missed range comes back, and the numbers have no gap.
3. More prompts than the server's small KV pool holds run, so the first ones are evicted.
4. Every BlockStored holds the token ids of a block of a prompt sent (or of its reply, past the
   prompt's end), its parent is a block stored before and not removed from the same medium,
   every BlockRemoved names stored blocks; the first prompts' blocks are removed from memory
   (medium "GPU", vLLM's name for the pool the model computes from) but their snapshot files
   keep them on disk (medium "STORAGE", written while the
   engine idles); and the server agrees: the first prompt sent again resumes from disk, the last
   finds its blocks.
Exits non-zero with the failing assertion on any mismatch.
"""

import json
import sys
import urllib.request

import msgpack
import zmq

BLOCK = 16
base, events_endpoint, replay_endpoint = sys.argv[1:4]


def post(path, body):
    request = urllib.request.Request(
        base + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def messages(n):
    # Distinct from the first token on, about 100 tokens each.
    words = " ".join(f"w{n}x{i}" for i in range(30))
    return [{"role": "user", "content": f"Prompt number {n}: {words}"}]


def chat(n):
    body = {"messages": messages(n), "max_tokens": 8, "temperature": 0}
    return post("/v1/chat/completions", body)


prompt_tokens = {}


def send(n):
    prompt_tokens[n] = post("/v1/tokenize", {"messages": messages(n)})["tokens"]
    usage = chat(n)["usage"]
    assert usage["prompt_tokens"] == len(prompt_tokens[n]), (usage, len(prompt_tokens[n]))


# 1. Missed.
for n in range(3):
    send(n)

# 2. Live, then the missed range replayed.
context = zmq.Context()
sub = context.socket(zmq.SUB)
sub.connect(events_endpoint)
sub.setsockopt(zmq.SUBSCRIBE, b"")
batches = {}
topics = set()


def receive(timeout_ms):
    """One live message into `batches`; False when none came in time."""
    if not sub.poll(timeout_ms):
        return False
    topic, seq, payload = sub.recv_multipart()
    topics.add(topic.decode())
    batches[int.from_bytes(seq, "big")] = msgpack.unpackb(payload)
    return True


first_live = None
n = 3
while first_live is None:
    assert n < 40, "no live batch arrived"
    send(n)
    n += 1
    if receive(2000):
        first_live = min(batches)
assert first_live > 0, "the batches of the first prompts were missed"

replay = context.socket(zmq.DEALER)
replay.connect(replay_endpoint)


def replay_from(start):
    replay.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        assert replay.poll(10000), "the replay socket did not answer"
        _, seq, payload = replay.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            assert payload == b""
            return
        batches[int.from_bytes(seq, "big")] = msgpack.unpackb(payload)


replay_from(0)
assert 0 in batches and first_live - 1 in batches, sorted(batches)

# 3. Enough prompts to evict the first ones (the pool holds 48 blocks, each prompt ~7 + reply).
for _ in range(12):
    send(n)
    n += 1
    while receive(0):
        pass
last = n - 1
# A batch the engine published after the requests above is in the replay window by now.
replay_from(0)
seqs = sorted(batches)
assert seqs == list(range(len(seqs))), f"a gap in the sequence numbers: {seqs}"
assert topics <= {"kv@test-replica@tiny-random"}, topics

# 4. What the events say.
held = {"GPU": {}, "STORAGE": {}}  # medium -> hash -> token path from the first block
stored_in_prompts = 0
applied = 0


def apply_batches():
    """Applies the batches not applied yet, in sequence order, checking each event."""
    global applied, stored_in_prompts
    for seq in range(applied, max(batches) + 1):
        assert seq in batches, f"a gap at sequence number {seq}"
        timestamp, events, dp_rank = batches[seq]
        assert isinstance(timestamp, float) and dp_rank is None
        for event in events:
            tag = event[0]
            if tag == "BlockStored":
                _, hashes, parent, token_ids, block_size, lora_id, medium = event
                assert block_size == BLOCK and lora_id is None and medium in held, event
                assert len(token_ids) == len(hashes) * BLOCK, event
                on = held[medium]
                path = [] if parent is None else list(on[parent])
                for i, block_hash in enumerate(hashes):
                    assert block_hash not in on, f"{block_hash} stored twice on {medium}"
                    path = path + token_ids[i * BLOCK:(i + 1) * BLOCK]
                    on[block_hash] = path
                    # The path is a prompt's own tokens, up to that prompt's end (then its reply).
                    sources = [
                        p for p in prompt_tokens.values() if path[: len(p)] == p[: len(path)]
                    ]
                    assert sources, f"block {block_hash} matches no prompt: {path}"
                    stored_in_prompts += medium == "GPU" and any(len(path) <= len(p) for p in sources)
            elif tag == "BlockRemoved":
                _, hashes, medium = event
                assert medium in held, event
                for block_hash in hashes:
                    assert block_hash in held[medium], f"{block_hash} removed but not held"
                    del held[medium][block_hash]
            else:
                assert tag == "AllBlocksCleared", event
                held["GPU"].clear()
        applied = seq + 1


def held_blocks(n, medium):
    tokens = prompt_tokens[n]
    paths = set(tuple(path) for path in held[medium].values())
    return sum(tuple(tokens[: BLOCK * (k + 1)]) in paths for k in range(len(tokens) // BLOCK))


apply_batches()
assert stored_in_prompts >= 3 * 5, stored_in_prompts
assert held_blocks(0, "GPU") == 0, "the first prompt's blocks should have been evicted"
assert held_blocks(last, "GPU") == len(prompt_tokens[last]) // BLOCK, "the last prompt is cached"
# The writer writes while the engine idles: wait (bounded) for the first prompt's file.
for _ in range(300):
    if held_blocks(0, "STORAGE") == len(prompt_tokens[0]) // BLOCK:
        break
    receive(100)
    apply_batches()
assert held_blocks(0, "STORAGE") == len(prompt_tokens[0]) // BLOCK, "prompt 0 never reached the disk"
first_again = chat(0)["usage"]
cached_first = (first_again.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
# Evicted from memory, resumed from its file, as the events said it could be.
assert cached_first >= BLOCK * held_blocks(0, "STORAGE"), first_again
last_again = chat(last)["usage"]
assert last_again["prompt_tokens_details"]["cached_tokens"] >= BLOCK, last_again
print(
    f"kv events: {applied} batches ({first_live} missed and replayed), "
    f"{stored_in_prompts} prompt blocks stored, {len(held['GPU'])} held in memory and "
    f"{len(held['STORAGE'])} on disk at the end"
)
