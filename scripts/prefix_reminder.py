#!/usr/bin/env python3
"""Prefilled tokens per turn when a client rewrites a block in its prompt.

A 20-turn Anthropic /v1/messages conversation (a ~900-token system prompt,
~100-token questions) whose user text carries a <system-reminder> that
changes every turn, placed either at the start of the FIRST user message
(early: what clients that inject a date or status block there do) or of the
LAST one (late). Prints per turn: prompt tokens, tokens reused from the
server's cache, tokens prefilled (the usage the server reports).

    ./ds4-server -m models/demo.gguf --ctx 65536 --scripted-output ANSWER_FILE &
    python3 scripts/prefix_reminder.py http://127.0.0.1:8000 early

Any model works; the demo model with a scripted answer keeps the assistant
turns identical between runs.
"""
import json
import sys
import urllib.request

TURNS = 20
SYSTEM = "You are a coding agent. " + "Follow the repository conventions carefully. " * 150


def post(base, body):
    req = urllib.request.Request(base + "/v1/messages", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("early", "late"):
        sys.exit("usage: prefix_reminder.py BASE_URL early|late")
    base, where = sys.argv[1].rstrip("/"), sys.argv[2]
    history, total = [], 0
    print("turn prompt reused prefilled")
    for turn in range(1, TURNS + 1):
        question = {"role": "user", "content": f"Question {turn}: " + "explain the build. " * 20}
        msgs = [dict(m) for m in history] + [dict(question)]
        k = 0 if where == "early" else len(msgs) - 1
        reminder = f"<system-reminder>Turn {turn}. The time is 10:{turn:02d}.</system-reminder>\n"
        msgs[k]["content"] = reminder + msgs[k]["content"]
        out = post(base, {"model": "deepseek-v4-flash", "max_tokens": 64, "system": SYSTEM, "messages": msgs})
        history += [question, {"role": "assistant", "content": out["content"]}]
        u = out["usage"]
        reused = u.get("cache_read_input_tokens", 0)
        total += u["input_tokens"]
        print(turn, u["input_tokens"] + reused, reused, u["input_tokens"])
    print("prefilled in all:", total)


if __name__ == "__main__":
    main()
