"""ds4-server through the official openai and anthropic SDKs: chat, legacy
completions (raw, token ids, echo + logprobs), Responses, Messages, streaming
and not, prefix reuse visible in usage and --trace. Tool calls run through a
second server started with --scripted-output (test-only) so the DSML path,
tool ids, exact-DSML replay and live continuations are exercised with the
real decode loop even though the demo model's weights are random."""
import json
import os

import anthropic
import openai

from server_helper import Results, Server, demo_model_or_skip, write_temp_file

NAME = "test_server_sdk"
FINISH = {"stop", "length", "tool_calls"}
D = "\uff5cDSML\uff5c"
SCRIPT = ("Let me check.</think>I'll read it.\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"read_file\">\n<" + D +
          "parameter name=\"path\" string=\"true\">src/main.c</" + D + "parameter>\n<" + D +
          "parameter name=\"limit\" string=\"false\">200</" + D + "parameter>\n</" + D + "invoke>\n</" + D + "tool_calls>")
ARGS = {"path": "src/main.c", "limit": 200}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                            "parameters": {"type": "object", "properties": {
                                                "path": {"type": "string"}, "limit": {"type": "integer"}}}}}]
A_TOOLS = [{"name": "read_file", "description": "Read a file",
            "input_schema": TOOLS[0]["function"]["parameters"]}]


