"""ds4-server serving a GLM demo model through the openai and anthropic SDKs.
The model is ds4-make-model's glm-demo (GLM 5.2 architecture, tiny dims,
random weights) carrying the constructed GLM tokenizer (mk/glmchat.mk): the
server picks the chat format from the vocabulary's family, so rendering,
stop tokens, tool-call parsing and streaming, exact replay and
continuations run end to end with the real decode loop; the weights are
random, so tool-call paths run test_server_sdk's scripted scenario with
the same turn written in GLM's syntax (--scripted-output).

Oracle for the prompts: the GLM-5.2-delta template
(tests/fixtures/glm_chat/GLM-5.2-deltas.jinja) rendered by jinja2 in Hugging
Face's environment; the server's rendered prompt (--trace) must equal it byte
for byte."""
import json
import os
import re
import subprocess
import sys

import anthropic
import openai
from tokenizers import Tokenizer

import server_helper
from server_helper import Results, Server, write_temp_file
from test_server_sdk import A_TOOLS, ARGS, TOOLS, scripted_server_tests

sys.path.insert(0, os.path.join(server_helper.ROOT, "tests", "oracles"))
from glm_chat_fixtures import DIR as TEMPLATE_DIR, hf_env  # noqa: E402

NAME = "test_server_glm"
BUILD = os.environ.get("BUILD", "build")
MODEL = os.path.join(server_helper.ROOT, BUILD, "glmchat", "glm-demo.gguf")
# test_server_sdk's scripted turn in GLM's syntax (its tools, arguments and
# checks are reused as they are)
SCRIPT = ("Let me check.</think>I'll read it.\n<tool_call>read_file<arg_key>path</arg_key><arg_value>src/main.c"
          "</arg_value><arg_key>limit</arg_key><arg_value>200</arg_value></tool_call><|observation|>")
HF = Tokenizer.from_file(os.path.join(server_helper.ROOT, "data", "glm-constructed-tokenizer.json"))


def model_or_skip():
    if not os.path.exists(MODEL):
        r = subprocess.run(["make", "-s", f"BUILD={BUILD}", os.path.relpath(MODEL, server_helper.ROOT)],
                           cwd=server_helper.ROOT, capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(MODEL):
            print(f"SKIP {NAME}: {MODEL} could not be built: {(r.stderr or r.stdout).strip()[-300:]}")
            sys.exit(77)
    server_helper.MODEL = MODEL


def last_prompt(srv):
    """The last rendered prompt in the server's --trace (its byte count is exact)."""
    raw = open(srv.trace, "rb").read()
    heads = list(re.finditer(rb"---- rendered prompt \((\d+) bytes\)\n", raw))
    if not heads:
        return None
    m = heads[-1]
    return raw[m.end():m.end() + int(m.group(1))].decode("utf-8")


def template_render(messages, tools=None, **kw):
    env = hf_env()
    tpl = env.from_string(open(os.path.join(TEMPLATE_DIR, "GLM-5.2-deltas.jinja"), encoding="utf-8").read())
    msgs = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                               for c in m["tool_calls"]]
        msgs.append(m)
    ctx = dict(messages=msgs, add_generation_prompt=True, **kw)
    if tools:
        ctx["tools"] = tools
    return tpl.render(**ctx)


