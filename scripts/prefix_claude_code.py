#!/usr/bin/env python3
"""Prefilled tokens per turn of a real Claude Code session whose system
prompt carries a reminder that changes every turn.

20 turns of `claude -p QUESTION --continue --append-system-prompt REMINDER
--system-prompt-snapshot off` (the Claude Code CLI bundled in the
claude-agent-sdk wheel, default system prompt and tools, a private HOME)
against a running ds4-server. The reminder ("<system-reminder>Turn k. The
time is ...</system-reminder>") is what a client's date, status or
environment line is: appended to the system prompt, which snapshot off
renders afresh on every request (as Claude Code did before it kept one
system prompt per conversation, and as clients that put the date or git
status there still do), it changes the prompt early, after the tool list
and the fixed system text. With `--side`, a one-off request of another conversation (a
title request with its own short system prompt, as a client's side requests
or a second agent on the same server make) runs between the turns and takes
the live session.

Per turn it prints what the server's /metrics counted for the turn:
prompt tokens, tokens reused from the live session or the disk cache, and
tokens prefilled.

    ./ds4-server -m models/demo.gguf --ctx 65536 --kv-disk-dir /tmp/kv \\
        --scripted-output ANSWER_FILE &
    python3 scripts/prefix_claude_code.py http://127.0.0.1:8000 [--side]

ANSWER_FILE holds one answer such as "Noted.</think>Done." (the demo model
with a scripted answer keeps the assistant turns identical between runs).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

TURNS = 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "clients"))

from client_helper import offline_env, package_file  # noqa: E402

COUNTERS = ("ds4_prompt_tokens_total", "ds4_prompt_tokens_cached_total", "ds4_prefill_tokens_total")


def counters(base):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return [int(float(re.search(rf"^{c} (\S+)$", text, re.M).group(1))) for c in COUNTERS]


def side_request(base, turn):
    body = {"model": "deepseek-v4-flash", "max_tokens": 16,
            "system": "Write a five-word title for the conversation.",
            "messages": [{"role": "user", "content": f"Conversation {turn} about the build and its tests."}]}
    req = urllib.request.Request(base + "/v1/messages", json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def main():
    args = [a for a in sys.argv[1:] if a != "--side"]
    if len(args) != 1:
        sys.exit("usage: prefix_claude_code.py BASE_URL [--side]")
    base, side = args[0].rstrip("/"), "--side" in sys.argv
    claude = package_file("claude_agent_sdk", "_bundled", "claude")
    total = 0
    with tempfile.TemporaryDirectory(prefix="ds4-prefix-cc-") as tmp:
        work, home = os.path.join(tmp, "work"), os.path.join(tmp, "home")
        os.makedirs(work)
        os.makedirs(home)
        env = offline_env(home, ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY="ds4-local",
                          CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
                          DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1")
        print("turn prompt reused prefilled")
        for turn in range(1, TURNS + 1):
            if side and turn > 1:
                side_request(base, turn)
            reminder = f"<system-reminder>Turn {turn}. The time is 10:{turn:02d}.</system-reminder>"
            before = counters(base)
            p = subprocess.run([claude, "-p", f"Question {turn}: say which file holds the build rules.",
                                "--model", "deepseek-v4-flash", "--max-turns", "1",
                                "--append-system-prompt", reminder, "--system-prompt-snapshot", "off", *(["--continue"] if turn > 1 else [])],
                               cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=900)
            if p.returncode != 0:
                sys.exit(f"claude failed on turn {turn}: {p.stdout[-400:]} {p.stderr[-400:]}")
            prompt, cached, prefilled = (a - b for a, b in zip(counters(base), before))
            total += prefilled
            print(turn, prompt, cached, prefilled, flush=True)
    print("prefilled in all:", total)


if __name__ == "__main__":
    main()
