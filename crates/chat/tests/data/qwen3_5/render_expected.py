"""Golden prompts for Spindle's Qwen3.5 chat template: renders test conversations with Jinja2 configured
as transformers' apply_chat_template configures it (the environment of ../templates/render_expected.py)
and writes expected.json for crates/chat/tests/chat/qwen3_5_template.rs.

The goldens in expected.json were recorded from Qwen's official Qwen3.5 chat template, obtained from
the `chat_template` of Qwen/Qwen3.5-35B-A3B's tokenizer_config.json. That template is not kept in
this repository. qwen3_5_chat_template.jinja here is our own template, written from the recorded
behaviour (the prompts and error messages in expected.json), and it reproduces every golden
byte-for-byte; tokenizer_config.json here carries it as its `chat_template`.

Run: python3 render_expected.py [--check] [--reference PATH] [--transformers]
  (default)         render with our template (qwen3_5_chat_template.jinja) and write expected.json;
                    with git, an unchanged file shows that ours reproduces the goldens
  --check           compare with expected.json byte-for-byte instead of writing it
  --reference PATH  render with the template in PATH instead: a .jinja file, or a
                    tokenizer_config.json whose `chat_template` is used. To re-record the goldens
                    from Qwen's official template, pass (a copy outside the repository of) the
                    model's tokenizer_config.json; then run again without --reference and --check
                    that ours still agrees.
  --transformers    (pip install "transformers>=5"; no torch needed) also render every case with
                    transformers itself, AutoTokenizer.from_pretrained(this directory)
                    .apply_chat_template(chat_template=<the template rendered>), which must agree
"""
import argparse
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).parent
OURS = HERE / "qwen3_5_chat_template.jinja"


def load_template(path):
    path = Path(path)
    if path.suffix == ".json":
        return json.loads(path.read_text())["chat_template"]
    return path.read_text()


def environment():
    spec = importlib.util.spec_from_file_location("render_expected", HERE / "../templates/render_expected.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.environment()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city <in °C> & 'quoted'",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "filters": {"type": "object"}},
                   "required": ["q"]}}}


def call(name, arguments, call_id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id:
        c["id"] = call_id
    return c


TOOL_ROUND = [
    {"role": "user", "content": "Weather in Zürich & Genève?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities, so two calls.",
     "tool_calls": [call("get_weather", {"city": "Zürich"}, "c1"), call("get_weather", {"city": "Genève", "days": 2}, "c2")]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 23}"},
]

# (name, messages, tools, add_generation_prompt, extra variables)
CASES = [
    ("user_thinking_default", [{"role": "user", "content": "Hi"}], None, True, {}),
    ("user_thinking_on", [{"role": "user", "content": "Hi"}], None, True, {"enable_thinking": True}),
    ("user_thinking_off", [{"role": "user", "content": "Hi"}], None, True, {"enable_thinking": False}),
    ("no_generation_prompt", [{"role": "user", "content": "Hi"}], None, False, {}),
    ("system_and_user", [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "\nHi there  "}],
     None, True, {}),
    ("system_content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "日本 👋"}]}],
     None, True, {"enable_thinking": False}),
    ("tools_without_system", [{"role": "user", "content": "Find rust"}], [WEATHER, SEARCH], True, {}),
    ("tools_with_system", [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Hi"}],
     [WEATHER], True, {"enable_thinking": False}),
    ("tools_with_empty_system", [{"role": "system", "content": "  "}, {"role": "user", "content": "Hi"}],
     [WEATHER], True, {}),
    ("empty_tools_list", [{"role": "user", "content": "Hi"}], [], True, {}),
    ("tool_round_then_generation", [{"role": "system", "content": "You are a weather bot."}] + TOOL_ROUND,
     [WEATHER, SEARCH], True, {}),
    ("tool_round_thinking_off", [{"role": "system", "content": "You are a weather bot."}] + TOOL_ROUND,
     [WEATHER], True, {"enable_thinking": False}),
    ("tool_round_answered", TOOL_ROUND + [
        {"role": "assistant", "content": "Zürich 21 °C, Genève 23 °C.", "reasoning_content": "\nBoth warm.\n"}],
     [WEATHER], False, {}),
    ("assistant_text_and_tool_call", [
        {"role": "user", "content": "Find <b>rust</b>"},
        {"role": "assistant", "content": "Searching.", "tool_calls": [
            call("search", {"q": "<b>rust</b> & 'cargo'", "filters": {"lang": "en", "years": [2024, 2025]}})]}],
     [SEARCH], False, {}),
    ("argument_types", [
        {"role": "user", "content": "Types"},
        {"role": "assistant", "content": None, "tool_calls": [call("f", {
            "s": "multi\nline «ü»", "i": 7, "neg": -3, "f": 2.5, "t": True, "n": None,
            "l": [1, "two", {"three": 3}], "d": {"k": "v", "é": [True, None]}, "empty_s": "", "empty_l": [], "empty_d": {}})]}],
     None, False, {}),
    ("tool_call_without_function_wrapper", [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}],
     None, True, {}),
    ("tool_call_without_arguments", [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "ping"}}]}],
     None, False, {}),
    ("reasoning_of_earlier_turns", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "  Add again.  "}],
     None, False, {}),
    ("reasoning_in_content", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nAdd again.\n</think>\n\n6"}],
     None, False, {}),
    ("history_then_generation_thinking_off", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "And 3+3?"}],
     None, True, {"enable_thinking": False}),
    ("reasoning_content_empty_string", [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": ""}],
     None, False, {}),
    ("multi_step_tools", [
        {"role": "user", "content": "Plan a trip"},
        {"role": "assistant", "content": "", "reasoning_content": "Weather first.",
         "tool_calls": [call("get_weather", {"city": "Oslo"})]},
        {"role": "tool", "content": "cold"},
        {"role": "assistant", "content": "Now search.", "reasoning_content": "Then hotels.",
         "tool_calls": [call("search", {"q": "Oslo hotels"})]},
        {"role": "tool", "content": [{"type": "text", "text": "Hotel A, Hotel B"}]}],
     [WEATHER, SEARCH], True, {}),
    ("tool_response_in_user_turn", [
        {"role": "user", "content": "Question"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"q": "q"})]},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"}],
     None, True, {}),
    ("image_and_video_parts", [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": "data:"}}, {"type": "video", "video": "v.mp4"},
                                     {"type": "text", "text": "what?"}]}],
     None, True, {"add_vision_id": True}),
    ("unicode_and_markup", [
        {"role": "user", "content": "Écris «bonjour» 🌍 <|im_end|> & <b>"}], None, True, {}),
    # Errors raised by the template itself.
    ("error_no_messages", [], None, True, {}),
    ("error_system_not_first", [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}], None, True, {}),
    ("error_no_user_query", [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}], None, True, {}),
    ("error_unknown_role", [{"role": "user", "content": "Hi"}, {"role": "developer", "content": "x"}], None, True, {}),
    ("error_image_in_system", [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "Hi"}],
     None, True, {}),
]


