"""Runs a batch on a Spindle server with the official `openai` Python client, unchanged:
upload, create, poll, list, download the output, cancel a second batch, delete the files.

Usage: python openai_batches.py BASE_URL   (e.g. http://127.0.0.1:8080)
Exits non-zero with the failing assertion on any mismatch.
"""

import io
import json
import sys
import time

import openai

client = openai.OpenAI(base_url=f"{sys.argv[1]}/v1", api_key="not-needed")
model = client.models.list().data[0].id
questions = {"capital": "What is the capital of France?", "colour": "Name a primary colour."}
lines = [
    {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": 12, "temperature": 0}}
    for cid, q in questions.items()
]
data = "".join(json.dumps(line) + "\n" for line in lines).encode()
upload = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
assert upload.purpose == "batch" and upload.bytes == len(data), upload
assert client.files.retrieve(upload.id).id == upload.id

batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"run": "sdk"})
assert batch.metadata == {"run": "sdk"} and batch.request_counts.total == 2, batch
deadline = time.time() + 600
while batch.status not in ("completed", "failed", "cancelled"):
    assert time.time() < deadline, batch
    time.sleep(0.2)
    batch = client.batches.retrieve(batch.id)
assert batch.status == "completed", batch
assert batch.request_counts.completed == 2 and batch.request_counts.failed == 0, batch
assert batch.error_file_id is None, batch

results = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
assert sorted(r["custom_id"] for r in results) == sorted(questions), results
for result in results:
    body = result["response"]["body"]
    assert result["response"]["status_code"] == 200 and body["object"] == "chat.completion", result
    live = client.chat.completions.create(model=model, messages=lines[0]["body"]["messages"] if result["custom_id"] == "capital"
                                          else lines[1]["body"]["messages"], max_tokens=12, temperature=0)
    assert body["choices"][0]["message"]["content"] == live.choices[0].message.content, (body, live)

listed = [b.id for b in client.batches.list(limit=10)]
assert batch.id in listed, listed

second = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
cancelled = client.batches.cancel(second.id)
assert cancelled.status in ("cancelling", "cancelled"), cancelled

try:
    client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")
    raise AssertionError("a batch over a missing file was accepted")
except openai.NotFoundError as e:
    assert "file-missing" in str(e), e
try:
    client.files.create(file=("bad.jsonl", io.BytesIO(b'{"custom_id": "x"}\n')), purpose="batch")
    raise AssertionError("a bad line was accepted")
except openai.BadRequestError as e:
    assert "line 1" in str(e), e

for file_id in (upload.id, batch.output_file_id):
    assert client.files.delete(file_id).deleted
try:
    client.files.retrieve(upload.id)
    raise AssertionError("a deleted file is still there")
except openai.NotFoundError:
    pass
print("openai batches: ok")
