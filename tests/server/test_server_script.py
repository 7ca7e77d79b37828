"""ds4-server --scripted-output as a script of turns: answers separated by
lines of exactly <<<NEXT>>>; the k-th generation emits the k-th answer and
the last one repeats, on every endpoint and across --batched-session slots.

- Two answers, a DSML tool call then text: the first chat request gets the
  tool call (parsed into tool_calls by the server), the second the text, a
  third and a fourth the text again.
- The same script on two slots: four requests in turn still walk the
  answers in generation order (the count is the server's, not a slot's).
"""
import json
import os

from server_helper import Results, Server, demo_model_or_skip, write_temp_file

NAME = "test_server_script"
demo_model_or_skip(NAME)
res = Results(NAME)

D = "｜DSML｜"
CALL = ("\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"read_file\">\n<" + D +
        "parameter name=\"path\" string=\"true\">notes.txt</" + D + "parameter>\n</" + D + "invoke>\n</" + D +
        "tool_calls>")
TEXT = "All done: the file says hello."
# thinking is on by default: each answer is reasoning, </think>, then the answer
SCRIPT = "Read it.</think>" + CALL + "\n<<<NEXT>>>\nIt is read.</think>" + TEXT + "\n"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


def ask(srv, k):
    body = {"model": "deepseek-v4-flash", "max_tokens": 200, "tools": TOOLS,
            "messages": [{"role": "user", "content": f"question {k}"}]}
    status, _, raw = srv.request("POST", "/v1/chat/completions", body)
    res.check(status == 200, f"request {k} answers 200: {status} {raw[:200]!r}")
    return json.loads(raw)["choices"][0]["message"] if status == 200 else {}


def walk(srv, label):
    first = ask(srv, 1)
    calls = first.get("tool_calls") or []
    res.check(len(calls) == 1 and calls[0]["function"]["name"] == "read_file" and
              json.loads(calls[0]["function"]["arguments"]) == {"path": "notes.txt"},
              f"{label}: generation 1 is the scripted tool call: {first}")
    for k in (2, 3, 4):
        m = ask(srv, k)
        res.check(m.get("content") == TEXT and m.get("reasoning_content") == "It is read." and not m.get("tool_calls"),
                  f"{label}: generation {k} is the last answer, repeated: {m}")
    trace = srv.trace_text()
    res.check("scripted answer 1 of 2" in trace and trace.count("scripted answer 2 of 2") == 3,
              f"{label}: the trace names the answer of every generation")


script = write_temp_file(SCRIPT)
try:
    for label, extra in (("one slot", ()), ("two slots", ("--batched-session", "2"))):
        srv = Server("--scripted-output", script, *extra)
        try:
            walk(srv, label)
            res.check(srv.alive(), f"{label}: server alive")
        finally:
            srv.stop()
finally:
    os.unlink(script)
res.done()
