#!/usr/bin/env python3
"""Builds the training corpus of the tiny DeepSeek V4 model (docs/tiny-model.md).

Every byte comes from files of this machine's Debian/Python installation or is
generated here from a seed:
  * code   the Python standard library sources (--pylib, PSF licence)
           and C headers (/usr/include, glibc and friends: mixed free licences);
  * prose  the English reference text of the Python documentation that CPython
           ships in pydoc_data/topics.py (PSF licence);
  * chat   synthetic conversations in the DeepSeek V4 chat format (ds4-server /
           ds4-agent rendering, docs/prompt-format.md): questions answered from
           the standard library's docstrings, a few hand-written paragraphs, and
           agent turns with DSML tool calls (list a directory, read a file, run
           a command, edit a file, answer from the tool result) whose results
           are the real outputs of running the tool on real files, in thinking
           and non-thinking modes.

Output (OUT, default build/train-tiny): corpus.jsonl, one document a line:
{"kind", "text", "train_from"}: text is the rendered document (chat documents
contain the seven protocol strings, which tokenize.py turns into their ids);
loss is taken from byte train_from on (the fixed agent prefix is not trained).

    python3 tools/train-tiny/data.py [--out DIR] [--seed N]
"""
import argparse
import glob
import importlib
import inspect
import json
import os
import random
import re
import subprocess
import sysconfig

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, THINK_END = "<think>", "</think>"
DSML = "｜DSML｜"
CLI_SYSTEM = "You are a helpful assistant"

# ds4-agent's system prompt (src/agent/loop.c) and tool schemas (src/agent/tools.c).
AGENT_SYSTEM = ("You are ds4-agent, a coding agent working in the directory %s. Use the tools to read, search and "
                "change files and to run commands; prefer small exact edits with edit_file. When the task is done, "
                "answer briefly.")
AGENT_TOOLS = [
    ("read_file", "Read a text file in the working directory. Optional 1-based inclusive line range.",
     '{"type":"object","properties":{"path":{"type":"string"},"start_line":{"type":"integer"},'
     '"end_line":{"type":"integer"}},"required":["path"]}'),
    ("write_file", "Create or overwrite a file with the given content.",
     '{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},'
     '"required":["path","content"]}'),
    ("edit_file", "Replace the exact text old_string, which must occur exactly once in the file, with new_string.",
     '{"type":"object","properties":{"path":{"type":"string"},"old_string":{"type":"string"},'
     '"new_string":{"type":"string"}},"required":["path","old_string","new_string"]}'),
    ("list_dir", "List a directory (default: the working directory); directories end with '/'.",
     '{"type":"object","properties":{"path":{"type":"string"}}}'),
    ("glob", "Find files whose path relative to the working directory matches a shell pattern (e.g. src/*.c, *.md).",
     '{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]}'),
    ("grep", "Search text files under a path (default: the working directory) for a PCRE regular expression; "
     "prints file:line:text.",
     '{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]}'),
    ("bash", "Run a shell command with /bin/sh in the working directory; returns its output and exit status.",
     '{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}'),
]

# The ds4 tools block (docs/prompt-format.md; deepseek-v4-prompt-format 6.2), {} = schema lines.
TOOLS_BLOCK = (
    "## Tools\n\nYou have access to a set of tools to help answer the user question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as raw text and set `string=\"true\"`. "
    "Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or "
    "HTML entity escapes. Only if a string value itself contains the exact closing parameter tag "
    "`</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> "
    "with tool calls or final response.\n\n### Available Tool Schemas\n\n{}\n\nYou MUST strictly follow the "
    "above defined tool name and parameter schemas to invoke tool calls. Use the exact parameter names from the "
    "schemas.")

# A client's own tool set (an OpenAI-style request to ds4-server), so calls are
# not tied to ds4-agent's names alone.
CLIENT_TOOLS = [
    ("list_files", "List the files in a directory.",
     '{"type":"object","properties":{"path":{"type":"string","description":"Directory to list"}},"required":["path"]}'),
    ("read_file", "Read the contents of a file.",
     '{"type":"object","properties":{"path":{"type":"string","description":"File to read"}},"required":["path"]}'),
    ("run_command", "Run a shell command and return its output.",
     '{"type":"object","properties":{"command":{"type":"string","description":"The command line"}},'
     '"required":["command"]}'),
]


def schema_lines(tools):
    return "\n".join(json.dumps({"name": n, "description": d, "parameters": None},
                                separators=(",", ":")).replace("null", p) for n, d, p in tools)


