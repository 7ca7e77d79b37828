"""ds4-eval end to end on the demo model (random weights, real tokenizer)
with a scripted model: --scripted-output forces each question's reply
token by token through the real generation loop, so the score is known in
advance.
- The first 12 questions get replies in many formats; exactly the 7 chosen
  ones are right. The plain report must show those 7 as PASS with the
  picked answers, the others as FAIL, per-category and overall counts.
- --regrade-trace on the run's trace reproduces every verdict without a
  model (no -m given; no model is loaded), "0 changed".
- A trace edited to make one wrong reply right regrades with that case
  listed as changed, with the old and the new picked answer.
- The drift gate passes on the counts the run produced and fails on others.
- Refusals are one line: a context past the model's, a bad selection, a
  trace that is not one.
- A sampled run's trace (random tokens that split characters) is valid
  UTF-8 JSON, each token with its exact bytes in hex.
The keys below are the question set's own (src/quality/eval_questions.c), written
here independently.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results  # noqa: E402

results = Results("test_eval_scripted")
check = results.check
EVAL = os.path.join(ROOT, "ds4-eval")
DEMO = os.path.join(ROOT, "models", "demo.gguf")

# (id, category, key, reply, right?) -- the reply is what follows "<think>"
CASES = [
    (1, "mc", "B", "Nitrogen is 78%.</think>\n\nAnswer: **B**", True),
    (2, "math", "391", "17*20=340, 17*3=51.</think>\n\n$\\boxed{391}$", True),
    (3, "code", "10", "0+1+2+3+4</think>\n\nThe program prints `10`.", True),
    (4, "sec", "4", "strcat is unbounded.</think>\n\nAnswer: line 4", True),
    (5, "mc", "C", "d = g t^2 / 2</think>\n\nAnswer: 40 m", False),
    (6, "math", "5050", "Gauss.</think>\n\nAnswer: 5,050.", True),
    (7, "code", "4", "y aliases x.</think>\n\nAnswer: 3", False),
    (8, "sec", "3", "i <= n</think>\n\nAnswer: 4", False),
    (9, "mc", "D", "pH = 3</think>\n\nAnswer: 3", True),
    (10, "math", "24", "(3+1)(2+1)(1+1)</think>\n\nAnswer: 36", False),
    (11, "code", "cba", "reverse</think>\n\nAnswer: \"abc\"", False),
    (12, "sec", "4", "printf(line)</think>\n\n**Answer: 4**", True),
]
RIGHT = sum(c[4] for c in CASES)


def run(*args, timeout=300):
    return subprocess.run([EVAL, *args], cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout)


def report_rows(out):
    """{id: (result, answer, expected)} from the report table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"q(\d+)\s+(\w+)\s+(\d+)\s+(\d+)\s+(PASS|FAIL|STOP|SKIP)\s+(.*?)\s{2,}(\S.*)$", line)
        if m:
            rows[int(m.group(1))] = (m.group(5), m.group(6).strip(), m.group(7).strip(), int(m.group(4)))
    return rows


def overall(out):
    m = re.search(r"^overall\s+(\d+)\s+(\d+)\s+(\d+)", out, re.M)
    return tuple(map(int, m.groups())) if m else None


