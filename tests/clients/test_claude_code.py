"""The real Claude Code CLI (as bundled in the pinned claude-agent-sdk wheel)
against ds4-server on the demo model with a scripted output of turns.

- Edit: `claude -p` with --allowedTools Read,Edit; the server's answers are a
  Read tool call, an Edit tool call (DSML, turned into Anthropic tool_use
  blocks by /v1/messages) and a text answer. The edit is not idempotent
  ("count = 1" -> "count = 1 + 1"), so the file shows it ran exactly once;
  the final text is what Claude Code prints; the run exits 0; the server ran
  exactly three generations, and each request after the first reused at least
  the whole previous prompt from the live KV state (the server's trace).
- Streaming with thinking on (Claude Code streams always and asks for
  adaptive thinking): with stream-json partial messages, the thinking and
  the text Claude Code receives hold the scripted reasoning and answer and no
  DSML or think-tag text.

Claude Code runs with a private HOME, no session persistence, nonessential
traffic (telemetry, update checks, error reports) off, and a short system
prompt and tool list, so the first prompt is small enough to prefill in
about a second on the demo model.
"""
import json
import os
import subprocess
import tempfile

from client_helper import LEAKS, check_prefix_reuse, demo_model_or_skip, dsml_call, offline_env, package_file, script
from server_helper import Results, Server, write_temp_file

NAME = "test_claude_code"
demo_model_or_skip(NAME)
CLAUDE = package_file("claude_agent_sdk", "_bundled", "claude")
res = Results(NAME)
FINAL = "The count is now 1 + 1."


def claude(srv, home, cwd, prompt, *flags):
    env = offline_env(home, ANTHROPIC_BASE_URL=srv.base, ANTHROPIC_API_KEY="ds4-test-key",
                      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
                      DISABLE_ERROR_REPORTING="1")
    args = [CLAUDE, "-p", prompt, "--model", "deepseek-v4-flash", "--tools", "Read,Edit",
            "--allowedTools", "Read,Edit", "--system-prompt", "You are a coding agent. Use the tools.",
            "--max-turns", "6", "--no-session-persistence", *flags]
    return subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=50)


def edit_script(path):
    return script("I read the file first.</think>" + dsml_call("Read", {"file_path": path}),
                  "Now the edit.</think>" + dsml_call("Edit", {"file_path": path, "old_string": "count = 1",
                                                                "new_string": "count = 1 + 1"}),
                  "Edited once.</think>" + FINAL)


def run_case(tmp, label, flags, check_output):
    work, home = os.path.join(tmp, label, "work"), os.path.join(tmp, label, "home")
    os.makedirs(work)
    os.makedirs(home)
    target = os.path.join(work, "counter.py")
    with open(target, "w") as f:
        f.write("count = 1\n")
    path = write_temp_file(edit_script(target))
    srv = Server("--scripted-output", path, ctx=8192)
    try:
        p = claude(srv, home, work, "Make the count in counter.py one more.", *flags)
        res.check(p.returncode == 0, f"{label}: claude exits 0: {p.returncode} {p.stderr[-800:]}")
        with open(target) as f:
            res.check(f.read() == "count = 1 + 1\n", f"{label}: the Edit ran exactly once")
        trace = srv.trace_text()
        res.check(trace.count("scripted answer") == 3 and "scripted answer 3 of 3" in trace,
                  f"{label}: three generations (Read, Edit, answer), no more")
        gens = check_prefix_reuse(res, trace, label)
        res.check(len(gens) == 3, f"{label}: three prompts planned: {gens}")
        check_output(p.stdout)
        res.check(srv.alive(), f"{label}: server alive")
    finally:
        srv.stop()
        os.unlink(path)


def printed_text(out):
    res.check(out.strip() == FINAL, f"text: the final answer is printed: {out[-400:]!r}")


def streamed(out):
    thinking, text, tool_inputs = [], [], []
    for line in out.splitlines():
        ev = json.loads(line)
        if ev.get("type") == "stream_event":
            d = ev["event"].get("delta") or {}
            thinking.append(d.get("thinking", ""))
            text.append(d.get("text", ""))
            tool_inputs.append(d.get("partial_json", ""))
        elif ev.get("type") == "result":
            res.check(ev.get("result") == FINAL and not ev.get("is_error"), f"stream: result is the answer: {ev}")
    thinking, text = "".join(thinking), "".join(text)
    res.check(thinking == "I read the file first.Now the edit.Edited once.",
              f"stream: the reasoning arrives as thinking deltas: {thinking!r}")
    res.check(text == FINAL, f"stream: the visible text is the answer alone: {text!r}")
    res.check(any('"old_string"' in t for t in tool_inputs), "stream: tool input arrives as input_json deltas")
    for leak in LEAKS:
        res.check(leak not in thinking + text, f"stream: no {leak!r} in thinking or text")


with tempfile.TemporaryDirectory(prefix="ds4-claude-") as tmp:
    run_case(tmp, "text", (), printed_text)
    run_case(tmp, "stream", ("--output-format", "stream-json", "--verbose", "--include-partial-messages"), streamed)
res.done()