def dsml_call(calls):
    """Canonical ds4 DSML block for [(name, [(key, value)])] (string values raw,
    others compact JSON), with its leading blank line."""
    out = ["\n\n<" + DSML + "tool_calls>"]
    for name, params in calls:
        out.append("\n<" + DSML + "invoke name=\"" + name + "\">")
        for k, v in params:
            if isinstance(v, str):
                out.append("\n<" + DSML + "parameter name=\"" + k + "\" string=\"true\">" + v + "</" + DSML + "parameter>")
            else:
                out.append("\n<" + DSML + "parameter name=\"" + k + "\" string=\"false\">"
                           + json.dumps(v, separators=(",", ":")) + "</" + DSML + "parameter>")
        out.append("\n</" + DSML + "invoke>")
    out.append("\n</" + DSML + "tool_calls>")
    return "".join(out)


def tool_result(text):
    return "<tool_result>" + text.replace("</tool_result>", "&lt;/tool_result>") + "</tool_result>"


# ------------------------------------------------------------------ sources

PYLIB = sysconfig.get_paths()["stdlib"]


def python_sources(rng, limit_bytes):
    files = sorted(glob.glob(os.path.join(PYLIB, "*.py")) + glob.glob(os.path.join(PYLIB, "*", "*.py")))
    files = [f for f in files if "/test" not in f and "/idlelib/" not in f and "site-packages" not in f
             and "pydoc_data" not in f]
    rng.shuffle(files)
    out, total = [], 0
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > 60000 or "<｜" in text:
            continue
        out.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return out


def c_headers(rng, limit_bytes):
    files = sorted(glob.glob("/usr/include/*.h") + glob.glob("/usr/include/*/*.h"))
    rng.shuffle(files)
    out, total = [], 0
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > 30000 or len(text) < 500:
            continue
        out.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return out


def prose():
    from pydoc_data import topics
    return [v.strip() + "\n" for _, v in sorted(topics.topics.items())]


# Hand-written answers for the demo's own prompts and a few common questions.
PARAGRAPHS = {
    "Redis streams": "A Redis stream is an append-only log stored under one key. Each entry has a unique ID made of "
    "a millisecond timestamp and a sequence number, and holds a small set of field-value pairs. XADD appends an entry, "
    "XRANGE and XREAD read entries by ID, and XREAD can block until new data arrives. Consumer groups (XGROUP, "
    "XREADGROUP, XACK) let several clients share the work of one stream while Redis remembers which entries each "
    "consumer has received and acknowledged, so streams are a good fit for event logs, queues and messaging.",
    "Redis": "Redis is an in-memory data structure server. It keeps strings, lists, hashes, sets, sorted sets and "
    "streams in memory, answers commands over a simple text protocol, and can persist data to disk with snapshots or "
    "an append-only file. It is used as a cache, a message broker and a fast database.",
    "a hash table": "A hash table stores key-value pairs in an array of buckets. A hash function turns each key into "
    "an index, so lookups, inserts and deletes take constant time on average. Collisions, two keys with the same "
    "index, are handled by chaining or open addressing, and the table is resized when it becomes too full.",
    "a linked list": "A linked list is a sequence of nodes where each node holds a value and a pointer to the next "
    "node. Inserting or removing a node is cheap once you have a pointer to its neighbour, but finding the n-th "
    "element needs a walk from the head, so access takes linear time.",
    "recursion": "Recursion is when a function calls itself to solve a smaller instance of the same problem. Every "
    "recursive function needs a base case that stops the calls, and each call must move closer to it; factorial, "
    "tree traversal and quicksort are classic examples.",
    "a process and a thread": "A process is a running program with its own address space, file descriptors and "
    "resources. A thread is a path of execution inside a process; threads of one process share its memory, so they "
    "communicate cheaply but must use locks or other synchronisation to avoid races.",
    "Git": "Git is a distributed version control system. Every clone holds the full history as a graph of commits; "
    "branches are cheap pointers to commits, and changes move between repositories with fetch, pull and push.",
    "a Python list": "A Python list is a mutable, ordered sequence. It grows as needed, supports indexing and slicing, "
    "and has methods such as append, extend, insert, pop, remove and sort. Appending is fast, while inserting at the "
    "front is slow because every element has to move.",
    "TCP": "TCP is a connection-oriented transport protocol. It delivers a reliable, ordered byte stream between two "
    "endpoints, using sequence numbers, acknowledgements and retransmission, and it adapts its sending rate with flow "
    "control and congestion control.",
    "a pointer in C": "A pointer in C is a variable that holds the address of another object. The unary * operator "
    "reads or writes the object it points to, & takes an address, and pointer arithmetic moves in units of the "
    "pointed-to type. A null pointer points to nothing and must not be dereferenced.",
    "DeepSeek V4": "DeepSeek V4 is a mixture-of-experts language model. Each layer mixes hyper-connection streams, "
    "attention over a sliding window plus compressed key-value rows chosen by an indexer, and a feed-forward block "
    "that routes every token to a few experts next to one shared expert.",
}
PRINCIPLES = {
    "Redis design principles": ["Keep the data in memory and the data structures simple, so every command is fast "
                                "and predictable.",
                                "Run commands on a single thread, so each command is atomic without locks.",
                                "Prefer a small, composable set of commands and a simple protocol over features that "
                                "are hard to reason about."],
    "good C coding practices": ["Check every return value and handle errors at the point they happen.",
                                "Keep functions short and give each one a single job.",
                                "Free every allocation on every path, and compile with warnings as errors."],
    "ways to speed up a Python program": ["Measure first with a profiler to find the slow part.",
                                          "Use built-in functions and the right data structure, such as a set for "
                                          "membership tests.",
                                          "Move heavy loops into libraries written in C, or cache repeated work."],
}