def plain_tests(t, srv):
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    ac = anthropic.Anthropic(base_url=srv.base, api_key="dummy", max_retries=0, timeout=300)
    ids = [m.id for m in oc.models.list().data]
    t.check(ids == ["glm-5.2"], f"/v1/models {ids}")

    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris? «ok» 😀"}]
    cases = [({}, {}), ({"reasoning_effort": "high"}, {"reasoning_effort": "high"}),
             ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False})]
    for extra, kw in cases:
        r = oc.chat.completions.create(model="glm-5.2", messages=msgs, tools=TOOLS, max_tokens=2, extra_body=extra)
        t.check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"chat {extra}")
        want = template_render(msgs, TOOLS, **kw)
        got = last_prompt(srv)
        t.check(got == want, f"prompt {extra} differs from the template:\n got {got!r}\nwant {want!r}")
        # token level: HF encodes the template's text (every added token
        # matched; the client text here holds none) to as many tokens
        n_hf = len(HF.encode(want, add_special_tokens=False).ids)
        t.check(r.usage.prompt_tokens == n_hf, f"prompt tokens {r.usage.prompt_tokens}, HF {n_hf}")

    history = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "two calls",
         "tool_calls": [{"id": "call_x1", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\": \"a b\", \"limit\": 3}"}},
                        {"id": "call_x2", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\": \"</arg_value>\"}"}}]},
        {"role": "tool", "tool_call_id": "call_x1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_x2", "content": "<|user|>rain"},
        {"role": "assistant", "content": "Sunny and rain.", "reasoning_content": "done"},
        {"role": "user", "content": "Thanks"}]
    oc.chat.completions.create(model="glm-5.2", messages=history, tools=TOOLS, max_tokens=1)
    want = template_render(history, TOOLS)
    got = last_prompt(srv)
    t.check(got == want, f"multi-turn tool history differs from the template:\n got {got!r}\nwant {want!r}")

    # the template iterates the arguments' items: anything but an object is one 400 line
    bad = [{"role": "user", "content": "x"},
           {"role": "assistant", "tool_calls": [{"id": "call_b", "type": "function",
                                                 "function": {"name": "read_file", "arguments": "[1, 2]"}}]},
           {"role": "tool", "tool_call_id": "call_b", "content": "y"}]
    st, _, body = srv.request("POST", "/v1/chat/completions", {"model": "glm-5.2", "messages": bad, "max_tokens": 1})
    msg = json.loads(body).get("error", {}).get("message", "")
    t.check(st == 400 and "arguments are not a JSON object" in msg and "\n" not in msg, f"non-object arguments: {st} {msg}")

    # Anthropic: tool_result blocks become GLM's observation turn
    ac.messages.create(model="glm-5.2", max_tokens=1, tools=A_TOOLS, messages=[
        {"role": "user", "content": "Read a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                           "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                                     {"type": "text", "text": "and now?"}]}])
    got = last_prompt(srv) or ""
    t.check(got.endswith("<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value></tool_call>"
                         "<|observation|><tool_response>ok</tool_response><|user|>and now?<|assistant|><think>"),
            f"anthropic tool_result as an observation turn: {got[-200:]!r}")

    st, _, body = srv.request("POST", "/tokenize", {"prompt": "hi there", "add_special_tokens": True})
    st2, _, body2 = srv.request("POST", "/tokenize", {"prompt": "hi there"})
    t.check(st == 200 and json.loads(body) == json.loads(body2), "GLM adds no BOS when tokenizing")
    st, _, body = srv.request("GET", "/tokenizer_info")
    t.check(st == 200 and json.loads(body).get("eos_token") == "<|endoftext|>", f"tokenizer_info {body[:100]}")


def glm_scripted_tests(t, srv):
    """What test_server_sdk's scripted scenario does not cover for GLM: the
    live-continuation tail is GLM's observation turn."""
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    rtools = [{"type": "function", "name": "read_file", "parameters": TOOLS[0]["function"]["parameters"]}]
    events = list(oc.responses.create(model="glm-5.2", input="Read src/main.c", stream=True, tools=rtools))
    done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    t.check(len(done) == 1 and json.loads(done[0].item.arguments) == ARGS, "responses function_call (typed limit)")
    oc.responses.create(model="glm-5.2", tools=rtools,
                        input=[{"type": "function_call_output", "call_id": done[0].item.call_id, "output": "ok"}])
    t.check((last_prompt(srv) or "").endswith(
        "</tool_call><|observation|><tool_response>ok</tool_response><|assistant|><think>"),
        f"continuation tail: {(last_prompt(srv) or '')[-120:]!r}")


def main():
    model_or_skip()
    t = Results(NAME)
    srv = Server()
    try:
        plain_tests(t, srv)
        t.check(srv.alive(), "plain server alive")
    finally:
        srv.stop()
    script = write_temp_file(SCRIPT)
    try:
        srv = Server("--scripted-output", script)
        try:
            # the DeepSeek scenario, unchanged: the same SDK-visible results
            # (reasoning, content, typed arguments, ids, replay, continuations)
            scripted_server_tests(t, srv)
            glm_scripted_tests(t, srv)
            t.check(srv.alive(), "scripted server alive")
        finally:
            srv.stop()
    finally:
        os.unlink(script)
    t.done()


if __name__ == "__main__":
    main()
