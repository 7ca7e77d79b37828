"""The real Codex CLI (as shipped in the pinned openai-codex-cli-bin wheel)
against ds4-server's Responses API on the demo model with a scripted output
of turns.

- `codex exec` with a model provider at the server's /v1 and
  wire_api = "responses" (this Codex has no other wire: "chat" is refused by
  its config loader). The server's answers are a call of Codex's own shell
  tool, exec_command, that appends a line to a file (not idempotent, so the
  file shows it ran exactly once), then text. Codex exits 0 and prints the
  text; the server ran exactly two generations and the second request reused
  at least the whole first prompt (the server's trace).
- The same with --json (Codex streams every request, and its Responses
  requests ask for reasoning, so thinking is on): the reasoning and message
  items Codex reports hold the scripted reasoning and answer and no DSML or
  think-tag text; the command ran once.

The config lives in a temporary CODEX_HOME, loaded with --strict-config (a
misspelt key fails the run): update checks, analytics, feedback and
telemetry export off, web search, goals, sub-agents and image viewing off,
and short instructions, so the first prompt is about 2,000 tokens.
"""
import json
import os
import subprocess
import tempfile

from client_helper import LEAKS, check_prefix_reuse, demo_model_or_skip, dsml_call, offline_env, package_file, script
from server_helper import Results, Server, write_temp_file

NAME = "test_codex"
demo_model_or_skip(NAME)
CODEX = package_file("codex_cli_bin", "bin", "codex")
res = Results(NAME)
FINAL = "Appended one line to notes.txt."
COMMAND = "printf 'one more line\\n' >> notes.txt"

CONFIG = """model = "deepseek-v4-flash"
model_provider = "ds4"
model_instructions_file = "{instructions}"
web_search = "disabled"
check_for_update_on_startup = false

[features]
goals = false
multi_agent = false
view_image = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[model_providers.ds4]
name = "ds4-server"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "DS4_API_KEY"
stream_idle_timeout_ms = 1000000
"""


def run_case(tmp, label, flags, check_output):
    root = os.path.join(tmp, label)
    work, home = os.path.join(root, "work"), os.path.join(root, "codex-home")
    os.makedirs(work)
    os.makedirs(home)
    notes = os.path.join(work, "notes.txt")
    with open(notes, "w") as f:
        f.write("first\n")
    instructions = os.path.join(root, "instructions.md")
    with open(instructions, "w") as f:
        f.write("You are a coding agent. Use exec_command to run shell commands.\n")
    path = write_temp_file(script("Append the line.</think>" + dsml_call("exec_command", {"cmd": COMMAND}),
                                  "It is appended.</think>" + FINAL))
    srv = Server("--scripted-output", path, ctx=8192)
    try:
        with open(os.path.join(home, "config.toml"), "w") as f:
            f.write(CONFIG.format(instructions=instructions, base=srv.base))
        env = offline_env(home, CODEX_HOME=home, DS4_API_KEY="ds4-test-key")
        # The sandbox is Codex's business, not the server's: the scripted
        # command runs unconfined in the test's temporary directory.
        p = subprocess.run([CODEX, "exec", "--strict-config", "--skip-git-repo-check", "--ephemeral",
                            "-s", "danger-full-access", "--color", "never", *flags, "Append a line to notes.txt."],
                           cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=50)
        res.check(p.returncode == 0, f"{label}: codex exits 0: {p.returncode} {p.stderr[-800:]}")
        with open(notes) as f:
            res.check(f.read() == "first\none more line\n", f"{label}: the command ran exactly once")
        trace = srv.trace_text()
        res.check(trace.count("scripted answer") == 2 and "scripted answer 2 of 2" in trace,
                  f"{label}: two generations (tool call, answer), no more")
        gens = check_prefix_reuse(res, trace, label)
        res.check(len(gens) == 2, f"{label}: two prompts planned: {gens}")
        _, _, metrics = srv.request("GET", "/metrics")
        res.check('ds4_requests_total{endpoint="/v1/responses",status="200"} 2' in metrics.decode(),
                  f"{label}: both requests went to /v1/responses")
        check_output(p.stdout, p.stderr)
        res.check(srv.alive(), f"{label}: server alive")
    finally:
        srv.stop()
        os.unlink(path)


def printed_text(out, err):
    res.check(out.strip() == FINAL, f"text: the final answer is printed: {out[-400:]!r}")
    for leak in LEAKS:
        res.check(leak not in out + err, f"text: no {leak!r} in what codex prints")


def json_events(out, err):
    items = [json.loads(line)["item"] for line in out.splitlines()
             if line.startswith("{") and json.loads(line).get("type") == "item.completed"]
    reasoning = [i["text"] for i in items if i["type"] == "reasoning"]
    messages = [i["text"] for i in items if i["type"] == "agent_message"]
    commands = [i for i in items if i["type"] == "command_execution"]
    res.check(reasoning == ["Append the line.", "It is appended."], f"json: reasoning items: {reasoning}")
    res.check(messages == [FINAL], f"json: the message is the answer alone: {messages}")
    res.check(len(commands) == 1 and "printf 'one more line" in commands[0].get("command", "") and
              commands[0].get("exit_code") == 0, f"json: one command execution: {commands}")
    for leak in LEAKS:
        res.check(all(leak not in t for t in reasoning + messages), f"json: no {leak!r} in reasoning or messages")


def chat_wire_refused(tmp):
    """docs/agent.md says this Codex has only the Responses wire: keep it true
    for the pinned version (the chat wire would be tested if it came back)."""
    home = os.path.join(tmp, "chat-home")
    os.makedirs(home)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(CONFIG.format(instructions="/dev/null", base="http://127.0.0.1:9").replace(
            'wire_api = "responses"', 'wire_api = "chat"'))
    p = subprocess.run([CODEX, "exec", "--skip-git-repo-check", "--ephemeral", "hi"], cwd=tmp,
                       env=offline_env(home, CODEX_HOME=home), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=50)
    res.check(p.returncode != 0 and '`wire_api = "chat"` is no longer supported' in p.stdout + p.stderr,
              f"this Codex refuses the chat wire: {p.returncode} {(p.stdout + p.stderr)[-300:]!r}")


with tempfile.TemporaryDirectory(prefix="ds4-codex-") as tmp:
    run_case(tmp, "text", (), printed_text)
    run_case(tmp, "json", ("--json",), json_events)
    chat_wire_refused(tmp)
res.done()