def plain_server_tests(t, srv):
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    ac = anthropic.Anthropic(base_url=srv.base, api_key="dummy", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": "List three Redis design principles."}]

    r = oc.chat.completions.create(model="my-model", messages=msgs, max_tokens=4, temperature=0)
    t.check(r.model == "my-model" and r.choices[0].finish_reason in FINISH, f"chat non-stream {r}")
    P = r.usage.prompt_tokens
    t.check(r.usage.total_tokens == P + r.usage.completion_tokens and r.usage.completion_tokens <= 4, "chat usage")
    # the same prompt again: the whole prompt comes from the live KV
    r2 = oc.chat.completions.create(model="my-model", messages=msgs, max_tokens=4, temperature=0)
    t.check(r2.usage.prompt_tokens == P and r2.usage.prompt_tokens_details.cached_tokens == P,
            f"prefix reuse: cached {r2.usage.prompt_tokens_details.cached_tokens} of {P}")
    t.check(r2.choices[0].message.content == r.choices[0].message.content and
            r2.choices[0].message.reasoning_content == getattr(r.choices[0].message, "reasoning_content", None),
            "greedy output identical with and without reuse")
    # a follow-up turn reuses the previous prompt
    follow = msgs + [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": "And a fourth?"}]
    r3 = oc.chat.completions.create(model="deepseek-chat", messages=follow, max_tokens=3, temperature=0)
    t.check(r3.usage.prompt_tokens_details.cached_tokens >= P - 1, f"multi-turn reuse {r3.usage}")
    trace = srv.trace_text()
    t.check("cache: " in trace and "rendered prompt" in trace and "---- generated" in trace, "trace content")

    chunks = list(oc.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"thinking": {"type": "disabled"}}))
    t.check(chunks[0].choices[0].delta.role == "assistant", "role chunk first")
    t.check(chunks[-1].usage is not None and chunks[-1].choices == [], "usage chunk last")
    fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    t.check(len(fins) == 1 and fins[0] in FINISH, f"one finish {fins}")
    t.check(not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices),
            "thinking disabled: no reasoning")

    # a seed makes sampling reproducible
    a, b = (oc.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=1, seed=42)
            for _ in range(2))
    t.check(a.choices[0].message.reasoning_content == b.choices[0].message.reasoning_content and
            a.choices[0].message.content == b.choices[0].message.content, "same seed, same output")

    # chat logprobs (content tokens only; non-thinking so every token is content)
    lr = oc.chat.completions.create(model="deepseek-chat", messages=msgs, max_tokens=4, temperature=0,
                                    logprobs=True, top_logprobs=3)
    ent = lr.choices[0].logprobs.content
    joined = b"".join(bytes(e.bytes) for e in ent)
    t.check(len(ent) == lr.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in ent),
            f"chat logprobs entries {len(ent)} vs {lr.usage.completion_tokens}")
    t.check(joined.decode("utf-8", "replace") == lr.choices[0].message.content, "logprob bytes == content")
    t.check(all(abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5 for e in ent), "greedy token is the top logprob")
    sl = list(oc.chat.completions.create(model="deepseek-chat", messages=msgs, max_tokens=4, temperature=0,
                                         logprobs=True, top_logprobs=3, stream=True))
    sent = [e for c in sl if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # (the second request reuses the live KV, so values agree to rounding)
    t.check([e.token for e in sent] == [e.token for e in ent] and
            all(abs(x.logprob - y.logprob) < 1e-3 for x, y in zip(sent, ent)),
            f"streamed logprobs == non-streamed {[(e.token, e.logprob) for e in sent]} {[(e.token, e.logprob) for e in ent]}")

    # legacy completions, lm-eval style: token-id batch, echo + logprobs
    ids = [[791, 8415, 7731], [791, 8415, 11013, 389]]
    c = oc.completions.create(model="m", prompt=ids, max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234)
    t.check(len(c.choices) == 2 and [ch.index for ch in c.choices] == [0, 1], "one choice per prompt")
    for ch, p in zip(c.choices, ids):
        lp = ch.logprobs
        t.check(len(lp.token_logprobs) == len(p) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None,
                f"echo arrays {len(lp.token_logprobs)}")
        t.check(all(v <= 0 for v in lp.token_logprobs[1:]), "logprobs <= 0")
        # temperature 0: the generated token is the argmax
        t.check(abs(lp.token_logprobs[-1] - max(lp.top_logprobs[-1].values())) < 1e-5, "greedy = argmax")
        t.check(lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), "offsets")
    c0 = oc.completions.create(model="m", prompt=[ids[0]], max_tokens=0, echo=True)
    t.check(c0.choices[0].finish_reason == "length" and c0.usage.completion_tokens == 0, "max_tokens 0")
    cs = oc.completions.create(model="m", prompt="The cat", max_tokens=3, temperature=0)
    t.check(cs.choices[0].finish_reason in ("stop", "length") and cs.usage.prompt_tokens == 2, f"string prompt {cs.usage}")
    ev = list(oc.completions.create(model="m", prompt="The cat", max_tokens=3, temperature=0, stream=True))
    t.check("".join(e.choices[0].text for e in ev if e.choices) == cs.choices[0].text, "completions stream == non-stream")

    # Responses
    rr = oc.responses.create(model="m", input="hi", max_output_tokens=4, temperature=0,
                             reasoning={"effort": "none"})
    t.check(rr.status in ("completed", "incomplete") and rr.usage.input_tokens > 0 and
            rr.usage.output_tokens_details.reasoning_tokens == 0, f"responses {rr.status}")
    events = list(oc.responses.create(model="m", input="hi", max_output_tokens=4, stream=True,
                                      reasoning={"summary": "auto"}))
    types = [e.type for e in events]
    t.check(types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete"),
            f"responses stream order {types[:3]}..{types[-1:]}")
    t.check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")

    # Anthropic Messages
    m = ac.messages.create(model="claude-x", max_tokens=4, messages=msgs, thinking={"type": "disabled"})
    t.check(m.model == "claude-x" and m.stop_reason in ("end_turn", "max_tokens") and m.content and
            m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0, f"messages {m}")
    with ac.messages.stream(model="claude-x", max_tokens=6, messages=msgs,
                            thinking={"type": "enabled", "budget_tokens": 1024}) as st:
        fm = st.get_final_message()
    t.check(fm.stop_reason in ("end_turn", "max_tokens") and fm.content and fm.usage.output_tokens > 0,
            f"messages stream {fm.stop_reason}")
    n = ac.messages.count_tokens(model="x", messages=msgs)
    t.check(n.input_tokens > 4, f"count_tokens {n}")


