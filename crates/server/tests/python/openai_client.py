"""Drives a running Spindle server with the official `openai` Python client, unchanged.

Usage: python openai_client.py BASE_URL   (e.g. http://127.0.0.1:8080)
Exits non-zero with the failing assertion on any mismatch.
"""

import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed")
model = client.models.list().data[0].id
assert model == "smollm2-135m", model

messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True}, logprobs=True, top_logprobs=2,
)
text, finish, usage, logprob_tokens = "", None, None, 0
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        if choice.logprobs and choice.logprobs.content:
            logprob_tokens += len(choice.logprobs.content)
        finish = choice.finish_reason or finish
assert "Paris" in text, text
assert finish in ("stop", "length"), finish
assert usage is not None and usage.completion_tokens == logprob_tokens > 0, (usage, logprob_tokens)

whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
assert whole.choices[0].message.content == text, (whole.choices[0].message.content, text)
assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
assert "Paris" in completion.choices[0].text, completion.choices[0].text

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert "no-such-model" in str(e), e
try:
    client.chat.completions.create(model=model, messages=[])
    raise AssertionError("empty messages were accepted")
except openai.BadRequestError as e:
    assert "messages" in str(e), e

print("openai client: ok")
