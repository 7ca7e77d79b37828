"""The real Claude Code CLI on the trained tiny model, nothing scripted:
Claude Code's own default system prompt and its Read, Edit and Bash tools,
in a copy of the project the model was trained on (data/ds4-tiny/workspace),
ds4-server generating greedily. Four requests for each of the five tasks
(list a directory, read a file, run a command, count lines, edit a line),
drawn by tools/train-tiny/claude_code.py under a seed of their own: the calls
Claude Code executed (its stream-json events) must be exactly the expected
ones (a read followed by an edit nobody asked for fails; an edit is a read of
the file, then the Edit with the requested old and new text) in at least 12
of the 20 tries, and its final text must hold the fact from the tool's result
(the first entry, the first line, the count, the edited line, ...) in at
least 10. Over 50 requests per task the model got 52-98% of the calls
(docs/tiny-model.md); the random-weight demo model gets none. So the
Anthropic path end to end (tools in, DSML out, tool_use blocks, results
back), the chat profile and the model's behaviour are checked together.
"""
import os
import random
import shutil
import sys
import tempfile

from client_helper import package_file
from server_helper import Results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "train-tiny"))
import claude_code  # noqa: E402
from serve import Server  # noqa: E402

NAME = "test_claude_code_tiny"
MODEL = os.environ.get("MODEL", "models/ds4-tiny.gguf")
package_file("claude_agent_sdk", "_bundled", "claude")
if not os.path.exists(MODEL):
    print(f"SKIP: {MODEL} missing (make tiny-model)")
    sys.exit(77)
res = Results(NAME)
rng = random.Random(3001)
calls_ok = answers_ok = tries = 0
root = tempfile.mkdtemp(prefix="ds4-claude-tiny-")
home = os.path.join(root, "home")
os.makedirs(home)
srv = Server("./ds4-server", MODEL)
try:
    for kind in claude_code.KINDS:
        for _ in range(4):
            cwd = claude_code.workspace_copy(root, rng)
            t = claude_code.task(rng, kind, cwd)
            rc, calls, text = claude_code.run_claude(t["q"], cwd, home, srv.base, len(t["calls"]) + 2)
            good = len(calls) == len(t["calls"]) and all(claude_code.call_ok(g, w, cwd)
                                                         for g, w in zip(calls, t["calls"]))
            answered = good and t["key"] != "" and t["key"] in text
            print(f"{'call ok ' if good else 'call BAD'} {'answer ok ' if answered else 'answer BAD'} {t['q']!r}: "
                  f"{calls[:2]} -> {text[:80]!r}")
            tries += 1
            calls_ok += good
            answers_ok += answered
            shutil.rmtree(os.path.dirname(cwd))
    res.check(srv.proc.poll() is None, "server alive after the runs")
finally:
    srv.stop()
    shutil.rmtree(root)
res.check(calls_ok >= 12, f"the expected calls in {calls_ok} of {tries} tries (want >= 12)")
res.check(answers_ok >= 10, f"answers from the tool's result in {answers_ok} of {tries} tries (want >= 10)")
res.done()