def scripted_server_tests(t, srv):
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    ac = anthropic.Anthropic(base_url=srv.base, api_key="dummy", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": "Read src/main.c"}]

    r = oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    t.check(r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls or []) == 1, f"tool call {r}")
    tc = m.tool_calls[0]
    t.check(tc.function.name == "read_file" and json.loads(tc.function.arguments) == ARGS and
            tc.id.startswith("call_") and len(tc.id) == 37, f"tool call fields {tc}")
    t.check(m.reasoning_content == "Let me check." and m.content == "I'll read it.", "reasoning/content split")
    P1 = r.usage.prompt_tokens

    # next turn: the client re-serialises the arguments differently; exact
    # replay keeps the rendered prompt identical to the live KV text
    args2 = json.dumps({"limit": 200, "path": "src/main.c"}, indent=2)
    turn2 = msgs + [{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content,
                     "tool_calls": [{"id": tc.id, "type": "function",
                                     "function": {"name": "read_file", "arguments": args2}}]},
                    {"role": "tool", "tool_call_id": tc.id, "content": "int main(void) { return 0; }"}]
    r2 = oc.chat.completions.create(model="m", messages=turn2, tools=TOOLS)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    t.check(cached >= P1 + r.usage.completion_tokens - 1,
            f"exact DSML replay keeps the tool turn cached: {cached} vs {P1}+{r.usage.completion_tokens}")
    t.check("live text prefix" in srv.trace_text() or "exact token prefix" in srv.trace_text(), "trace cache decision")

    # streamed tool call deltas
    chunks = list(oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True))
    args, ids, names = "", [], []
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.id:
                ids.append(d.id)
                names.append(d.function.name)
            args += d.function.arguments or ""
    t.check(len(ids) == 1 and names == ["read_file"] and json.loads(args) == ARGS, f"streamed args {args!r}")
    fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    t.check(fins == ["tool_calls"], f"stream finish {fins}")

    # Responses: function_call item, streamed
    events = list(oc.responses.create(model="m", input="Read src/main.c", stream=True,
                                      tools=[{"type": "function", "name": "read_file", "parameters": {}}]))
    done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    t.check(len(done) == 1 and json.loads(done[0].item.arguments) == ARGS and done[0].item.call_id.startswith("call_"),
            "responses function_call")
    t.check(events[-1].type == "response.completed", "responses completed")
    call_id = done[0].item.call_id
    # continuation with only the tool output (no replayed call): live binding
    rr = oc.responses.create(model="m", input=[{"type": "function_call_output", "call_id": call_id, "output": "ok"}],
                             tools=[{"type": "function", "name": "read_file", "parameters": {}}])
    t.check(rr.usage.input_tokens_details.cached_tokens > 0 and "live tool-call continuation" in srv.trace_text(),
            f"responses live continuation {rr.usage}")

    # Responses with hidden reasoning: the replayed history lacks the
    # reasoning, yet the live KV (which has it) is reused up to the new items
    rtools = [{"type": "function", "name": "read_file", "parameters": {}}]
    h1 = oc.responses.create(model="m", input="Read src/main.c", tools=rtools)
    fc = [o for o in h1.output if o.type == "function_call"]
    t.check(len(fc) == 1 and not any(o.type == "reasoning" for o in h1.output), "hidden reasoning: no reasoning item")
    h2 = oc.responses.create(model="m", tools=rtools, input=[
        {"role": "user", "content": "Read src/main.c"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": h1.output_text}]},
        {"type": "function_call", "call_id": fc[0].call_id, "name": "read_file", "arguments": fc[0].arguments},
        {"type": "function_call_output", "call_id": fc[0].call_id, "output": "ok"}])
    t.check(h2.usage.input_tokens_details.cached_tokens >= h1.usage.input_tokens + h1.usage.output_tokens - 1 and
            "visible transcript prefix" in srv.trace_text(), f"hidden-reasoning replay reuse {h2.usage}")

    # chat without tools: the next turn drops the reasoning, the live KV is reused
    c1 = oc.chat.completions.create(model="m", messages=msgs)
    t.check(c1.choices[0].message.reasoning_content == "Let me check." and not c1.choices[0].message.tool_calls,
            "no tools: DSML text is plain content")
    c2 = oc.chat.completions.create(model="m", messages=msgs + [
        {"role": "assistant", "content": c1.choices[0].message.content}, {"role": "user", "content": "more"}])
    t.check(c2.usage.prompt_tokens_details.cached_tokens >= c1.usage.prompt_tokens + c1.usage.completion_tokens - 1,
            f"dropped-reasoning replay reuse {c2.usage} after {c1.usage}")

    # Anthropic: streamed tool_use, then a tool_result-only continuation
    with ac.messages.stream(model="claude", max_tokens=200, messages=msgs, tools=A_TOOLS) as st:
        fm = st.get_final_message()
    tu = [b for b in fm.content if b.type == "tool_use"]
    t.check(fm.stop_reason == "tool_use" and len(tu) == 1 and tu[0].input == ARGS and tu[0].id.startswith("toolu_"),
            f"anthropic tool_use {fm.content}")
    t.check(fm.content[0].type == "thinking" and fm.content[0].thinking == "Let me check.", "anthropic thinking block")
    ss = ac.messages.create(model="claude", max_tokens=200, messages=msgs, stop_sequences=["read", "zzz"])
    t.check(ss.stop_reason == "stop_sequence" and ss.stop_sequence == "read" and
            [b.text for b in ss.content if b.type == "text"] == ["I'll "], f"stop sequence {ss}")
    m2 = ac.messages.create(model="claude", max_tokens=200, tools=A_TOOLS, messages=msgs + [
        {"role": "assistant", "content": [b.model_dump() for b in fm.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id, "content": "ok"}]}])
    t.check(m2.usage.cache_read_input_tokens > 0 and m2.stop_reason == "tool_use", f"anthropic follow-up {m2.usage}")
    try:
        ac.messages.create(model="claude", max_tokens=10, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "x"}]}])
        t.check(False, "unknown tool_use_id accepted")
    except anthropic.BadRequestError as e:
        t.check("continuation state is not available" in str(e), f"unknown tool_use_id: {e}")


