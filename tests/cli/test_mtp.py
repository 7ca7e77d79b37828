#!/usr/bin/env python3
"""ds4 --mtp: the MTP block against its reference, its acceptance on the
trained tiny model, and bad input.

* Oracle: for the transformers-oracle models A, B, C (windows 8 and 128,
  64-300 tokens) the engine's MTP logits (--dump-mtp-logits, f32, exact
  numerics) equal the reference in tests/fixtures/ds4tiny/<X>/mtp/logits
  (transformers' decoder layer, hyper-head and norms assembled as DeepSeek V4's
  MTP, tests/oracles/ds4_mtp_oracle.py) within float tolerance with the same
  argmax at every position, whether the drafter caught up one token at a time
  (K = 1), after a prefill of half the sequence, or of all but the last token.
* The trained tiny model with its trained block: greedy output identical to
  target-only decoding and most drafts accepted.
* Bad input: a support file for another model, a truncated one, a main model
  as support file, a GLM model, out-of-range --mtp-draft / --mtp-margin,
  --dump-mtp-logits without --mtp, --mtp with --batched-session: one line and
  a failing status; --quality with --mtp decodes target-only.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
FIX = os.path.join(ROOT, "tests", "fixtures", "ds4tiny")
failures = 0


def check(cond, msg):
    global failures
    print(("ok   " if cond else "FAIL ") + msg)
    failures += not cond


def ds4(*args, binary="ds4"):
    return subprocess.run([os.path.join(ROOT, binary), *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def oracle(tmp):
    for name in ("A", "B", "C"):
        main = os.path.join(BUILD, "ds4tiny", f"{name}-f32.gguf")
        mtp = os.path.join(BUILD, "ds4tiny", f"{name}-mtp-f32.gguf")
        toks = json.load(open(os.path.join(FIX, name, "tokens")))
        ref = np.fromfile(os.path.join(FIX, name, "mtp", "logits"), dtype="<f4").reshape(len(toks) - 1, -1)
        scale = float(np.abs(ref).max())
        ids = ",".join(map(str, toks))
        for k in (1, len(toks) // 2, len(toks) - 1):
            out = os.path.join(tmp, f"{name}-{k}.bin")
            r = ds4("-m", main, "--mtp", mtp, "--numerics", "exact", "--token-ids", ids, "--dump-mtp-logits", out,
                    "--mtp-dump-from", str(k), "-t", "2")
            if r.returncode:
                check(False, f"{name} K={k}: ds4 failed: {r.stderr.strip()}")
                continue
            got = np.fromfile(out, dtype="<f4").reshape(-1, ref.shape[1])
            want = ref[k - 1:]
            diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
            same_argmax = got.shape == want.shape and bool((got.argmax(1) == want.argmax(1)).all())
            check(diff <= 1e-5 * scale and same_argmax,
                  f"{name} K={k}: {got.shape[0]} positions, max |diff| {diff:.3g} (scale {scale:.2f}), "
                  f"argmax {'identical' if same_argmax else 'DIFFERS'}")


def tiny():
    model, mtp = "models/ds4-tiny.gguf", "models/ds4-tiny-mtp.gguf"
    prompt = "Write a Python function that reverses a list."
    base = ["-m", model, "-p", prompt, "-n", "200", "--temp", "0", "-t", "2"]
    ref = ds4(*base)
    for draft in (1, 3):
        got = ds4(*base, "--mtp", mtp, "--mtp-draft", str(draft), "--mtp-margin", "0")
        check(ref.returncode == 0 and got.returncode == 0 and got.stdout == ref.stdout and len(ref.stdout) > 100,
              f"tiny model --mtp-draft {draft}: the same {len(ref.stdout)} bytes as target-only")
        m = re.search(r"spec mtp: (\d+) passes, proposed (\d+), accepted (\d+)", got.stderr)
        rate = int(m.group(3)) / max(1, int(m.group(2))) if m else 0
        check(m is not None and rate >= 0.5, f"tiny model --mtp-draft {draft}: acceptance {rate:.0%}"
              + ("" if m else f" (no spec line: {got.stderr.strip()[-200:]})"))
    q = ds4(*base, "--mtp", mtp, "--quality")
    check(q.returncode == 0 and q.stdout == ref.stdout and "spec" not in q.stderr and "MTP drafter" not in q.stderr,
          "--quality with --mtp: target-only, the drafter not loaded")


def one_line_failure(r, want, what, after_load=False):
    """after_load: the model's load report may come before the one line"""
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    ok = r.returncode != 0 and (after_load or len(lines) == 1) and bool(lines) and re.search(want, lines[-1]) is not None
    check(ok, f"{what}: rc {r.returncode}, {lines[-1] if lines else 'no message'!r}")


def bad_input(tmp):
    a, b = os.path.join(BUILD, "ds4tiny", "A-f32.gguf"), os.path.join(BUILD, "ds4tiny", "B-f32.gguf")
    a_mtp = os.path.join(BUILD, "ds4tiny", "A-mtp-f32.gguf")
    ids = ["--token-ids", "0,5,9"]
    one_line_failure(ds4("-m", b, "--mtp", a_mtp, *ids), r"made for another model", "a support file for another model")
    trunc = os.path.join(tmp, "trunc.gguf")
    with open(a_mtp, "rb") as f:
        data = f.read()
    with open(trunc, "wb") as f:
        f.write(data[:len(data) // 2])
    one_line_failure(ds4("-m", a, "--mtp", trunc, *ids), r"--mtp .*trunc", "a truncated support file")
    one_line_failure(ds4("-m", a, "--mtp", a, *ids), r"missing tensor mtp\.0\.", "the main model as support file")
    one_line_failure(ds4("-m", a, "--mtp", os.path.join(tmp, "none.gguf"), *ids), r"none\.gguf", "a missing file")
    glm = os.path.join(BUILD, "glmtiny", "A-f32.gguf")
    one_line_failure(ds4("-m", glm, "--mtp", a_mtp, *ids), r"--mtp", "--mtp on a GLM model")
    for opt, v in (("--mtp-draft", "0"), ("--mtp-draft", "17"), ("--mtp-draft", "x"), ("--mtp-margin", "-1"),
                   ("--mtp-margin", "nan"), ("--mtp-margin", "")):
        one_line_failure(ds4("-m", a, "--mtp", a_mtp, opt, v, *ids), re.escape(opt), f"{opt} '{v}'")
    one_line_failure(ds4("-m", a, *ids, "--dump-mtp-logits", os.path.join(tmp, "x.bin")), r"--mtp",
                     "--dump-mtp-logits without --mtp")
    one_line_failure(ds4("-m", a, "--mtp", a_mtp, *ids, "--dump-mtp-logits", os.path.join(tmp, "x.bin"),
                         "--mtp-dump-from", "3"), r"--mtp-dump-from", "--mtp-dump-from past the tokens",
                     after_load=True)
    one_line_failure(ds4("-m", "models/demo.gguf", "--mtp", "models/demo-mtp.gguf", "--batched-session", "2",
                         "--port", "0", binary="ds4-server"), r"--mtp .*--batched-session", "ds4-server --mtp with batching")


def main():
    tmp = tempfile.mkdtemp()
    try:
        oracle(tmp)
        tiny()
        bad_input(tmp)
    finally:
        shutil.rmtree(tmp)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