DOC_MODULES = ["json", "os", "os.path", "re", "string", "textwrap", "collections", "itertools", "functools", "math",
               "random", "shutil", "subprocess", "pathlib", "datetime", "time", "hashlib", "base64", "csv", "heapq",
               "bisect", "statistics", "glob", "fnmatch", "tempfile", "logging", "argparse", "urllib.parse", "socket",
               "struct", "zlib", "gzip", "tarfile", "zipfile", "copy", "pprint", "difflib", "typing", "dataclasses",
               "enum", "operator", "contextlib", "threading", "queue", "sqlite3", "html", "uuid", "secrets", "io",
               "calendar", "fractions", "decimal", "inspect", "traceback", "pickle", "shlex", "codecs", "locale",
               "platform", "signal", "select", "array", "weakref", "abc", "numbers", "cmath", "filecmp", "configparser"]


def docstring_facts():
    facts = []
    for mname in DOC_MODULES:
        try:
            mod = importlib.import_module(mname)
        except ImportError:
            continue
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc:
                continue
            para = doc.split("\n\n")[0].replace("\n", " ").strip()
            if len(para) < 30 or len(para) > 600 or "<｜" in para:
                continue
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = None
            facts.append((mname + "." + name, sig, para))
    return facts


# ------------------------------------------------------------------ chat rendering

def chat_doc(system, turns, think, tools=None):
    """BOS + system block + turns; turns: list of (user_text, assistant_list)
    where assistant_list = [(reasoning, content, calls, results)] per step
    (results: list of tool result texts, None for the final step). Mirrors
    ds4-agent's transcript (generation prompt, EOS, tool results as a user turn).
    Returns (text, offset of the first user turn)."""
    block = TOOLS_BLOCK.replace("{}", schema_lines(tools)) if tools else ""
    sysblock = block + ("\n\n" if block and system else "") + (system or "")
    text = BOS + sysblock
    start = len(text)
    for user, steps in turns:
        text += USER + user
        for reasoning, content, calls, results in steps:
            text += ASSISTANT + (THINK + reasoning + THINK_END if think else THINK_END)
            text += content + (dsml_call(calls) if calls else "") + EOS
            if results is not None:
                text += USER + "".join(tool_result(r) for r in results)
    return text, start


def pick(rng, xs):
    return xs[rng.randrange(len(xs))]


def qa_docstring(rng, fact, think):
    name, sig, para = fact
    q = pick(rng, ["What does {n} do?", "Explain {n} in one paragraph.", "What is {n} in Python?",
                   "How do I use {n}?", "Describe the Python function {n}.", "Tell me about {n}."]).format(n=name)
    call = name + (sig if sig and len(sig) < 80 else "()")
    a = pick(rng, ["`{c}`: {p}", "{p}", "In Python, `{c}` works as follows. {p}", "`{n}` is part of the `{m}` module. {p}"]
             ).format(c=call, p=para, n=name, m=name.rsplit(".", 1)[0])
    r = "The user asks about {}. It is in the {} module; I will summarise its documentation.".format(
        name, name.rsplit(".", 1)[0])
    return chat_doc(pick(rng, [CLI_SYSTEM, CLI_SYSTEM, "You are a concise Python expert.", None]),
                    [(q, [(r, a, None, None)])], think)