if not os.path.exists(DEMO):
    print(f"test_eval_scripted: SKIPPED: {DEMO} missing (make models/demo.gguf)")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "replies.txt")
    with open(script, "w") as f:
        f.write("\n@@@\n".join(c[3] for c in CASES))
    trace = os.path.join(tmp, "trace.jsonl")
    r = run("-m", DEMO, "--plain", "--questions", "12", "--tokens", "64", "--temp", "0", "--seed", "1",
            "--scripted-output", script, "--trace", trace)
    check(r.returncode == 0, f"scripted run: rc {r.returncode}, {r.stderr[-500:]!r}")
    rows = report_rows(r.stdout)
    check(sorted(rows) == list(range(1, 13)), f"report rows {sorted(rows)}:\n{r.stdout}")
    for qid, cat, key, reply, right in CASES:
        got = rows.get(qid)
        check(got is not None and got[0] == ("PASS" if right else "FAIL") and got[2] == key,
              f"q{qid}: {got} (right={right}, key {key})")
    check(rows.get(5, ("",) * 3)[1] == "B" and rows.get(9, ("",) * 3)[1] == "D" and rows.get(2, ("",) * 3)[1] == "391"
          and rows.get(6, ("",) * 3)[1] == "5050" and rows.get(11, ("",) * 3)[1] == "abc",
          f"picked answers: {rows}")
    check(overall(r.stdout) == (RIGHT, 12, 12), f"overall {overall(r.stdout)}, want {RIGHT}/12")
    for cat, want in (("mc", 2), ("math", 2), ("code", 1), ("sec", 2)):
        m = re.search(rf"^{cat}\s+(\d+)\s+(\d+)", r.stdout, re.M)
        check(m and (int(m.group(1)), int(m.group(2))) == (want, 3), f"{cat}: {m and m.groups()}")
    check("wall time" in r.stdout, "wall time printed")

    # the trace: a header, each prompt, every token, each verdict
    recs = [json.loads(line) for line in open(trace)]
    check(recs and recs[0].get("ds4_eval_trace") == 1 and recs[0].get("thinking") is True, f"header {recs[:1]}")
    prompts = [x for x in recs if "prompt" in x]
    verdicts = [x for x in recs if "verdict" in x]
    tokens = [x for x in recs if "tok" in x]
    check(len(prompts) == 12 and "<｜Assistant｜><think>" in prompts[0]["prompt"] and "Nitrogen" in prompts[0]["prompt"],
          f"prompt records: {len(prompts)}")
    check(len(verdicts) == 12 and all(v["output"] == c[3] for v, c in zip(verdicts, CASES)),
          "each verdict holds exactly the scripted reply")
    check(len(tokens) == sum(v["gen_tokens"] for v in verdicts) + 12,
          f"{len(tokens)} token records for {sum(v['gen_tokens'] for v in verdicts)} generated tokens + 12 EOS")
    check(all(rows[v["q"]][3] == v["gen_tokens"] for v in verdicts), "report and trace agree on generated tokens")

    # regrade without a model: the same verdicts
    g = run("--regrade-trace", trace)
    check(g.returncode == 0 and "regrade: 12 cases, 0 changed; passed 7 -> 7" in g.stdout,
          f"regrade: rc {g.returncode} {g.stdout[:300]!r} {g.stderr!r}")
    check(overall(g.stdout) == (RIGHT, 12, 12), f"regrade overall {overall(g.stdout)}")
    check({k: v[:3] for k, v in report_rows(g.stdout).items()} == {k: v[:3] for k, v in rows.items()},
          "regrade report rows equal the run's")
    check("weights paged in" not in g.stderr and "demo" not in g.stderr, f"regrade loaded a model? {g.stderr!r}")

    # an edited trace: q7's reply now right, q1's now wrong
    edited = os.path.join(tmp, "edited.jsonl")
    with open(edited, "w") as f:
        for x in recs:
            if x.get("verdict") and x["q"] == 7:
                x["output"] = "y aliases x.</think>\n\nAnswer: `4`"
            if x.get("verdict") and x["q"] == 1:
                x["output"] = "hmm</think>\n\nAnswer: Oxygen"
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
    g = run("--regrade-trace", edited)
    check('changed q7 code: FAIL "3" -> PASS "4"' in g.stdout and 'changed q1 mc: PASS "B" -> FAIL "A"' in g.stdout
          and "2 changed; passed 7 -> 7" in g.stdout, f"edited regrade:\n{g.stdout[:600]}")

    # the drift gate, on this run's counts and on others
    counts = ",".join(str(rows[i][3]) for i in range(1, 13))
    base = ["-m", DEMO, "--plain", "--questions", "12", "--tokens", "64", "--temp", "0", "--seed", "1",
            "--scripted-output", script]
    r = run(*base, "--expect-tokens", counts)
    check(r.returncode == 0 and "gate: generated token counts match the baseline" in r.stdout, f"gate ok: {r.stdout[-300:]}")
    wrong = counts.split(",")
    wrong[2] = str(int(wrong[2]) + 1)
    r = run(*base, "--expect-tokens", ",".join(wrong))
    check(r.returncode == 1 and "gate: q3 generated" in r.stdout and "DRIFT" in r.stdout, f"gate drift: {r.stdout[-300:]}")

    # one-line refusals
    r = run("-m", DEMO, "--plain", "--questions", "2", "--tokens", "100000000")
    check(r.returncode == 1 and "context tokens" in r.stderr and "more than the model's" in r.stderr
          and r.stderr.strip().splitlines()[-1].startswith("ds4-eval:"), f"context refusal: {r.stderr!r}")
    r = run("-m", DEMO, "--plain", "--questions", "5-2")
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and "inverted" in r.stderr, f"bad selection: {r.stderr!r}")
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"ds4_eval_trace":1}\n{"q":1,"verdict":"MAYBE"}\n')
    g = run("--regrade-trace", bad)
    check(g.returncode == 1 and g.stderr.count("\n") == 1 and "line 2" in g.stderr, f"bad trace: {g.stderr!r}")

    # a sampled run's trace stays valid UTF-8 JSON (random tokens split characters)
    sampled = os.path.join(tmp, "sampled.jsonl")
    r = run("-m", DEMO, "--plain", "--questions", "4", "--tokens", "48", "--temp", "1", "--seed", "3", "--trace", sampled)
    with open(sampled, "rb") as f:
        raw = f.read()
    try:
        recs = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        recs = []
        check(False, f"sampled trace: {e}")
    toks = [x for x in recs if "tok" in x]
    check(r.returncode == 0 and len(toks) >= 4 and all(re.fullmatch(r"([0-9a-f]{2})+", x["bytes"]) for x in toks),
          f"sampled trace: {len(toks)} token records with hex bytes")

    # --list: one line per question, ids 1..n
    r = run("--list")
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and len(lines) >= 90 and lines[0].startswith("q1 ") and f"q{len(lines)} " in lines[-1],
          f"--list: {len(lines)} lines")

results.done()
