"""The CLI binaries on the GLM demo model (ds4-make-model --preset glm-demo,
which carries the constructed GLM tokenizer; mk/glmchat.mk):
- `ds4 --dump-tokens` tokenizes GLM's protocol strings as its added tokens
  (ids by string from data/glm-constructed-tokenizer.json, read here with HF
  `tokenizers` as the oracle);
- `ds4 -p` renders and generates in GLM's chat format and exits 0.
(`ds4-agent` on a GLM file: tests/agent/test_agent_glm.sh.)"""
import os
import subprocess
import sys

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
MODEL = os.path.join(ROOT, BUILD, "glmchat", "glm-demo.gguf")
NAME = "test_glm_chat_cli"


def main():
    if not os.path.exists(MODEL):
        r = subprocess.run(["make", "-s", f"BUILD={BUILD}", os.path.relpath(MODEL, ROOT)], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode or not os.path.exists(MODEL):
            print(f"SKIP {NAME}: {MODEL} could not be built: {(r.stderr or r.stdout).strip()[-300:]}")
            sys.exit(77)
    failed = passed = 0

    def check(cond, what):
        nonlocal failed, passed
        passed += bool(cond)
        failed += not cond
        if not cond:
            print(f"FAIL {NAME}: {what}")

    hf = Tokenizer.from_file(os.path.join(ROOT, "data", "glm-constructed-tokenizer.json"))
    text = "[gMASK]<sop><|user|>It's 12 o'clock<|assistant|>"
    r = subprocess.run(["./ds4", "-m", MODEL, "--dump-tokens", "-p", text], cwd=ROOT, capture_output=True, text=True)
    ids = [int(line.split("\t")[0]) for line in r.stdout.splitlines() if line[:1].isdigit()]
    want = hf.encode(text, add_special_tokens=False).ids
    check(r.returncode == 0 and ids == want, f"--dump-tokens {ids} != HF {want}: {r.stderr[-200:]}")

    r = subprocess.run(["./ds4", "-m", MODEL, "-p", "hi", "-n", "4", "--nothink", "-t", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "generation:" in r.stderr, f"ds4 -p on GLM: {r.returncode} {r.stderr[-300:]}")

    print(f"{NAME}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
