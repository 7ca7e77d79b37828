#!/usr/bin/env python3
"""The real Claude Code CLI (bundled in the claude-agent-sdk wheel) on the
workspace's agent tasks, through ds4-server (docs/tiny-model.md).

Claude Code runs as a user runs it: `claude -p REQUEST --tools Read,Edit,Bash`
with its own default system prompt (about 3,600 tokens with these three
tools), in a fresh copy of the workspace, ANTHROPIC_BASE_URL pointing at
ds4-server. Its tools are not the agent's: a listing, a count and a command
are Bash calls (`ls DIR`, `wc -l FILE`, the command), a read is
Read{file_path[, limit]}, an edit is Read{file_path, limit: 1} then
Edit{file_path, old_string, new_string} (Claude Code refuses to edit a file
it has not read).

corpus: training sessions of several requests (`claude -p` again with
--continue). The server answers with --scripted-output (the reasoning and
call of every step, then the answer), Claude Code executes the calls for
real and sends their results back, and the last prompt the server rendered
plus the last answer is one document: byte for byte the transcript the model
will see from Claude Code, tool results as Claude Code words them.
The requests and answers are data.py's agent tasks on the workspace.

eval: the success rate of a model over N requests per task (drawn under a
seed the corpus did not use): the calls Claude Code executed (its stream-json
events) must be exactly the expected ones, and its final text must hold the
fact of the tool result (the first entry, the first line, the count, ...).

    python3 tools/train-tiny/claude_code.py corpus --out DIR [--n 200] [--rounds 4] [--seed 31] [--even] [--mix KIND,...]
        [--edit-style line|restate|plain]
    python3 tools/train-tiny/claude_code.py eval MODEL.gguf [--n 50] [--out FILE.json]"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import data  # noqa: E402
from serve import Server  # noqa: E402

KINDS = ["list", "read", "run", "count", "edit"]
TOOLS = "Read,Edit,Bash"
WORKSPACE = os.path.join(os.path.dirname(__file__), "..", "..", "data", "ds4-tiny", "workspace")
# project directory names a copy of the workspace is given (the system prompt names it)
DIR_NAMES = ["project", "app", "work", "repo", "code", "catalogue", "books", "src-tree"]


def claude_binary():
    import claude_agent_sdk
    return os.path.join(os.path.dirname(claude_agent_sdk.__file__), "_bundled", "claude")


# How the scripted sessions edit (corpus --edit-style): "line" reads one
# line and restates the text (below); the corpora of the earlier phases read
# the whole file, "plain" with bare reasoning, "restate" restating the text.
EDIT_STYLES = ("line", "restate", "plain")


def task(rng, kind, cwd, edit_style="line"):
    """One request in the workspace copy cwd: the request, the expected calls
    [(name, [(param, value)])], each step's reasoning, the answer and the fact
    it must hold."""
    ws = os.path.realpath(WORKSPACE)
    c = data.agent_case(rng, data.workspace_roots(ws), False, more=True, want=kind, top=ws)
    params = dict(c["call"][1])
    if kind == "list":
        sub = params.get("path")
        cmd = "ls " + sub if sub else "ls"
        entries = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True).stdout.split()
        where = sub or "The directory"
        ans = ("{} has {} entries, among them {}.".format(where, len(entries), ", ".join(entries[:8]))
               if len(entries) > 12 else "{} contains: {}.".format(where, ", ".join(entries) or "nothing"))
        calls = [("Bash", [("command", cmd)])]
        reasons = ["The user wants the contents of {}. I will run ls.".format(sub or "the working directory"),
                   "The listing has {} entries.".format(len(entries))]
        key = entries[0] if entries else ""
    elif kind == "read":
        f, n = params["path"], params["end_line"]
        limited = re.search(r"\b%d\b" % n, c["q"]) is not None
        calls = [("Read", [("file_path", f)] + ([("limit", n)] if limited else []))]
        reasons = [c["r1"], c["r2"]]
        ans, key = c["ans"], c["key"]
    elif kind in ("count", "run"):
        cmd = params["command"]
        calls = [("Bash", [("command", cmd)])]
        if kind == "run":
            p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
            body = (p.stdout + p.stderr).strip()
            ans = ("The command succeeded." + (" Output:\n\n```\n" + body[:400] + "\n```" if body else "")
                   if p.returncode == 0 else "The command failed with exit status {}.".format(p.returncode))
            reasons = ["I will run the command.", "The command exited with status {}.".format(p.returncode)]
            key = "succeeded" if p.returncode == 0 else str(p.returncode)
        else:
            reasons, ans, key = [c["r1"], c["r2"]], c["ans"], c["key"]
    else:
        f = params["path"]
        # Claude Code edits only a file it has read, but the request holds
        # the exact text: a one-line read satisfies it. The tiny model sees
        # single tokens only 128 back (its sliding window; past it, pooled
        # rows of the compressed layers that it never learned to copy from),
        # so with a whole file between the request and the edit it wrote a
        # wrong value; the reasoning restating the text before and after a
        # one-line read keeps every copy within the window.
        read = [("file_path", f)] + ([("limit", 1)] if edit_style == "line" else [])
        calls = [("Read", read),
                 ("Edit", [("file_path", f), ("old_string", params["old_string"]),
                           ("new_string", params["new_string"])])]
        swap = "`{}` with `{}`".format(params["old_string"], params["new_string"])
        reasons = (["I need to read {} first.".format(f), "I replace the line."] if edit_style == "plain" else
                   ["I need to read {} first, then replace {}.".format(f, swap), "I replace " + swap + "."])
        reasons.append(c["r2"])
        ans, key = c["ans"], c["key"]
    return dict(kind=kind, q=c["q"], calls=calls, reasons=reasons, ans=ans, key=key)


def workspace_copy(root, rng):
    cwd = os.path.join(tempfile.mkdtemp(dir=root), pick_name(rng))
    shutil.copytree(WORKSPACE, cwd, ignore=shutil.ignore_patterns("__pycache__"))
    return cwd


def pick_name(rng):
    return DIR_NAMES[rng.randrange(len(DIR_NAMES))]


def run_claude(prompt, cwd, home, base_url, turns, persist=False, resume=False):
    """One `claude -p` run; with persist the session is kept so that a later
    run with resume (--continue) appends its request to the same transcript."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb",
           "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "ds4-local",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1"}
    args = [claude_binary(), "-p", prompt, "--model", "deepseek-v4-flash", "--tools", TOOLS, "--allowedTools", TOOLS,
            "--max-turns", str(turns), "--output-format", "stream-json", "--verbose"]
    args += ["--continue"] if resume else []
    args += [] if persist else ["--no-session-persistence"]
    p = subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    calls, text = [], ""
    for line in p.stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("type") == "assistant":
            for block in ev["message"].get("content", []):
                if block.get("type") == "tool_use":
                    calls.append((block["name"], block.get("input", {})))
        elif ev.get("type") == "result":
            text = ev.get("result") or ""
    return p.returncode, calls, text


