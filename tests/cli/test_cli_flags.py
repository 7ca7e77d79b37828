"""ds4's one-shot and debugging flags on the demo model (random weights, so
only structure and consistency are checked, never text):
- --dump-tokens prints id<TAB>hex<TAB>printable, recognises protocol specials
  (the DSML close marker "</｜DSML｜" is two tokens: "</" and "｜DSML｜") and
  agrees with the HF tokenizers fixture ids for plain text;
- --dump-logits on raw ids: last position equals the last row of
  --logits-all, and greedy --dump-logprobs starts with that argmax;
- --dump-logprobs: each step's token is its own top-1 alternative, and
  logprobs are log-softmax values (<= 0, top ones normalised-ish);
- bad arguments exit 2 with a message; a missing model exits 1.
"""
import json, math, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
MODEL = "models/demo.gguf"


# One check collector for every script test (tests/server/server_helper.py).
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results  # noqa: E402

results = Results("cli_flags")
check = results.check


def ds4(*args, ok=True):
    r = subprocess.run(["./ds4", "-m", MODEL, "-t", "2", *args], capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        print(r.stderr)
    return r


r = ds4("--dump-tokens", "-p", "Hello, world!")
lines = r.stdout.strip().split("\n")
check(r.returncode == 0, "dump-tokens exit")
rows = [l.split("\t") for l in lines]
check(all(len(x) == 3 for x in rows), "three tab-separated columns")
ids = [int(x[0]) for x in rows]
check(ids[:4] == [19923, 14, 2058, 3], f"Hello, world! ids {ids[:4]}")
texts = [bytes.fromhex(x[1]).decode("utf-8", "replace") for x in rows]
check("".join(texts) == "Hello, world!", "hex bytes concatenate to the input")
r = ds4("--dump-tokens", "-p", "</｜DSML｜tool_calls>")
texts = [bytes.fromhex(l.split("\t")[1]).decode() for l in r.stdout.strip().split("\n")]
check(texts[:2] == ["</", "｜DSML｜"], f"DSML close marker starts as two tokens: {texts}")

with tempfile.TemporaryDirectory() as d:
    last = os.path.join(d, "last.json")
    every = os.path.join(d, "all.json")
    toks = "0,128803,19923,14,2058,3"
    r1 = ds4("--numerics", "exact", "--token-ids", toks, "--dump-logits", last)
    r2 = ds4("--numerics", "exact", "--token-ids", toks, "--dump-logits", every, "--logits-all")
    check(r1.returncode == 0 and r2.returncode == 0, "dump-logits exit")
    a, b = json.load(open(last)), json.load(open(every))
    check(a["tokens"] == [int(x) for x in toks.split(",")], "tokens echoed")
    check(len(a["logits"]) == 1 and len(b["logits"]) == 6, "one row vs every position")
    check(len(a["logits"][0]) == a["n_vocab"] == 129280, "row length is n_vocab")
    check(a["logits"][0] == b["logits"][-1], "last row identical with and without --logits-all")

    lp = os.path.join(d, "lp.json")
    r = ds4("--nothink", "--dump-logprobs", lp, "--logprobs-top-k", "5", "-n", "6", "-p", "Hello")
    check(r.returncode == 0, "dump-logprobs exit")
    j = json.load(open(lp))
    check(j["prompt_tokens"] == 1 + 1 + 1 + 1 + 1, f"prompt tokens {j['prompt_tokens']}")
    check(1 <= len(j["steps"]) <= 6, "step count")
    for s in j["steps"]:
        check(s["top"][0]["id"] == s["id"], "greedy token is top-1")
        check(s["logprob"] <= 0 and abs(s["logprob"] - s["top"][0]["logprob"]) < 1e-6, "logprob of chosen")
        check(all(t["logprob"] <= 0 for t in s["top"]), "log-probabilities are <= 0")
        check(sum(math.exp(t["logprob"]) for t in s["top"]) <= 1.0 + 1e-4, "top mass <= 1")

    # the dump is valid UTF-8 JSON although single tokens may hold part of a
    # character ("text" has U+FFFD there, "bytes" the token's exact bytes);
    # 400 steps of the demo model include such tokens. --ignore-eos runs to
    # -n (the stop itself: test_generate's ignore_stop case)
    r = ds4("--nothink", "--dump-logprobs", lp, "--ignore-eos", "-n", "400", "-p", "Hello")
    raw = open(lp, "rb").read()
    try:
        j = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        j = {"steps": []}
        check(False, f"the logprobs dump is valid UTF-8 JSON: {e}")
    check(r.returncode == 0 and len(j["steps"]) == 400, f"--ignore-eos runs to -n: {len(j['steps'])} steps")
    check(any("\ufffd" in s["text"] for s in j["steps"]), "some step holds part of a character")
    for s in j["steps"]:
        if "\ufffd" not in s["text"]:
            check(s["text"].encode() == bytes.fromhex(s["bytes"]), "a whole-character token's text is its bytes")

r = ds4("--temp", "nope", "-p", "x", ok=False)
check(r.returncode == 2 and "bad value" in r.stderr, "bad value exits 2")
r = ds4("--frobnicate", ok=False)
check(r.returncode == 2 and "unknown option" in r.stderr, "unknown option exits 2")
r = subprocess.run(["./ds4", "-m", "/nonexistent.gguf", "-p", "x"], capture_output=True, text=True)
check(r.returncode == 1 and r.stderr.strip() != "", "missing model exits 1 with a message")
r = subprocess.run(["./ds4", "--help"], capture_output=True, text=True)
check(r.returncode == 0 and "--dump-logprobs" in r.stdout, "--help")

results.done()