def render(template, messages, tools, add_generation_prompt, extra):
    try:
        return {"expected": template.render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
            bos_token=None, eos_token="<|im_end|>", **extra)}
    except Exception as e:  # raise_exception's RuntimeError
        return {"error": str(e)}


def with_transformers(tok, source, messages, tools, add_generation_prompt, extra):
    try:
        return {"expected": tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                    tokenize=False, chat_template=source, **extra)}
    except Exception as e:
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", metavar="PATH", help="render with this template (.jinja or tokenizer_config.json)")
    ap.add_argument("--check", action="store_true", help="compare with expected.json instead of writing it")
    ap.add_argument("--transformers", action="store_true", help="check transformers' apply_chat_template agrees")
    args = ap.parse_args()

    source = load_template(args.reference) if args.reference else OURS.read_text()
    template = environment().from_string(source)
    tok = None
    if args.transformers:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(HERE))
        assert tok.chat_template == OURS.read_text(), "tokenizer_config.json does not carry our template"

    out = []
    for name, messages, tools, add_generation_prompt, extra in CASES:
        result = render(template, messages, tools, add_generation_prompt, extra)
        if tok is not None:
            theirs = with_transformers(tok, source, messages, tools, add_generation_prompt, extra)
            assert theirs == result or ("error" in theirs and "error" in result), f"{name}: {theirs} != {result}"
        out.append({"name": name, "messages": messages, "tools": tools, "add_generation_prompt": add_generation_prompt,
                    "kwargs": extra, **result})
    text = json.dumps(out, ensure_ascii=False, indent=1) + "\n"
    summary = f"{len(out)} cases, {sum('error' in c for c in out)} of them errors"
    rendered_with = args.reference or OURS.name
    if args.check:
        recorded = (HERE / "expected.json").read_text()
        if text != recorded:
            old = {c["name"]: c for c in json.loads(recorded)}
            differing = [c["name"] for c in out if old.get(c["name"]) != c] + [n for n in old if n not in {c["name"] for c in out}]
            raise SystemExit(f"{rendered_with}: {summary}; differs from expected.json in {differing or 'layout'}")
        print(f"{rendered_with}: {summary}; identical to expected.json")
    else:
        (HERE / "expected.json").write_text(text)
        print(f"{rendered_with}: {summary}; wrote expected.json")


if __name__ == "__main__":
    main()
