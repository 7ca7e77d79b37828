"""The trained tiny model's f32 exactness over a long sequence: the engine's
logits (--numerics exact) on the float32 form of models/ds4-tiny.gguf equal
the logits transformers' DeepseekV4ForCausalLM computes on the same weights,
at every one of 512 positions (tests/fixtures/ds4-tiny/long/, written by
tools/train-tiny/golden_long.py; docs/tiny-model.md).

The float32 form is tools/train-tiny/compact_gguf.py's: every tensor of the
committed GGUF dequantized to F32, the vocabulary cut to the kept ids plus the
one aggregated row, so the engine computes in f32 what PyTorch computed and
the logits of one position are 4,097 values, not 129,280.

The sequence reaches the compressed layers' indexer pruning (top 8 of up to
128 compressed rows) and has exact indexer score ties at the top-k boundary
(rows whose every head's score is cut to 0 by the ReLU), which the reference
breaks as the engine does, lower row first. Checked per position: the stored
logit columns within float32 tolerance, the argmax, and the log-sum-exp over
the whole 129,280-id vocabulary."""
import json, os, subprocess, sys, tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
MODEL = os.environ.get("MODEL", "models/ds4-tiny.gguf")
FIX = "tests/fixtures/ds4-tiny/long"
N_VOCAB = 129280
# float32 against float32: the measured max|diff| / max|logit| is 4e-7
# (different summation orders); a different indexer choice moves it to 1e-3.
REL_TOL = 1e-5

sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results  # noqa: E402

results = Results("tiny_exact")
check = results.check


def main():
    for f in (MODEL, "ds4"):
        if not os.path.exists(f):
            print(f"test_tiny_exact: SKIPPED: {f} missing (make all tiny-model)")
            sys.exit(77)
    try:
        import gguf  # noqa: F401  (compact_gguf.py reads and writes GGUF with it)
    except ImportError:
        print("test_tiny_exact: SKIPPED: python module gguf missing (make venv)")
        sys.exit(77)
    toks = json.load(open(os.path.join(FIX, "tokens.json")))
    cols = json.load(open(os.path.join(FIX, "columns.json")))
    summ = json.load(open(os.path.join(FIX, "summary.json")))
    T = len(toks["compact"])
    want = np.fromfile(os.path.join(FIX, "logits"), dtype="<f4").astype(np.float64).reshape(T, len(cols))
    n_ties = sum(len(p) for p in summ["indexer_exact_ties"].values())
    check(summ["tie_rule"] == "lower row first" and n_ties > 0,
          f"the reference breaks indexer ties lower row first and the sequence has such ties ({n_ties})")
    with tempfile.TemporaryDirectory() as d:
        compact, ids_json = os.path.join(d, "compact.gguf"), os.path.join(d, "ids.json")
        r = subprocess.run([sys.executable, "tools/train-tiny/compact_gguf.py", MODEL, compact, ids_json],
                           capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, f"compact_gguf.py: exit {r.returncode}: {r.stderr[-500:]}")
        if r.returncode:
            results.done()
        keep = json.load(open(ids_json))["kept_ids"]
        K = len(keep)
        pos = {t: i for i, t in enumerate(keep)}
        check([pos.get(t, K) for t in toks["tokens"]] == toks["compact"], "the fixture's compact ids are this model's")
        out = os.path.join(d, "l.json")
        r = subprocess.run(["./ds4", "-m", compact, "-t", "2", "--numerics", "exact", "--token-ids",
                            ",".join(map(str, toks["compact"])), "--dump-logits", out, "--logits-all"],
                           capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, f"ds4 --dump-logits: exit {r.returncode}: {r.stderr[-500:]}")
        if r.returncode:
            results.done()
        got = np.array(json.load(open(out))["logits"], dtype=np.float64)
    check(got.shape == (T, K + 1), f"logits shape {got.shape}, want {(T, K + 1)}")
    if got.shape != (T, K + 1):
        results.done()
    scale = np.abs(want).max()
    diff = np.abs(got[:, cols] - want).max(1) / scale
    bad = np.nonzero(diff > REL_TOL)[0]
    print(f"  {T} positions x {len(cols)} ids: max|diff| / max|logit| {diff.max():.3g} (tolerance {REL_TOL}); "
          f"reference indexer ties at {n_ties} (layer, position) pairs")
    check(len(bad) == 0, f"{len(bad)} positions off PyTorch beyond {REL_TOL} of max|logit|, first {bad[:8].tolist()} "
          f"(relative {diff[bad[:8]].round(6).tolist()})")
    arg = got.argmax(1)
    mism = np.nonzero(arg != np.array(summ["argmax_compact"]))[0]
    check(len(mism) == 0, f"argmax differs from PyTorch at positions {mism[:8].tolist()}")
    lse = np.logaddexp(np.logaddexp.reduce(got[:, :K], axis=1), got[:, K] + np.log(N_VOCAB - K))
    d_lse = np.abs(lse - np.array(summ["logsumexp_full_vocab"])).max() / scale
    check(d_lse <= REL_TOL, f"full-vocabulary log-sum-exp off PyTorch by {d_lse:.3g} of max|logit|")
    results.done()


if __name__ == "__main__":
    main()
