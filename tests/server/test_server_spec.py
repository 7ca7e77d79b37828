"""ds4-server --spec-lookup: speculative decoding in the server changes no
answer and is counted in /metrics.

- Two servers on the demo model, one with --spec-lookup 8: the same greedy
  chat and completion requests (a prompt that repeats itself, so the drafter
  could match) give byte-identical answers, logprobs and usage; the drafting
  server's /metrics (read by prometheus_client) has the drafter's counters.
- With --scripted-output whose text repeats the prompt, the scripted tokens
  are exactly what lookup drafts, so drafts are accepted: the answer equals
  the non-drafting server's and ds4_spec_accepted_tokens_total grows.
- --mtp on the trained tiny model (models/ds4-tiny.gguf with its trained
  block): the chat answer and usage equal the plain server's, and most drafts
  are accepted (/metrics).
- A server with --dspark (fixed five-token blocks) gives the same answers and
  counts its passes and drafts.
- --spec-lookup with --batched-session 2, and an out-of-range draft, are
  refused at start with one line.
"""
import os
import json
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from server_helper import MODEL, SERVER, Results, Server, demo_model_or_skip, write_temp_file

NAME = "test_server_spec"
demo_model_or_skip(NAME)
res = Results(NAME)

MOTIF = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
PROMPT = " ".join([MOTIF] * 4)


def metric(srv, name):
    status, _, body = srv.request("GET", "/metrics")
    res.check(status == 200, f"/metrics answers: {status}")
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    res.check(False, f"/metrics has {name}")
    return -1


def answers(srv):
    out = []
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "x", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48,
        "temperature": 0, "logprobs": True, "top_logprobs": 3, "thinking": {"type": "disabled"}})
    res.check(status == 200, f"chat answers 200: {status} {body[:200]!r}")
    r = json.loads(body)
    out.append((r["choices"][0]["message"], r["choices"][0].get("logprobs"), r["usage"]))
    status, _, body = srv.request("POST", "/v1/completions", {
        "model": "x", "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "logprobs": 3})
    res.check(status == 200, f"completion answers 200: {status} {body[:200]!r}")
    r = json.loads(body)
    out.append((r["choices"][0]["text"], r["choices"][0].get("logprobs"), r["usage"]))
    return out


plain = Server()
try:
    ref = answers(plain)
finally:
    plain.stop()
spec = Server("--spec-lookup", "8")
try:
    got = answers(spec)
    for (a, b, what) in zip(ref, got, ("chat", "completion")):
        res.check(a == b, f"{what}: the drafting server's answer, logprobs and usage equal the plain server's")
    # random weights rarely repeat, so drafts may never be proposed here; the counters exist
    res.check(metric(spec, "ds4_spec_draft_tokens_total") >= metric(spec, "ds4_spec_passes_total") >= 0,
              "every pass drafted at least one token")
finally:
    spec.stop()

# the DSpark block drafter at fixed five-token blocks: proposes on every pass, changes nothing
dspark = Server("--dspark", "models/demo-dspark.gguf", "--dspark-confidence", "0")
try:
    got = answers(dspark)
    for (a, b, what) in zip(ref, got, ("chat", "completion")):
        res.check(a == b, f"{what}: the DSpark server's answer, logprobs and usage equal the plain server's")
    passes, drafted = metric(dspark, "ds4_spec_passes_total"), metric(dspark, "ds4_spec_draft_tokens_total")
    # five per pass, fewer only in the last four passes of each of the two answers, where the
    # token budget left is under five (at most 4 + 3 + 2 + 1 fewer each)
    res.check(passes > 0 and 5 * passes - 20 <= drafted <= 5 * passes,
              f"DSpark drafted about five tokens on each pass: {drafted} on {passes} passes")
    runs = metric(dspark, "ds4_spec_draft_model_runs_total")
    res.check(runs >= passes, f"at confidence 0 the drafter ran on every pass: {runs} runs, {passes} passes")
finally:
    dspark.stop()

# scripted output that repeats the prompt's motif: what lookup drafts is what comes
script = write_temp_file(" " + " ".join([MOTIF] * 3))
scripted_ref = None
for extra in ((), ("--spec-lookup", "6")):
    srv = Server("--scripted-output", script, *extra)
    try:
        status, _, body = srv.request("POST", "/v1/chat/completions", {
            "model": "x", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 200,
            "temperature": 0, "thinking": {"type": "disabled"}})
        res.check(status == 200, f"scripted chat answers 200: {status}")
        r = json.loads(body)
        if not extra:
            scripted_ref = (r["choices"][0]["message"], r["usage"])
        else:
            res.check((r["choices"][0]["message"], r["usage"]) == scripted_ref,
                      "scripted answer and usage unchanged by drafting")
            acc = metric(srv, "ds4_spec_accepted_tokens_total")
            res.check(metric(srv, "ds4_spec_passes_total") > 0, "verification passes are counted")
            res.check(acc > 0, f"drafts matching the scripted tokens are accepted: {acc}")
    finally:
        srv.stop()

# the trained tiny model and its MTP block: real drafts, accepted
TINY = ("-m", os.path.join("models", "ds4-tiny.gguf"))
tiny_ref = None
for extra in ((), ("--mtp", os.path.join("models", "ds4-tiny-mtp.gguf"))):
    srv = Server(*TINY, *extra)
    try:
        status, _, body = srv.request("POST", "/v1/chat/completions", {
            "model": "x", "messages": [{"role": "user", "content": "What is a Python list?"}], "max_tokens": 120,
            "temperature": 0})
        res.check(status == 200, f"tiny model chat answers 200: {status}")
        r = json.loads(body)
        if not extra:
            tiny_ref = (r["choices"][0]["message"], r["usage"])
        else:
            res.check((r["choices"][0]["message"], r["usage"]) == tiny_ref and len(tiny_ref[0]["content"]) > 40,
                      "--mtp: the tiny model's answer and usage equal the plain server's")
            proposed, acc = metric(srv, "ds4_spec_draft_tokens_total"), metric(srv, "ds4_spec_accepted_tokens_total")
            res.check(proposed > 0 and acc >= 0.5 * proposed, f"--mtp: {acc:.0f} of {proposed:.0f} drafts accepted")
    finally:
        srv.stop()

for extra, what in ((("--batched-session", "2", "--spec-lookup", "4"), "with --batched-session 2"),
                    (("--spec-lookup", "17"), "of 17 drafted tokens")):
    p = subprocess.run([SERVER, "-m", MODEL, "--port", "0", *extra], capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    res.check(p.returncode == 2 and len(lines) == 1, f"--spec-lookup {what} refused in one line: rc {p.returncode}, "
              f"{p.stderr!r}")
res.done()