def qa_paragraph(rng, think):
    if rng.random() < 0.35:
        topic, items = pick(rng, sorted(PRINCIPLES.items()))
        n = 3
        q = pick(rng, ["List three {t}.", "What are three {t}?", "Give me three {t}.", "Name three {t}."]).format(t=topic)
        a = pick(rng, ["", "Here are three {t}:\n\n".format(t=topic)]) + "\n".join(
            "%d. %s" % (i + 1, s) for i, s in enumerate(items[:n]))
        r = "The user wants a short list of {}. Three items are enough.".format(topic)
    else:
        topic, para = pick(rng, sorted(PARAGRAPHS.items()))
        q = pick(rng, ["Explain {t} in one paragraph.", "What is {t}?", "Explain {t}.", "Tell me about {t}.",
                       "Describe {t} briefly."]).format(t=topic)
        a, r = para, "The user wants a short explanation of {}. One paragraph is enough.".format(topic)
    return chat_doc(pick(rng, [CLI_SYSTEM, CLI_SYSTEM, None]), [(q, [(r, a, None, None)])], think)


def small_talk(rng, think):
    pairs = [("Hello!", "Hello! How can I help you today?"), ("Hi", "Hi! What can I do for you?"),
             ("Who are you?", "I am a small DeepSeek V4 model trained for the DwarfStar demo. I can answer short "
              "questions about Python, C and common tools, and call tools when they are available."),
             ("Thanks!", "You're welcome!"), ("What can you do?", "I can explain Python functions and common "
              "programming ideas, and with tools I can list directories, read files, run commands and edit files."),
             ("What is 2 + 2?", "2 + 2 = 4."), ("What is 3 * 7?", "3 * 7 = 21."), ("What is 10 - 4?", "10 - 4 = 6.")]
    q, a = pick(rng, pairs)
    return chat_doc(pick(rng, [CLI_SYSTEM, None]), [(q, [("A short reply is enough.", a, None, None)])], think)


# ------------------------------------------------------------------ agent tasks on real files

def list_dir_result(path):
    names = []
    for n in sorted(os.listdir(path)):
        names.append(n + "/" if os.path.isdir(os.path.join(path, n)) else n)
    return "".join(n + "\n" for n in names), names


