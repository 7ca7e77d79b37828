"""`ds4 --score-vectors FILE` against numpy, on the oracle models:
- vectors made from the model's own logits (tests/oracles/make_vectors.py;
  the committed tests/fixtures/vectors/tinyA-exact.json and fresh ones on
  B-q8_0) score perfect agreement: every step's top-1 agrees, the
  reference token ranks 0, no logprob gap, no KL;
- perturbed vectors (another top token, shifted logprobs, shorter top-k)
  score per prompt and overall exactly what numpy computes from the
  logits `ds4 --dump-logits --logits-all` gives for the same tokens
  (the scorer itself is teacher-forced through decode steps);
- a malformed file is refused with one line naming what is wrong.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracles"))
from server_helper import Results  # noqa: E402
import make_vectors as mv  # noqa: E402

results = Results("test_score_vectors")
check = results.check
FIX = os.path.join(ROOT, "tests", "fixtures", "vectors")
LINE = re.compile(r"^vectors (\S+): (\d+) steps, top-1 agreement (\d+)/\d+ \([0-9.]+%\), reference token rank mean "
                  r"([0-9.]+) max (\d+), logprob gap mean (-?[0-9.]+), KL over top-k mean (-?[0-9.]+)$", re.M)


def score(model, path, numerics):
    r = subprocess.run([os.path.join(ROOT, "ds4"), "-m", model, "-t", "2", "--numerics", numerics, "--ctx", "256",
                        "--score-vectors", path], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return r, {m.group(1): (int(m.group(2)), int(m.group(3)), float(m.group(4)), int(m.group(5)), float(m.group(6)),
                            float(m.group(7))) for m in LINE.finditer(r.stdout)}


def summarize(rows):
    n = len(rows)
    return (n, sum(r[0] for r in rows), sum(r[1] for r in rows) / n, max(r[1] for r in rows),
            sum(r[2] for r in rows) / n, sum(r[3] for r in rows) / n)


def close(got, want, what):
    ok = got is not None and got[0] == want[0] and got[1] == want[1] and got[3] == want[3] and \
        abs(got[2] - want[2]) <= 1e-6 and abs(got[4] - want[4]) <= 2e-6 and abs(got[5] - want[5]) <= 2e-6
    check(ok, f"{what}: ds4 {got}, numpy {want}")


def check_file(model, path, numerics, what):
    with open(path) as f:
        v = json.load(f)
    r, got = score(model, path, numerics)
    check(r.returncode == 0, f"{what}: rc {r.returncode} {r.stderr[-300:]!r}")
    every = []
    for p in v["prompts"]:
        lp = mv.local_logprobs(model, p["prompt_ids"] + [s["id"] for s in p["steps"]][:-1], numerics)
        rows = mv.expected(p, lp)
        every += rows
        close(got.get(p["name"]), summarize(rows), f"{what} {p['name']}")
    close(got.get("overall"), summarize(every), f"{what} overall")
    return got


for name in ("A-f32", "B-q8_0"):
    if not os.path.exists(os.path.join(ROOT, BUILD, "ds4tiny", name + ".gguf")):
        print(f"test_score_vectors: SKIPPED: {BUILD}/ds4tiny/{name}.gguf missing")
        sys.exit(77)
A = os.path.join(ROOT, BUILD, "ds4tiny", "A-f32.gguf")
B = os.path.join(ROOT, BUILD, "ds4tiny", "B-q8_0.gguf")

got = check_file(A, os.path.join(FIX, "tinyA-exact.json"), "exact", "A exact")
o = got.get("overall")
check(o and o[0] == o[1] and o[2] == 0 and o[3] == 0 and abs(o[4]) < 1e-6 and abs(o[5]) < 1e-9,
      f"own logits score perfect agreement: {o}")
got = check_file(A, os.path.join(FIX, "tinyA-perturbed.json"), "exact", "A perturbed")
o = got.get("overall")
check(o and o[1] < o[0] and o[5] > 0, f"perturbed vectors disagree: {o}")

with tempfile.TemporaryDirectory() as tmp:
    rng = random.Random(3)
    prompt = [0] + [rng.randrange(1, 512) for _ in range(11)]
    cont = [rng.randrange(512) for _ in range(8)]
    p, _ = mv.make_prompt(B, "b", prompt, cont, 8, "ds4")
    own = os.path.join(tmp, "own.json")
    with open(own, "w") as f:
        json.dump({"ds4_vectors": 1, "prompts": [p]}, f)
    got = check_file(B, own, "ds4", "B own")
    o = got.get("overall")
    check(o and o[0] == o[1] == 8 and o[2] == 0 and abs(o[5]) < 1e-9, f"B own logits: {o}")
    pert = os.path.join(tmp, "pert.json")
    with open(pert, "w") as f:
        json.dump({"ds4_vectors": 1, "prompts": [mv.perturb(p, random.Random(9))]}, f)
    check_file(B, pert, "ds4", "B perturbed")

    bad_cases = {
        "not json": ("{", "not a JSON object"),
        "version": (json.dumps({"ds4_vectors": 2, "prompts": []}), "not a vector file"),
        "vocab": (json.dumps({"ds4_vectors": 1, "prompts": [{"name": "x", "prompt_ids": [1, 600],
                                                            "steps": [{"id": 1, "top": [{"id": 1, "logprob": -1}]}]}]}),
                  "prompt 0 (x): prompt id 1"),
        "order": (json.dumps({"ds4_vectors": 1, "prompts": [{"name": "y", "prompt_ids": [1], "steps": [
            {"id": 1, "top": [{"id": 1, "logprob": -2}, {"id": 2, "logprob": -1}]}]}]}), "step 0 top entry 1 is more likely"),
        "positive": (json.dumps({"ds4_vectors": 1, "prompts": [{"name": "z", "prompt_ids": [1], "steps": [
            {"id": 1, "top": [{"id": 1, "logprob": 0.5}]}]}]}), "finite \"logprob\" <= 0"),
    }
    for what, (text, needle) in bad_cases.items():
        path = os.path.join(tmp, "bad.json")
        with open(path, "w") as f:
            f.write(text)
        r, _ = score(A, path, "exact")
        check(r.returncode == 1 and needle in r.stderr and r.stderr.strip().splitlines()[-1].startswith("ds4: "),
              f"{what}: {r.stderr!r}")

results.done()