def no_replay_tests(t, srv):
    """--disable-exact-dsml-tool-replay: the client's re-serialised call is
    rendered canonically, so the sampled block is not reused byte for byte."""
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": "Read src/main.c"}]
    r = oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    m, tc = r.choices[0].message, r.choices[0].message.tool_calls[0]
    turn2 = msgs + [{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content,
                     "tool_calls": [{"id": tc.id, "type": "function", "function": {
                         "name": "read_file", "arguments": json.dumps({"limit": 200, "path": "src/main.c"})}}]},
                    {"role": "tool", "tool_call_id": tc.id, "content": "x"}]
    r2 = oc.chat.completions.create(model="m", messages=turn2, tools=TOOLS)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    t.check(r.usage.prompt_tokens <= cached < r.usage.prompt_tokens + r.usage.completion_tokens - 1 and
            "common token prefix" in srv.trace_text(), f"canonical rendering without replay: cached {cached}")


def main():
    demo_model_or_skip(NAME)
    t = Results(NAME)
    srv = Server()
    try:
        plain_server_tests(t, srv)
        t.check(srv.alive(), "plain server alive")
    finally:
        srv.stop()
    script = write_temp_file(SCRIPT)
    try:
        srv = Server("--scripted-output", script)
        try:
            scripted_server_tests(t, srv)
        finally:
            srv.stop()
        srv = Server("--scripted-output", script, "--disable-exact-dsml-tool-replay")
        try:
            no_replay_tests(t, srv)
        finally:
            srv.stop()
    finally:
        os.unlink(script)
    t.done()


if __name__ == "__main__":
    main()
