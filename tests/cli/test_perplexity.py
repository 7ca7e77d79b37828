"""`ds4 --perplexity-file` equals the mean negative log-likelihood computed
here, independently, with numpy (float64 log-softmax) from the logits
`ds4 --token-ids ... --dump-logits --logits-all` dumps for each window, on
the oracle models (random DeepSeek V4 layouts, no tokenizer: --ppl-ids).
The window rule is the documented one (src/quality/perplexity.h): windows of the
context length start every stride tokens, the last one ends at the end of
the sequence, and each scores the tokens no earlier window scored.
Also: the context and stride are printed; a stride that cannot advance, a
file of one token, a bad id and a missing file are refused with one line;
on the demo model (real tokenizer) the text path scores BOS + the raw
tokens of the text, which equals the --ppl-ids path on those ids.
"""
import math
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results  # noqa: E402

results = Results("test_perplexity")
check = results.check
DS4 = os.path.join(ROOT, "ds4")
DEMO = os.path.join(ROOT, "models", "demo.gguf")


def ds4(model, *args):
    return subprocess.run([DS4, "-m", model, "-t", "2", *args], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


def windows(n, ctx, stride):
    ctx = min(ctx, n)
    out, begin, scored_to = [], 0, 1
    while scored_to < n:
        end = min(begin + ctx, n)
        out.append((begin, end, max(scored_to, begin + 1)))
        scored_to = end
        begin += stride
    return out


def reference_nll(model, ids, ctx, stride, tmp, numerics):
    total, count = 0.0, 0
    for begin, end, first in windows(len(ids), ctx, stride):
        path = os.path.join(tmp, "logits.json")
        r = ds4(model, "--numerics", numerics, "--ctx", str(ctx), "--token-ids", ",".join(map(str, ids[begin:end])),
                "--dump-logits", path, "--logits-all")
        if r.returncode != 0:
            return None
        import json
        with open(path) as f:
            z = np.array(json.load(f)["logits"], dtype=np.float64)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        for p in range(first, end):
            total -= logp[p - begin - 1, ids[p]]
            count += 1
    return total / count, count


def ppl_run(model, path, *args):
    r = ds4(model, "--perplexity-file", path, *args)
    m = re.search(r"perplexity: (\d+) tokens scored in (\d+) windows: mean NLL ([0-9.]+), PPL ([0-9.]+)", r.stdout)
    head = re.search(r"perplexity: (\d+) tokens, context (\d+), stride (\d+)", r.stdout)
    return r, m, head


with tempfile.TemporaryDirectory() as tmp:
    rng = random.Random(7)
    for name, numerics in (("A-f32", "exact"), ("B-q8_0", "ds4")):
        model = os.path.join(ROOT, BUILD, "ds4tiny", name + ".gguf")
        if not os.path.exists(model):
            print(f"test_perplexity: SKIPPED: {model} missing (make {BUILD}/ds4tiny/{name}.gguf)")
            sys.exit(77)
        ids = [rng.randrange(512) for _ in range(61)]
        path = os.path.join(tmp, name + ".ids")
        with open(path, "w") as f:
            f.write(", ".join(map(str, ids)) + "\n")
        for ctx, stride in ((24, 10), (16, 15), (61, 30)):
            r, m, head = ppl_run(model, path, "--ppl-ids", "--ctx", str(ctx), "--ppl-stride", str(stride),
                                 "--numerics", numerics)
            ref = reference_nll(model, ids, ctx, stride, tmp, numerics)
            ok = r.returncode == 0 and m and head and ref
            check(ok, f"{name} ctx {ctx} stride {stride}: rc {r.returncode} {r.stdout[-300:]!r} {r.stderr[-300:]!r}")
            if not ok:
                continue
            check(head.groups() == ("61", str(ctx), str(stride)), f"{name}: header {head.groups()}")
            check(int(m.group(1)) == ref[1] == 60 and int(m.group(2)) == len(windows(61, ctx, stride)),
                  f"{name}: scored {m.group(1)} in {m.group(2)} windows, reference {ref[1]}")
            nll = float(m.group(3))
            check(abs(nll - ref[0]) <= 2e-6 * max(1.0, abs(ref[0])), f"{name} ctx {ctx}: NLL {nll} vs numpy {ref[0]}")
            check(abs(float(m.group(4)) - math.exp(ref[0])) <= 1e-5 * math.exp(ref[0]), f"{name}: PPL {m.group(4)}")
            chunks = re.findall(r"^\[(\d+)\] tokens (\d+)-(\d+): (\d+) scored", r.stdout, re.M)
            check([(int(b), int(e), e2 - f2) for (_, b, e, _), (_, e2, f2) in
                   zip(chunks, [(b, e, f) for b, e, f in windows(61, ctx, stride)])] ==
                  [(b, e, e - f) for b, e, f in windows(61, ctx, stride)], f"{name}: windows {chunks}")

    model = os.path.join(ROOT, BUILD, "ds4tiny", "A-f32.gguf")
    path = os.path.join(tmp, "A-f32.ids")
    r, m, _ = ppl_run(model, path, "--ppl-ids", "--ctx", "24", "--ppl-stride", "24")
    check(r.returncode == 1 and not m and r.stderr.strip().splitlines()[-1].startswith("ds4: perplexity needs"),
          f"stride = context refused: {r.stderr!r}")
    one = os.path.join(tmp, "one.ids")
    with open(one, "w") as f:
        f.write("5\n")
    r, m, _ = ppl_run(model, one, "--ppl-ids")
    check(r.returncode == 1 and "at least 2 tokens" in r.stderr, f"one token: {r.stderr!r}")
    bad = os.path.join(tmp, "bad.ids")
    with open(bad, "w") as f:
        f.write("5,600,7\n")
    r, m, _ = ppl_run(model, bad, "--ppl-ids")
    check(r.returncode == 1 and "bad token id" in r.stderr, f"id outside the vocabulary: {r.stderr!r}")
    r, m, _ = ppl_run(model, os.path.join(tmp, "absent.txt"))
    check(r.returncode == 1 and "cannot read" in r.stderr, f"missing file: {r.stderr!r}")
    r, m, _ = ppl_run(model, path)
    check(r.returncode == 1 and "no tokenizer" in r.stderr, f"text without a tokenizer: {r.stderr!r}")

    # the text path on a model with a tokenizer: BOS + the raw tokens
    if os.path.exists(DEMO):
        def dump_ids(text_path):
            d = ds4(DEMO, "--dump-tokens", "--prompt-file", text_path)
            return [int(line.split("\t")[0]) for line in d.stdout.splitlines() if line]
        bos_file = os.path.join(tmp, "bos.txt")
        with open(bos_file, "w") as f:
            f.write("<｜begin▁of▁sentence｜>")
        bos = dump_ids(bos_file)
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog.\n")
        ids = bos + dump_ids(text)   # no special strings in it: chat and raw tokenization agree
        raw = os.path.join(tmp, "text.ids")
        with open(raw, "w") as f:
            f.write(",".join(map(str, ids)))
        r1, m1, h1 = ppl_run(DEMO, text, "--ctx", "16", "--ppl-stride", "8")
        r2, m2, h2 = ppl_run(DEMO, raw, "--ppl-ids", "--ctx", "16", "--ppl-stride", "8")
        check(len(bos) == 1 and m1 and m2 and h1 and int(h1.group(1)) == len(ids) and m1.groups() == m2.groups(),
              f"text path = ids path on BOS + tokens: {m1 and m1.groups()} {m2 and m2.groups()} ({len(ids)} ids)")
        special = os.path.join(tmp, "special.txt")
        with open(special, "w") as f:
            f.write("a <｜User｜> b")
        r, m, head = ppl_run(DEMO, special, "--ctx", "16")
        check(head and int(head.group(1)) > 1 + len(dump_ids(special)),
              f"a special string in the text is text, not a protocol token: {head and head.group(1)} tokens")
    else:
        print("note: models/demo.gguf missing, the text path is not checked")

results.done()
