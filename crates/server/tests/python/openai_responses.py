"""Drives a running Spindle server's Responses API with the official `openai` Python client.

Usage: python openai_responses.py BASE_URL   (e.g. http://127.0.0.1:8080)
Exits non-zero with the failing assertion on any mismatch.
"""

import json
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed")
model = client.models.list().data[0].id

# Text, whole: the SDK's own `output_text` joins the message parts.
whole = client.responses.create(
    model=model, input="What is the capital of France? Answer in one sentence.", max_output_tokens=24, temperature=0
)
assert whole.status == "completed", whole
assert "Paris" in whole.output_text, whole.output_text
assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens, whole.usage
assert client.responses.retrieve(whole.id).output_text == whole.output_text

# The same, streamed: typed events, numbered in order, ending in the whole response.
kinds, text, completed = [], "", None
with client.responses.stream(
    model=model, input="What is the capital of France? Answer in one sentence.", max_output_tokens=24, temperature=0
) as stream:
    for number, event in enumerate(stream):
        assert event.sequence_number == number, (event, number)
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    completed = stream.get_final_response()
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] == "response.completed", kinds
assert text == whole.output_text == completed.output_text, (text, whole.output_text)

# A function tool round trip: the call comes back with an id, its output goes back in.
tools = [{
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    # OpenAI's strict mode requires additionalProperties false; the grammar then allows no other key.
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
    "strict": True,
}]
question = [{"role": "user", "content": "What's the weather in Paris?"}]
called = client.responses.create(
    model=model, input=question, tools=tools, tool_choice="required", parallel_tool_calls=False,
    max_output_tokens=40, temperature=0, store=False,
)
calls = [item for item in called.output if item.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id, called
assert isinstance(json.loads(calls[0].arguments)["city"], str), calls[0].arguments
answer = client.responses.create(
    model=model,
    input=question + [calls[0].model_dump(exclude_none=True),
                      {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
    tools=tools, max_output_tokens=24, temperature=0,
)
assert answer.status in ("completed", "incomplete") and answer.output_text.strip(), answer

try:
    client.responses.retrieve(called.id)
    raise AssertionError("a response sent with store=False was kept")
except openai.NotFoundError:
    pass
try:
    client.responses.create(model=model, input=[{"type": "bogus"}])
    raise AssertionError("an unknown item type was accepted")
except openai.BadRequestError as e:
    assert "input[0].type" in str(e), e

print("openai responses: ok")