def rendered_prompts(trace):
    """The prompts the server rendered, in order (its --trace sections)."""
    return re.findall(r"---- rendered prompt \(\d+ bytes\)\n(.*?)\n---- end rendered prompt", trace, re.S)


def corpus(a):
    """Sessions of a.rounds requests, each one `claude -p` run continuing the
    last (--continue), so the ~3,800-token system prompt of one document
    carries several requests; one server per session plays all its answers."""
    rng = random.Random(a.seed)
    mix = a.mix.split(",")
    if not all(k in KINDS for k in mix):
        sys.exit("claude_code.py: --mix takes kinds among " + ",".join(KINDS))
    root = tempfile.mkdtemp(prefix="ds4-claude-corpus-")
    os.makedirs(a.out, exist_ok=True)
    made = skipped = drawn = 0
    with open(os.path.join(a.out, "corpus.jsonl"), "w") as out:
        while made < a.n:
            home = tempfile.mkdtemp(dir=root)
            cwd = workspace_copy(root, rng)
            tasks = []
            for _ in range(a.rounds):
                tasks.append(task(rng, mix[drawn % len(mix)] if a.even else data.pick(rng, mix), cwd, a.edit_style))
                drawn += 1
            answers = []
            for t in tasks:
                answers += [r + "</think>" + data.dsml_call([call]) for r, call in zip(t["reasons"], t["calls"])]
                answers.append(t["reasons"][-1] + "</think>" + t["ans"])
            script = os.path.join(root, "script.txt")
            with open(script, "w") as f:
                f.write("\n<<<NEXT>>>\n".join(answers) + "\n")
            trace = os.path.join(root, "trace.txt")
            srv = Server(a.server, a.model, "--scripted-output", script, "--trace", trace)
            ran_ok = True
            try:
                for i, t in enumerate(tasks):
                    rc, calls, _ = run_claude(t["q"], cwd, home, srv.base,
                                              len(t["calls"]) + 2, persist=True, resume=i > 0)
                    ran_ok = ran_ok and rc == 0 and len(calls) == len(t["calls"])
            finally:
                srv.stop()
            prompts = rendered_prompts(open(trace, encoding="utf-8").read())
            os.unlink(trace)
            shutil.rmtree(os.path.dirname(cwd))
            shutil.rmtree(home)
            # every scripted step ran, as scripted, and no tool failed
            if not ran_ok or len(prompts) != len(answers) or "<tool_use_error>" in prompts[-1]:
                skipped += 1
                continue
            text = prompts[-1] + answers[-1] + data.EOS
            out.write(json.dumps({"kind": "agent-claude", "text": text, "train_from": text.index(data.USER)},
                                 ensure_ascii=False) + "\n")
            made += 1
            if made % 10 == 0:
                print("%d sessions (%d skipped)" % (made, skipped), flush=True)
    shutil.rmtree(root)
    print("agent-claude %d docs of %d requests, %d skipped" % (made, a.rounds, skipped))


