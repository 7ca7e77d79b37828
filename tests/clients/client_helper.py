"""Shared by the real-client tests: where the pinned client binaries are
(tests/requirements-ci.txt installs them into .venv), an environment that
keeps them off the network, and DSML tool-call text for a scripted server.

The clients are the published binaries themselves: Claude Code as bundled
in the claude-agent-sdk wheel (_bundled/claude), Codex CLI as shipped in the
openai-codex-cli-bin wheel (bin/codex). A missing one skips the suite with
exit 77, which tests/run_tests.sh counts as a failure under CI=true.
"""
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "server"))

from server_helper import demo_model_or_skip  # noqa: E402,F401  (re-exported)

D = "｜DSML｜"
# What must never reach a client's visible text or reasoning.
LEAKS = ("DSML", "｜", "</think>", "<think>", "tool_calls>")


def package_file(package, *parts):
    """A file inside an installed package, or exit 77 naming what is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        print(f"SKIP: python package {package} not installed (pip install -r tests/requirements-ci.txt)")
        sys.exit(77)
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.access(path, os.X_OK):
        print(f"SKIP: {path} missing from the installed {package}")
        sys.exit(77)
    return path


def offline_env(home, **extra):
    """A minimal environment: a private HOME, no proxy or API variables from
    the caller, telemetry, update checks and error reporting off."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb",
           "NO_COLOR": "1"}
    env.update(extra)
    return env


def dsml_call(name, params):
    """The DSML block the model writes for one tool call (string parameters)."""
    body = "".join(f"<{D}parameter name=\"{k}\" string=\"true\">{v}</{D}parameter>\n" for k, v in params.items())
    return f"\n\n<{D}tool_calls>\n<{D}invoke name=\"{name}\">\n{body}</{D}invoke>\n</{D}tool_calls>"


def script(*answers):
    """A --scripted-output file's text: one answer per generation."""
    return "\n<<<NEXT>>>\n".join(answers) + "\n"


def generations(trace):
    """Per generation, from the server's trace: (prompt tokens, reused tokens)."""
    return [(int(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"cache: [^\n]*?, prompt (\d+) tokens, reused (\d+), prefill \d+", trace)]


def check_prefix_reuse(res, trace, label):
    """Every request after the first reuses at least the whole previous
    prompt: the client replayed the conversation without rewriting it."""
    gens = generations(trace)
    for k in range(1, len(gens)):
        res.check(gens[k][1] >= gens[k - 1][0],
                  f"{label}: request {k + 1} reuses the previous prompt's {gens[k - 1][0]} tokens: {gens[k]}")
    return gens
