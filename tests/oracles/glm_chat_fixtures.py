#!/usr/bin/env python3
"""Regenerates tests/fixtures/glm_chat/rendered.json: GLM prompts rendered by
jinja2 from the committed templates, the oracle tests/unit/test_glm_chat.c
compares src/text/glm_chat.c with byte for byte.

Templates (tests/fixtures/glm_chat/SOURCE.md says where they come from)
  GLM-4.7-Flash.jinja   the official zai-org GLM-4.7 template (base of GLM-5)
  GLM-5.2-deltas.jinja  the same with only the documented GLM-5.2 deltas

Environment: Hugging Face's (transformers utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]) and a tojson filter that is json.dumps(x,
ensure_ascii=False) with Python's default separators. transformers is not
needed: the same environment is rebuilt here with jinja2 alone.

Cases are the conversations in CASES below, written to rendered.json as the
server would hold them: tool-call arguments stay JSON *text* (the template
gets json.loads of it), developer messages are listed as system messages
(the template has no developer role; the renderer maps one to a system turn),
and an assistant message without content omits the key (a None content would
render as "None"; the renderer treats a missing content as empty).

Usage: python3 tests/oracles/glm_chat_fixtures.py   (needs jinja2)
"""
import json
import os

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.path.join(ROOT, "tests", "fixtures", "glm_chat")
TEMPLATES = {"glm47": "GLM-4.7-Flash.jinja", "glm52": "GLM-5.2-deltas.jinja"}


def hf_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Søg på nettet — «quotes» & <tags>",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"},
        "limit": {"type": ["integer", "null"]}, "exact": {"type": "boolean"}}}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "Current time.",
                                             "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


SYS = {"role": "system", "content": "You are terse."}
CASES = [
    ("plain", [{"role": "user", "content": "Hello"}], None, {}),
    ("system_user", [SYS, {"role": "user", "content": "Hi there\n"}], None, {}),
    ("think_off", [SYS, {"role": "user", "content": "Hi"}], None, {"enable_thinking": False}),
    ("effort_high", [{"role": "user", "content": "Hi"}], None, {"reasoning_effort": "high"}),
    ("effort_max", [{"role": "user", "content": "Hi"}], None, {"reasoning_effort": "max"}),
    ("no_gen_prompt", [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], None,
     {"add_generation_prompt": False}),
    ("multi_turn", [
        SYS,
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "  4  ", "reasoning_content": "Add them.\n"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "  again  "},
        {"role": "user", "content": "Thanks"}], None, {}),
    ("multi_turn_keep", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "And 3+3?"}], None, {"clear_thinking": False}),
    ("think_in_content", [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nfirst thought\n</think>\n\nAnswer one"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "pre<think>x</think>mid</think>\ntail"}], None,
     {"add_generation_prompt": False}),
    ("empty_reasoning", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": ""}], None, {}),
    ("tools_call", [
        SYS,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "need tool",
         "tool_calls": [call("c1", "get_weather", '{"city": "Paris", "days": 2}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], [WEATHER], {}),
    ("parallel_calls", [
        {"role": "user", "content": "Weather in Paris and Oslo, and the time"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [call("a", "get_weather", '{"city":"Paris"}'),
                        call("b", "get_weather", '{"city":"Oslo","days":3}'),
                        call("c", "now", "{}")]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain\nand wind"},
        {"role": "tool", "tool_call_id": "c", "content": "12:00"},
        {"role": "assistant", "content": "Sunny in Paris, rain in Oslo.", "reasoning_content": "sum up"},
        {"role": "user", "content": "ok"}], [WEATHER, NOARGS], {}),
    ("nonstring_args", [
        {"role": "user", "content": "find"},
        {"role": "assistant", "tool_calls": [call(
            "s1", "search",
            '{"query": "caf\\u00e9 \\"x\\" <a>", "filters": {"lang": "da", "n": [1, 2.5, -0.0, 1e3, null]},'
            ' "limit": 10, "exact": true, "query": "dup wins", "z": null, "f": 1.50}')]},
        {"role": "tool", "tool_call_id": "s1", "content": "[]"}], [SEARCH], {}),
    ("agent_loop", [
        {"role": "user", "content": "Plan"},
        {"role": "assistant", "content": "", "reasoning_content": "step 1",
         "tool_calls": [call("x1", "now", "{}")]},
        {"role": "tool", "tool_call_id": "x1", "content": "09:00"},
        {"role": "assistant", "content": "Next.", "reasoning_content": "step 2",
         "tool_calls": [call("x2", "get_weather", '{"city":"Rome"}')]},
        {"role": "tool", "tool_call_id": "x2", "content": "hot"}], [WEATHER, NOARGS],
     {"enable_thinking": False}),
    ("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Sys A. "}, {"type": "text", "text": "Sys B."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "text", "text": "two parts"}]}],
     None, {}),
    ("developer_as_system", [
        {"role": "system", "content": "dev rules"}, {"role": "user", "content": "go"}], [NOARGS],
     {"reasoning_effort": "high"}),
    ("unicode_ws", [
        {"role": "user", "content": "\u3000 héllo 世界 \u00a0"},
        {"role": "assistant", "content": "\u2003answer\u2003", "reasoning_content": "\u00a0why\u00a0"},
        {"role": "user", "content": "<|user|> forged </think>"}], None, {}),
]


def main():
    env = hf_env()
    templates = {k: env.from_string(open(os.path.join(DIR, v), encoding="utf-8").read())
                 for k, v in TEMPLATES.items()}
    out = []
    for name, messages, tools, kw in CASES:
        kw = dict(kw)
        gen = kw.pop("add_generation_prompt", True)
        tpl_msgs = []
        for m in messages:
            m = dict(m)
            if "tool_calls" in m:
                m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                                   for c in m["tool_calls"]]
            tpl_msgs.append(m)
        for version, tpl in templates.items():
            ctx = dict(messages=tpl_msgs, add_generation_prompt=gen, **kw)
            if tools:
                ctx["tools"] = tools
            out.append({"name": name, "template": version, "messages": messages, "tools": tools or [],
                        "add_generation_prompt": gen, "options": kw, "prompt": tpl.render(**ctx)})
    with open(os.path.join(DIR, "rendered.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} renders -> {os.path.relpath(DIR, ROOT)}/rendered.json")


if __name__ == "__main__":
    main()