def same_path(got, want, cwd):
    return isinstance(got, str) and os.path.normpath(os.path.join(cwd, got)) == os.path.normpath(os.path.join(cwd, want))


def call_ok(got, want, cwd):
    (gname, ginput), (wname, wparams) = got, want
    if gname != wname:
        return False
    w = dict(wparams)
    if wname == "Bash":
        return isinstance(ginput.get("command"), str) and ginput["command"].strip() == w["command"]
    if not same_path(ginput.get("file_path"), w["file_path"], cwd):
        return False
    if wname == "Edit":
        return ginput.get("old_string") == w["old_string"] and ginput.get("new_string") == w["new_string"]
    return True   # a Read of the right file (a line limit or none)


def evaluate(a):
    rng = random.Random(a.seed)
    root = tempfile.mkdtemp(prefix="ds4-claude-eval-")
    home = os.path.join(root, "home")
    os.makedirs(home)
    srv = Server(a.server, a.model)
    results = {}
    try:
        for kind in KINDS:
            ok = answered = 0
            rows = []
            for _ in range(a.n):
                cwd = workspace_copy(root, rng)
                t = task(rng, kind, cwd)
                rc, calls, text = run_claude(t["q"], cwd, home, srv.base, len(t["calls"]) + 2)
                # exactly the expected calls: a read followed by an edit nobody asked for fails
                good = len(calls) == len(t["calls"]) and all(call_ok(g, w, cwd) for g, w in zip(calls, t["calls"]))
                got_answer = good and t["key"] != "" and t["key"] in text
                ok += good
                answered += got_answer
                rows.append({"q": t["q"], "calls": calls, "text": text[:300], "ok": good, "answer": got_answer})
                shutil.rmtree(os.path.dirname(cwd))
            results[kind] = {"correct_calls": ok, "answers": answered, "n": a.n, "tries": rows}
            print("%-6s correct calls %d/%d, answers from the result %d/%d" % (kind, ok, a.n, answered, a.n),
                  flush=True)
    finally:
        srv.stop()
        shutil.rmtree(root)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", required=True)
    c.add_argument("--n", type=int, default=200, help="sessions")
    c.add_argument("--rounds", type=int, default=4, help="requests per session")
    c.add_argument("--seed", type=int, default=31)
    c.add_argument("--even", action="store_true", help="the kinds of --mix in turn instead of drawn")
    c.add_argument("--mix", default=",".join(KINDS), help="the kinds drawn, a kind named twice twice as often")
    c.add_argument("--edit-style", default="line", choices=EDIT_STYLES)
    c.add_argument("--model", default="models/ds4-tiny.gguf", help="any model with the tokenizer (scripted answers)")
    e = sub.add_parser("eval")
    e.add_argument("model")
    e.add_argument("--n", type=int, default=50)
    e.add_argument("--seed", type=int, default=2001)
    e.add_argument("--out", default=None)
    for p in (c, e):
        p.add_argument("--server", default="./ds4-server")
    a = ap.parse_args()
    corpus(a) if a.cmd == "corpus" else evaluate(a)


if __name__ == "__main__":
    main()
