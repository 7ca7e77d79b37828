#!/usr/bin/env python3
"""Tool-call success rate of a GGUF through ds4-server (docs/tiny-model.md).

For each agent task (list a directory, read a file, run a command, count
lines, edit a file) N requests are drawn with data.py's task generator under
a seed the corpus did not use (the phrasings are the training templates; the
directory, file and line picks are new draws): each is sent to ds4-server as
an OpenAI chat request with the tools and system prompt of ds4-agent (so the
prompt is byte-identical to the agent's) or, with --client, a client's own
three tools. A try succeeds when the response has exactly one tool call with
the expected name and arguments. Then the real tool output is sent back and
the answer must contain the fact from it (the count, the first entry, ...).
Nothing is executed: the tool outputs come from the generator.

With --unseen CORPUS[,...] only requests that never occur in those corpora are sent
(a closed workspace's kinds may have none left).

With --openai-sdk the requests go through the openai Python SDK (a real
client's own serialisation) instead of raw HTTP.

    python3 tools/train-tiny/eval_tools.py MODEL.gguf [--n 50] [--think] [--client] [--workspace DIR]
        [--unseen CORPUS.jsonl] [--openai-sdk]"""
import argparse
import glob
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import data  # noqa: E402
from serve import Server  # noqa: E402


def post(port, body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def request(messages, tools, think, max_tokens):
    # the function objects as raw bytes: ds4-server copies them into the prompt
    tl = ",".join('{"type":"function","function":%s}' % line for line in data.schema_lines(tools).split("\n"))
    return ('{"model":"deepseek-v4-flash","messages":%s,"tools":[%s],"max_tokens":%d,"temperature":0,'
            '"thinking":{"type":"%s"}}' % (json.dumps(messages), tl, max_tokens, "enabled" if think else "disabled"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1001)
    ap.add_argument("--think", action="store_true")
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--openai-sdk", action="store_true",
                    help="send the requests with the openai Python SDK (its own serialisation of the tools) "
                    "instead of raw HTTP")
    ap.add_argument("--server", default="./ds4-server")
    ap.add_argument("--out", default=None)
    ap.add_argument("--workspace", default=None, help="draw the tasks from this workspace's files "
                    "(data.workspace_roots) instead of the machine's directories")
    ap.add_argument("--unseen", default=None, metavar="CORPUS[,CORPUS...]",
                    help="keep only requests that occur nowhere in these corpus.jsonl files (as a user turn); a "
                    "kind with fewer such requests in --max-draws draws is reported with what it has")
    ap.add_argument("--max-draws", type=int, default=20000)
    a = ap.parse_args()
    roots = sorted(d for d in glob.glob(os.path.join(data.PYLIB, "*")) + glob.glob("/usr/include/*")
                   if os.path.isdir(d) and "__pycache__" not in d and os.access(d, os.R_OK) and os.listdir(d))
    roots = data.workspace_roots(a.workspace) if a.workspace else [d for d in roots if len(os.listdir(d)) < 200]
    rng = random.Random(a.seed)
    kinds = ["list", "read", "run", "count"] + ([] if a.client else ["edit"])
    cases = {k: [] for k in kinds}
    seen = None
    if a.unseen:
        # every user turn of the corpus, as data.py renders it; in a Claude
        # Code session (claude_code.py corpus) the request follows the
        # client's reminders
        seen = set()
        for corpus in a.unseen.split(","):
            for line in open(corpus, encoding="utf-8"):
                for turn in json.loads(line)["text"].split("<｜User｜>")[1:]:
                    seen.add(turn.split("<｜Assistant｜>", 1)[0].rsplit("</system-reminder>\n", 1)[-1])
    draws = 0
    while any(len(v) < a.n for v in cases.values()) and draws < a.max_draws:
        c = data.agent_case(rng, roots, a.client, top=a.workspace)
        draws += 1
        if len(cases[c["kind"]]) < a.n and not (seen is not None and c["q"] in seen):
            cases[c["kind"]].append(c)
    kinds = [k for k in kinds if cases[k]]
    srv = Server(a.server, a.model, ctx=4096)
    port = srv.port
    try:
        tools = data.CLIENT_TOOLS if a.client else data.AGENT_TOOLS
        if a.openai_sdk:
            from openai import OpenAI
            sdk = OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused")
            tool_objs = [{"type": "function", "function": json.loads(line)}
                         for line in data.schema_lines(tools).split("\n")]

            def ask(messages):
                return sdk.chat.completions.create(
                    model="deepseek-v4-flash", messages=messages, tools=tool_objs, max_tokens=160, temperature=0,
                    extra_body={"thinking": {"type": "enabled" if a.think else "disabled"}}).model_dump()
        else:
            def ask(messages):
                return post(port, request(messages, tools, a.think, 160))
        res = {}
        for kind in kinds:
            ok_call = ok_ans = 0
            for c in cases[kind]:
                system = None if a.client else data.AGENT_SYSTEM % c["project"]
                msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": c["q"]}]
                r = ask(msgs)
                msg = r["choices"][0]["message"]
                calls = msg.get("tool_calls") or []
                if os.environ.get("EVAL_DEBUG"):
                    print(repr(c["q"]), c["call"], "->", json.dumps(msg)[:400])
                name, params = c["call"]
                good = len(calls) == 1 and calls[0]["function"]["name"] == name
                if good:
                    try:
                        got = json.loads(calls[0]["function"]["arguments"])
                    except ValueError:
                        got = None
                    good = got == dict(params)
                ok_call += good
                # the answer from the real tool result, after the expected call
                call_msg = {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(dict(params), separators=(",", ":"))}}]}
                r2 = ask(msgs + [call_msg, {"role": "tool", "tool_call_id": "call_1", "content": c["out"]}])
                ans = r2["choices"][0]["message"].get("content") or ""
                ok_ans += bool(c["key"]) and c["key"] in ans
            res[kind] = {"n": len(cases[kind]), "call_ok": ok_call, "answer_ok": ok_ans}
            print("%-6s %3d tries: correct tool call %3d (%.0f%%), answer from the result %3d (%.0f%%)"
                  % (kind, len(cases[kind]), ok_call, 100.0 * ok_call / len(cases[kind]), ok_ans,
                     100.0 * ok_ans / len(cases[kind])), flush=True)
        if a.out:
            json.dump(res, open(a.out, "w"), indent=1)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