def run(cmd, cwd):
    p = subprocess.run(["/bin/sh", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=10)
    out = (p.stdout + p.stderr)[:1500]
    return out + ("\n" if out else "") + "[exit status %d]" % p.returncode


# More phrasings of each request (agent_case(more=True), used by the
# multi-request sessions): the same tasks asked in other words, so the call
# follows the request's content rather than one template's wording. Without
# more, agent_case draws exactly as before (eval_tools.py replays its draws).
MORE_PHRASINGS = {
    "list_sub": ["List {d}.", "Show the files in {d}.", "What files does {d} contain?", "Give me a listing of {d}.",
                 "Can you list {d}?", "What's inside {d}?", "List the contents of {d}.", "Show what is in {d}."],
    "list_root": ["List the files.", "What's in this directory?", "Show me the files here.",
                  "List the working directory.", "What files are in this folder?", "Show the current directory."],
    "read_n": ["Show lines 1-{n} of {f}.", "Read the first {n} lines of {f}.", "Print the first {n} lines of {f}.",
               "Open {f} and show me its first {n} lines.", "Give me lines 1 through {n} of {f}."],
    "read": ["Read the file {f}.", "Show the contents of {f}.", "Print {f}.", "Can you read {f}?",
             "Open the file {f}.", "What's in {f}?", "Display {f}.", "Let me see {f}."],
    "count": ["How many lines are in {f}?", "Count the lines of {f}.", "What is the line count of {f}?",
              "Tell me how many lines {f} has.", "Number of lines in {f}?", "How many lines is {f}?"],
    "run": ["Run this command: `{c}`.", "Can you run `{c}`?", "Run {c}.", "Execute `{c}`.", "Please execute {c}.",
            "Run `{c}` for me.", "Run `{c}` and show me the output."],
    "edit": ["Replace `{o}` with `{n}` in {f}.", "Edit {f} so that `{o}` becomes `{n}`.",
             "Update {f}: change `{o}` to `{n}`.", "In {f}, `{o}` should become `{n}`.",
             "In {f}, change the line `{o}` to `{n}`."],
}


def agent_case(rng, roots, client, more=False, want=None, top=None):
    """One agent task on a real directory: the request, the expected call, the
    tool's real output, the reasoning of both steps and the grounded answer
    (key: the fact from the tool result the answer must contain). more: the
    request's phrasing is drawn from MORE_PHRASINGS too; want: this kind of
    task (when the directory allows it). top: the agent works in this
    directory (a workspace), so files of a subdirectory are named by their
    path from it and commands run in it; else in the drawn directory."""
    def ask(key, phrasings):
        return pick(rng, phrasings + (MORE_PHRASINGS[key] if more else []))

    base = pick(rng, roots)                        # a real directory on this machine
    cwd = top or base

    def shown(name):                               # a name as the request and the call give it
        return os.path.relpath(os.path.join(base, name), cwd)
    project = pick(rng, ["/home/user/project", "/home/ana/src/app", "/srv/work", "/tmp/demo", "/home/dev/code",
                         "/work/repo"])
    entries = [e for e in sorted(os.listdir(base)) if not e.startswith(".")]
    files = [e for e in entries if os.path.isfile(os.path.join(base, e)) and e.endswith((".py", ".txt", ".cfg", ".h"))]
    subdirs = [e for e in entries if os.path.isdir(os.path.join(base, e))]
    kind = pick(rng, ["list", "list", "read", "read", "run", "run", "edit", "count"])
    kind = want or kind
    if kind in ("read", "edit", "count") and not files:
        kind = "list"
    names = ("list_files", "read_file", "run_command") if client else ("list_dir", "read_file", "bash")
    if kind == "list":
        sub = pick(rng, subdirs) if subdirs and rng.random() < 0.5 else None
        if not sub and base != cwd:                # "the current directory" is the workspace
            sub = os.path.relpath(base, cwd)
        else:
            sub = sub and shown(sub)
        path = os.path.join(cwd, sub) if sub else cwd
        where = sub or "."
        q = (ask("list_sub", ["List the files in {d}.", "What is in {d}?", "Show me the contents of {d}.",
                              "Which files are in {d}?", "ls {d}"]) if sub else
             ask("list_root", ["List the files in the current directory.", "What files are here?",
                               "Show me the directory.", "List this directory.", "What is in the working directory?"])
             ).format(d=sub)
        out, listed = list_dir_result(path)
        if client:
            call = (names[0], [("path", where)])
        else:
            call = (names[0], [("path", sub)] if sub else [])
        r1 = "The user wants the contents of {}. I will call {}.".format(where if sub else "the working directory", names[0])
        if len(listed) > 12:
            ans = "{} has {} entries, among them {}.".format(sub or "The directory", len(listed), ", ".join(listed[:8]))
        else:
            ans = "{} contains: {}.".format(sub or "The directory", ", ".join(listed) if listed else "nothing")
        r2 = "The listing has {} entries.".format(len(listed))
    elif kind == "read":
        name = pick(rng, files)
        f = shown(name)
        lines = open(os.path.join(base, name), encoding="utf-8", errors="replace").read().split("\n")
        n = rng.choice([5, 10, 20])
        if rng.random() < 0.5:
            q = ask("read_n", ["Show me the first {n} lines of {f}.", "Read lines 1 to {n} of {f}.",
                               "Print the beginning of {f} ({n} lines)."]).format(n=n, f=f)
            params = [("path", f), ("start_line", 1), ("end_line", n)] if not client else [("path", f)]
        else:
            q = ask("read", ["Read {f}.", "What is in {f}?", "Open {f}.", "Show me {f}.", "What does {f} start with?"]
                    ).format(f=f)
            params = [("path", f), ("start_line", 1), ("end_line", 20)] if not client else [("path", f)]
            n = 20
        out = "".join(l + "\n" for l in lines[:n])
        call = (names[1], params)
        first = next((l.strip() for l in lines if l.strip()), "")
        r1 = "I need to read {} first.".format(f)
        ans = "{} starts with `{}`.".format(f, first[:100]) if first else "{} is empty.".format(f)
        r2 = "I have the first lines of {}.".format(f)
    elif kind == "count":
        f = shown(pick(rng, files))
        q = ask("count", ["How many lines does {f} have?", "Count the lines in {f}.", "How long is {f}?"]).format(f=f)
        cmd = "wc -l " + f
        out = run(cmd, cwd)
        call = (names[2], [("command", cmd)])
        cnt = out.split()[0] if out.split() else "?"
        r1 = "I can count the lines with wc -l."
        ans = "{} has {} lines.".format(f, cnt)
        r2 = "wc printed {}.".format(cnt)
    elif kind == "run":
        cmd, what = pick(rng, [("ls", "the files"), ("ls -1 | head -5", "the first five files"),
                               ("pwd", "the directory"), ("python3 --version", "the Python version"),
                               ("ls | wc -l", "the number of files"), ("du -sh .", "the size"),
                               ("grep -c def " + (shown(pick(rng, files)) if files else "x.py"), "the count of def lines"),
                               ("head -3 " + (shown(pick(rng, files)) if files else "x.py"), "the first three lines"),
                               ("echo hello", "hello"), ("date +%Y", "the year")])
        q = ask("run", ["Run `{c}`.", "Run {c} and tell me the result.", "Please run `{c}`.", "Execute {c}."]
                ).format(c=cmd)
        out = run(cmd, cwd).replace(cwd, project)
        call = (names[2], [("command", cmd)])
        r1 = "I will run the command with {}.".format(names[2])
        body = out.rsplit("[exit status", 1)[0].strip()
        status = out.rsplit("[exit status ", 1)[1].rstrip("]") if "[exit status " in out else "?"
        if status == "0":
            ans = "The command succeeded." + (" Output:\n\n```\n" + body[:400] + "\n```" if body else "")
        else:
            ans = "The command failed with exit status {}.".format(status)
        r2 = "The command exited with status {}.".format(status)
    else:  # edit
        name = pick(rng, files)
        f = shown(name)
        lines = open(os.path.join(base, name), encoding="utf-8", errors="replace").read().split("\n")
        cands = [(i, l) for i, l in enumerate(lines) if 8 < len(l.strip()) < 60 and
                 sum(1 for x in lines if l.strip() in x) == 1 and "=" in l]
        if not cands:
            return agent_case(rng, roots, client, more, want, top)
        i, line = pick(rng, cands)
        old = line.strip()
        lhs, rhs = old.split("=", 1)
        new = lhs.rstrip() + " = " + pick(rng, ["None", "0", "1", "True", "False", "''", "[]"])
        q = ask("edit", ["In {f}, replace `{o}` with `{n}`.", "Change `{o}` to `{n}` in {f}.",
                         "Edit {f}: `{o}` should be `{n}`."]).format(f=f, o=old, n=new)
        if client:
            return agent_case(rng, roots, client, more, want, top)
        call = ("edit_file", [("path", f), ("old_string", old), ("new_string", new)])
        out = "edited {} at line {}: replaced 1 lines with 1 lines".format(f, i + 1)
        r1 = "The user gave the exact old and new text, so one edit_file call does it."
        ans = "Done: line {} of {} now reads `{}`.".format(i + 1, f, new)
        r2 = "The edit was applied at line {}.".format(i + 1)
    key = {"list": (listed[0] if kind == "list" and listed else ""), "read": first[:40] if kind == "read" else "",
           "count": cnt if kind == "count" else "",
           "run": ("succeeded" if status == "0" else "exit status " + status) if kind == "run" else "",
           "edit": "line {}".format(i + 1) if kind == "edit" else ""}[kind]
    return dict(kind=kind, q=q, call=call, out=out, r1=r1, r2=r2, ans=ans, project=project, key=key)


def agent_task(rng, roots, think, client, top=None):
    c = agent_case(rng, roots, client, top=top)
    if client:
        system = pick(rng, [CLI_SYSTEM, "You are a helpful assistant.", None])
        tools = CLIENT_TOOLS
    else:
        system, tools = AGENT_SYSTEM % c["project"], AGENT_TOOLS
    content1 = "" if rng.random() < 0.8 else pick(rng, ["Let me check.", "Sure."])
    steps = [(c["r1"], content1, [c["call"]], [c["out"]]), (c["r2"], c["ans"], None, None)]
    return chat_doc(system, [(c["q"], steps)], think, tools)


def identifier_words(sources, skip_hex):
    """The lower-case identifiers of 3-12 characters in sources, sorted;
    skip_hex leaves out u/x-prefixed hex runs (u0e46, x90: escapes and
    constants of the codec modules, far more frequent than real words)."""
    return sorted({w for text in sources for w in re.findall(r"\b[a-z][a-z0-9]{2,11}\b", text)
                   if not (skip_hex and re.fullmatch(r"[ux][0-9a-f]+", w))})


def generated_trees(rng, where, n, sources):
    """n directories under where whose file and subdirectory names are drawn
    at random from identifiers of the standard library (joined by _, -, or
    nothing, with .py, .h, .txt or .cfg), each file a run of lines of a
    real source file. A request about such a file can only be answered by
    copying its name from the request: the names of the machine's real
    directories repeat across the corpus, and a model can get them right by
    recalling frequent ones instead (docs/tiny-model.md)."""
    words = identifier_words(sources, skip_hex=False)

    def name():
        parts = [pick(rng, words) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
        return pick(rng, ["_", "", "-"]).join(parts)

    roots = []
    for i in range(n):
        base = os.path.join(where, "%04d" % i, name())
        os.makedirs(base, exist_ok=True)
        for _ in range(rng.randint(1, 3)):
            os.makedirs(os.path.join(base, name()), exist_ok=True)
        for _ in range(rng.randint(3, 14)):
            lines = pick(rng, sources).split("\n")
            start = rng.randrange(len(lines))
            body = "\n".join(lines[start:start + rng.randint(5, 60)]) + "\n"
            with open(os.path.join(base, name() + pick(rng, [".py", ".py", ".h", ".txt", ".cfg"])), "w") as f:
                f.write(body)
        roots.append(base)
    return roots


COPY_ASKS = ["Repeat exactly: {s}", "Say `{s}`.", "Echo {s}", "Copy this text: {s}", "Type `{s}` back to me.",
             "Write {s} again.", "Repeat `{s}`.", "Print {s}"]


def copy_drill(rng, words, lines, turns):
    """A chat of `turns` requests to repeat a string (a random file name, a
    line of real source, or a command on a random file), each answered with
    exactly that string: every answer token is a copy from the request, the
    skill a tool call's arguments need, which the agent documents teach too
    slowly (their names repeat, so recalling a frequent one is a cheaper
    guess than copying)."""
    def name():
        return pick(rng, ["_", "", "-"]).join(pick(rng, words) for _ in range(rng.choice([1, 2, 2, 3]))) + \
            pick(rng, [".py", ".h", ".txt", ".cfg", ""])
    out = []
    for _ in range(turns):
        r = rng.random()
        if r < 0.45:
            text = name()
        elif r < 0.75:
            text = pick(rng, lines)
        else:
            text = pick(rng, ["wc -l ", "head -3 ", "grep -c def ", "ls ", "cat "]) + name()
        out.append((pick(rng, COPY_ASKS).format(s=text), [("", text, None, None)]))
    return chat_doc(pick(rng, [CLI_SYSTEM, None]), out, False)


def workspace_roots(path):
    """The directories of a workspace (data/ds4-tiny/workspace: a small
    project committed beside the model) as agent_case roots: the workspace
    itself and each subdirectory, so a task runs in any of them."""
    return [path] + sorted(os.path.join(path, d) for d in os.listdir(path)
                           if os.path.isdir(os.path.join(path, d)) and d != "__pycache__")


SESSION_KINDS = ["list", "read", "run", "count", "edit"]


def agent_session(rng, roots, rounds, max_out, top=None, think=False):
    """One ds4-agent session with several requests in a row (in thinking mode
    when think: each step's reasoning stays in the transcript, as ds4-agent
    keeps it whenever tools are in the prompt),
    each answered with its call, the real result and the answer, as a user of
    ds4-agent asks one thing after another. Each request's kind is drawn
    evenly (the single-request documents favour list and read), its phrasing
    from MORE_PHRASINGS too, and results longer than max_out characters are
    drawn again, so a session fits a 2,048-token training sequence with
    several tool calls: one fixed prefix (the agent's 752 tokens, no loss)
    then carries many calls that do."""
    turns, project = [], None
    for _ in range(rounds):
        want = pick(rng, SESSION_KINDS)
        for _ in range(10):
            c = agent_case(rng, roots, False, more=True, want=want, top=top)
            if len(c["out"]) <= max_out:
                break
        project = project or c["project"]
        content1 = "" if rng.random() < 0.8 else pick(rng, ["Let me check.", "Sure."])
        turns.append((c["q"], [(c["r1"], content1, [c["call"]], [c["out"]]), (c["r2"], c["ans"], None, None)]))
    return chat_doc(AGENT_SYSTEM % project, turns, think, AGENT_TOOLS)


def main():
    global PYLIB
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/train-tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--code-bytes", type=int, default=3_000_000)
    ap.add_argument("--c-bytes", type=int, default=600_000)
    ap.add_argument("--chats", type=int, default=24000)
    ap.add_argument("--agent", type=int, default=9000)
    ap.add_argument("--sessions", type=int, default=0, help="multi-request ds4-agent sessions (agent_session)")
    ap.add_argument("--session-rounds", type=int, default=7)
    ap.add_argument("--session-max-out", type=int, default=700, help="tool results longer than this are drawn again")
    ap.add_argument("--session-think", type=float, default=0.0, help="share of the sessions in thinking mode "
                    "(ds4-agent's default)")
    ap.add_argument("--generated-trees", type=int, default=0, help="directories with random names "
                    "(generated_trees) that this share of the agent documents and sessions draws from")
    ap.add_argument("--generated-share", type=float, default=0.7)
    ap.add_argument("--copy-drills", type=int, default=0, help="chats of requests to repeat a string (copy_drill)")
    ap.add_argument("--workspace", default=None, help="a workspace (workspace_roots) that --workspace-share of "
                    "the agent documents and sessions draw from")
    ap.add_argument("--workspace-share", type=float, default=0.8)
    ap.add_argument("--pylib", default=PYLIB, help="the Python standard library to read (default: this "
                    "interpreter's; Debian's libpython3.11-stdlib is /usr/lib/python3.11)")
    a = ap.parse_args()
    PYLIB = a.pylib
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    docs = []
    for t in python_sources(rng, a.code_bytes):
        docs.append(("python", BOS + t, 0))
    for t in c_headers(rng, a.c_bytes):
        docs.append(("c", BOS + t, 0))
    for t in prose():
        docs.append(("prose", BOS + t, 0))
    facts = docstring_facts()
    for i in range(a.chats):
        think = rng.random() < 0.4
        r = rng.random()
        if r < 0.7:
            text, start = qa_docstring(rng, pick(rng, facts), think)
            kind = "chat-doc"
        elif r < 0.93:
            text, start = qa_paragraph(rng, think)
            kind = "chat-para"
        else:
            text, start = small_talk(rng, think)
            kind = "chat-small"
        docs.append((kind, text, start))
    roots = sorted(d for d in glob.glob(os.path.join(PYLIB, "*")) + glob.glob("/usr/include/*")
                   if os.path.isdir(d) and "__pycache__" not in d and os.access(d, os.R_OK) and os.listdir(d))
    roots = [d for d in roots if len(os.listdir(d)) < 200]
    made = (generated_trees(rng, os.path.join(a.out, "trees"), a.generated_trees, python_sources(rng, 2_000_000))
            if a.generated_trees else [])

    ws = workspace_roots(a.workspace) if a.workspace else []

    def draw_roots():   # the directories of a document and the workspace it works in (or None)
        if ws and rng.random() < a.workspace_share:
            return ws, a.workspace
        return (made if made and rng.random() < a.generated_share else roots), None
    for i in range(a.agent):
        think = rng.random() < 0.5
        client = rng.random() < 0.2
        dirs, top = draw_roots()
        text, start = agent_task(rng, dirs, think, client, top)
        docs.append(("agent-client" if client else "agent", text, start))
    for i in range(a.sessions):
        dirs, top = draw_roots()
        # drawn only when asked, so the corpora of earlier phases reproduce
        think = a.session_think > 0 and rng.random() < a.session_think
        text, start = agent_session(rng, dirs, a.session_rounds, a.session_max_out, top, think)
        docs.append(("agent-session", text, start))
    if a.copy_drills:
        src = python_sources(rng, 2_000_000)
        words = identifier_words(src, skip_hex=True)
        lines = sorted({l.strip() for t in src for l in t.split("\n") if 8 < len(l.strip()) < 60})
        for i in range(a.copy_drills):
            text, start = copy_drill(rng, words, lines, rng.randint(3, 8))
            docs.append(("chat-copy", text, start))
    rng.shuffle(docs)
    with open(os.path.join(a.out, "corpus.jsonl"), "w") as f:
        for kind, text, start in docs:
            f.write(json.dumps({"kind": kind, "text": text, "train_from": start}, ensure_ascii=False) + "\n")
    by = {}
    for kind, text, _ in docs:
        n, b = by.get(kind, (0, 0))
        by[kind] = (n + 1, b + len(text.encode()))
    for k in sorted(by):
        print("%-13s %6d docs %10d bytes" % (k, by[k][0], by[k][1]))
    print("facts from docstrings:", len(facts))


if __name__ == "__main__":
    main()
