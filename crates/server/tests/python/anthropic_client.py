"""Drives a running Spindle server's Messages API with the official `anthropic` Python client.

Usage: python anthropic_client.py BASE_URL THINKING_BASE_URL QWEN_BASE_URL
(SmolLM2, the tests' tiny random model thinking by default, Qwen2.5 for tools).
Exits non-zero with the failing assertion on any mismatch.
"""

import sys

import anthropic

base, thinking_base, qwen_base = sys.argv[1:4]
# This SDK has no sampling arguments; the server still reads `temperature` from the body.
greedy = {"temperature": 0}


def blocks(message):
    """A message's blocks as plain dicts (the streamed message has the SDK's parsed block types)."""
    fields = {"type", "text", "thinking", "signature", "name", "input"}
    return [block.model_dump(include=fields) for block in message.content]


question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]

# Text, whole.
client = anthropic.Anthropic(base_url=base, api_key="unused")
whole = client.messages.create(model="smollm2-135m", max_tokens=24, extra_body=greedy, messages=question)
assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_"), whole
assert [block.type for block in whole.content] == ["text"], whole
assert "Paris" in whole.content[0].text, whole
assert whole.stop_reason in ("end_turn", "max_tokens"), whole
charged = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
assert client.messages.count_tokens(model="smollm2-135m", messages=question).input_tokens == charged, whole.usage

# The same, streamed: the SDK's text stream and its accumulated message match the whole one.
with client.messages.stream(model="smollm2-135m", max_tokens=24, extra_body=greedy, messages=question) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text == whole.content[0].text, (text, whole)
assert blocks(final) == blocks(whole) and final.stop_reason == whole.stop_reason, (final, whole)
assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)

# The raw events, in Anthropic's order (the SDK drops pings).
kinds = [event.type for event in client.messages.create(
    model="smollm2-135m", max_tokens=8, extra_body=greedy, messages=question, stream=True)]
assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop", kinds

# Errors become the SDK's exception types.
try:
    client.messages.create(model="claude-opus-4", max_tokens=8, messages=question)
    raise AssertionError("an unknown model was served")
except anthropic.NotFoundError as error:
    assert error.body["error"]["type"] == "not_found_error", error.body
try:
    image = {"type": "image", "source": {"type": "url", "url": "http://example.invalid/cat.png"}}
    client.messages.create(model="smollm2-135m", max_tokens=8, messages=[{"role": "user", "content": [image]}])
    raise AssertionError("an image was accepted")
except anthropic.BadRequestError as error:
    assert "image" in error.message, error.message

# Thinking: a signed thinking block before the text, streamed as the SDK accumulates it.
thinker = anthropic.Anthropic(base_url=thinking_base, api_key="unused")
request = dict(model="tiny-random", max_tokens=60, extra_body=greedy, thinking={"type": "enabled", "budget_tokens": 20},
               messages=[{"role": "user", "content": "What is the capital of Japan?"}])
thought = thinker.messages.create(**request)
assert [block.type for block in thought.content] == ["thinking", "text"], thought
assert thought.content[0].thinking and thought.content[0].signature, thought
with thinker.messages.stream(**request) as stream:
    streamed = stream.get_final_message()
assert blocks(streamed) == blocks(thought), (streamed, thought)

# A tool round trip on Qwen2.5: a forced call, the same call streamed, the result, an answer.
qwen = anthropic.Anthropic(base_url=qwen_base, api_key="unused")
tools = [{
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
request = dict(model="qwen2.5-coder-0.5b", max_tokens=40, extra_body=greedy, tools=tools, messages=messages)
first = qwen.messages.create(tool_choice={"type": "any"}, **request)
assert first.stop_reason == "tool_use", first
call = next(block for block in first.content if block.type == "tool_use")
assert call.name == "get_weather" and "Paris" in call.input["city"] and call.id.startswith("toolu_"), call
with qwen.messages.stream(tool_choice={"type": "any"}, **request) as stream:
    streamed = stream.get_final_message()
streamed_call = next(block for block in streamed.content if block.type == "tool_use")
assert (streamed_call.name, streamed_call.input) == (call.name, call.input), (streamed, first)

messages += [
    {"role": "assistant", "content": first.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees Celsius."}]},
]
answer = qwen.messages.create(tool_choice={"type": "none"}, **dict(request, max_tokens=30, messages=messages))
assert [block.type for block in answer.content] == ["text"] and answer.content[0].text.strip(), answer
print("ok")
