"""Synthetic reference vectors (the `ds4 --score-vectors` format,
docs/quality.md) made from the engine's own logits, plus the numpy
scorer the tests compare `ds4 --score-vectors` with.

    python3 tests/oracles/make_vectors.py     # rewrites tests/fixtures/vectors/

A vector file made from a model's own logits must score perfect agreement
on that model; `perturb` moves the reference away in known ways (another
top token, shifted logprobs, a shorter top-k)."""
import json
import os
import random
import subprocess
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def local_logprobs(model, ids, numerics="exact"):
    """[len(ids)][vocab] float64 log-softmax of `ds4 --dump-logits --logits-all`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "logits.json")
        subprocess.run([os.path.join(ROOT, "ds4"), "-m", model, "-t", "2", "--numerics", numerics, "--ctx", "256",
                        "--token-ids", ",".join(map(str, ids)), "--dump-logits", path, "--logits-all"],
                       cwd=ROOT, check=True, capture_output=True)
        with open(path) as f:
            z = np.array(json.load(f)["logits"], dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def make_prompt(model, name, prompt, cont, k, numerics="exact"):
    """One prompt's vectors: the reference is the model itself."""
    lp = local_logprobs(model, prompt + cont[:-1], numerics)
    steps = []
    for i, tok in enumerate(cont):
        row = lp[len(prompt) - 1 + i]
        top = np.argsort(-row, kind="stable")[:k]
        steps.append({"id": tok, "top": [{"id": int(t), "logprob": float(row[t])} for t in top]})
    return {"name": name, "prompt_ids": prompt, "steps": steps}, lp


def perturb(p, rng):
    """Every other step: the reference's top token becomes its third, the
    logprobs shift by up to 0.5 (kept sorted and <= 0), the top-k shrinks."""
    q = json.loads(json.dumps(p))
    for i, st in enumerate(q["steps"]):
        if i % 2:
            continue
        top = st["top"]
        top[0]["id"], top[2]["id"] = top[2]["id"], top[0]["id"]
        lps = sorted((min(0.0, e["logprob"] + rng.uniform(-0.5, 0.5)) for e in top), reverse=True)
        for e, v in zip(top, lps):
            e["logprob"] = v
        del top[len(top) - 1 - i % 3:]
    return q


def expected(p, lp):
    """The metrics ds4 must print for prompt p, from the local log-softmax lp."""
    out = []
    n_prompt = len(p["prompt_ids"])
    for i, st in enumerate(p["steps"]):
        row = lp[n_prompt - 1 + i]
        ids = [e["id"] for e in st["top"]]
        ref_lp = np.array([e["logprob"] for e in st["top"]])
        ref = ids[0]
        rank = int(np.sum(row > row[ref]))
        gap = ref_lp[0] - row[ref]
        pl = ref_lp - np.log(np.exp(ref_lp - ref_lp.max()).sum()) - ref_lp.max()
        ql = row[ids] - np.log(np.exp(row[ids] - row[ids].max()).sum()) - row[ids].max()
        kl = float(np.sum(np.exp(pl) * (pl - ql)))
        out.append((int(np.argmax(row)) == ref, rank, gap, kl))
    return out


def fixtures(model):
    rng = random.Random(21)
    prompts = []
    for name, n_p, n_c in (("short", 5, 6), ("longer", 40, 10)):
        prompt = [0] + [rng.randrange(1, 512) for _ in range(n_p - 1)]
        cont = [rng.randrange(512) for _ in range(n_c)]
        p, _ = make_prompt(model, name, prompt, cont, 5)
        prompts.append(p)
    exact = {"ds4_vectors": 1, "source": "synthetic: ds4tiny A-f32's own logits (--numerics exact)", "prompts": prompts}
    pert = {"ds4_vectors": 1, "source": "synthetic: ds4tiny A-f32's own logits, perturbed (make_vectors.perturb)",
            "prompts": [perturb(p, random.Random(5)) for p in prompts]}
    return exact, pert


if __name__ == "__main__":
    model = os.path.join(ROOT, "build", "ds4tiny", "A-f32.gguf")
    exact, pert = fixtures(model)
    out = os.path.join(ROOT, "tests", "fixtures", "vectors")
    os.makedirs(out, exist_ok=True)
    for name, v in (("tinyA-exact.json", exact), ("tinyA-perturbed.json", pert)):
        with open(os.path.join(out, name), "w") as f:
            json.dump(v, f, indent=1)
            f.write("\n")
