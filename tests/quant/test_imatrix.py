"""`ds4 --imatrix-dataset F --imatrix-out OUT` on the oracle model A (f32):
- gguf-py reads the file: general.type "imatrix", imatrix.datasets,
  imatrix.chunk_count / chunk_size, and for each weight "<name>.in_sum2"
  F32 [ne0, n_mat] with "<name>.counts" F32 [1, n_mat], n_mat = the expert
  count of an expert stack, ne0 = the weight's row length;
- the counts: every plain matrix saw every token (the grouped attention
  output once per group; the output head each chunk's last row, the only
  logits a prefill computes), and each layer's routed experts together saw
  tokens x experts-per-token;
- the values: layer 0's hyper-connection mix (blk.0.hc_attn_fn) sees the
  RMS-normalised embedding rows repeated once per stream; numpy computes
  that sum of squares from the model file's embedding table and the ids,
  independently of the engine; attn_q_a and attn_kv share one input, so
  their sums are equal;
- `ds4-convert --imatrix` reads it, and a q2 conversion with it differs from
  one without it in the expert weights it quantizes, while the tensors it
  keeps in float stay byte-identical;
- the shipped prompt set runs on the demo model with both chat renders
  (two chunks per entry); refusals are one line.
"""
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

try:
    import gguf
except ImportError:
    print("test_imatrix: SKIPPED: gguf-py missing (make venv)")
    sys.exit(77)

results = Results("test_imatrix")
check = results.check
MODEL = os.path.join(ROOT, BUILD, "ds4tiny", "A-f32.gguf")
DEMO = os.path.join(ROOT, "models", "demo.gguf")
PROMPTS = os.path.join(ROOT, "data", "imatrix-prompts.txt")


def run(*args, timeout=300):
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout)


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


if not os.path.exists(MODEL):
    print(f"test_imatrix: SKIPPED: {MODEL} missing (make {MODEL})")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    rng = random.Random(11)
    seqs = [[rng.randrange(512) for _ in range(n)] for n in (20, 33, 9)]
    ds = os.path.join(tmp, "ids.txt")
    with open(ds, "w") as f:
        f.write("\n@@@\n".join(",".join(map(str, s)) for s in seqs) + "\n")
    out = os.path.join(tmp, "imatrix.gguf")
    r = run("./ds4", "-m", MODEL, "-t", "2", "--numerics", "exact", "--ctx", "16", "--imatrix-dataset", ds,
            "--imatrix-ids", "--imatrix-out", out)
    check(r.returncode == 0 and os.path.exists(out), f"collect: rc {r.returncode} {r.stderr[-400:]!r}")
    T = sum(len(s) for s in seqs)
    chunks = sum((len(s) + 15) // 16 for s in seqs)
    check(f"from {T} tokens in {chunks} chunks (context 16)" in r.stdout, f"summary: {r.stdout!r}")

    rd = gguf.GGUFReader(out)
    fields = {k: f.contents() for k, f in rd.fields.items()}
    check(fields.get("general.type") == "imatrix" and fields.get("imatrix.datasets") == [ds]
          and fields.get("imatrix.chunk_count") == chunks and fields.get("imatrix.chunk_size") == 16,
          f"keys: { {k: v for k, v in fields.items() if not k.startswith('GGUF')} }")
    im = {t.name: t for t in rd.tensors}
    model = gguf.GGUFReader(MODEL)
    weights = {t.name: t for t in model.tensors}
    mfields = {k: f.contents() for k, f in model.fields.items()}
    n_layer = mfields["deepseek4.block_count"]
    k_used = mfields["deepseek4.expert_used_count"]
    groups = mfields["deepseek4.attention.output_group_count"]
    names = sorted(n[: -len(".in_sum2")] for n in im if n.endswith(".in_sum2"))
    check(len(names) > 10 and all(n + ".counts" in im for n in names), f"{len(names)} matrices, each with counts")
    for n in names:
        w, s, c = weights.get(n), im[n + ".in_sum2"], im[n + ".counts"]
        n_mat = int(w.shape[2]) if w is not None and len(w.shape) == 3 else 1
        ok = (w is not None and s.tensor_type == gguf.GGMLQuantizationType.F32 and list(map(int, s.shape)) == [int(w.shape[0]), n_mat]
              and list(map(int, c.shape)) == [1, n_mat] and np.all(np.asarray(s.data) >= 0))
        check(ok, f"{n}: in_sum2 {list(s.shape)}, counts {list(c.shape)}, weight {w is not None and list(w.shape)}")
        counts = np.asarray(c.data, dtype=np.float64).ravel()
        if n_mat == 1:
            # the head runs on each chunk's last row only (no logits asked for the rest)
            want = chunks if n.startswith("output") else T * groups if "attn_output_a" in n else T
            check(counts[0] == want, f"{n}: count {counts[0]}, want {want}")
        else:
            check(counts.sum() == T * k_used, f"{n}: experts saw {counts.sum()} rows, want {T * k_used}")
    for layer in range(n_layer):
        check(all(f"blk.{layer}.{k}.weight" in names for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "attn_q_a")),
              f"layer {layer}: experts and attention recorded")
    check("output.weight" in names, "the output head is recorded")

    # layer 0's HC mix input, computed here from the embedding table
    emb = np.asarray(weights["token_embd.weight"].data, dtype=np.float64)   # [vocab][E]
    n_hc = mfields["deepseek4.hyper_connection.count"]
    eps = mfields["deepseek4.attention.layer_norm_rms_epsilon"]
    want = np.zeros(emb.shape[1] * n_hc)
    for s in seqs:
        for tok in s:
            row = np.tile(emb[tok], n_hc)
            row = row / np.sqrt(np.mean(row * row) + eps)
            want += row * row
    hc = im.get("blk.0.hc_attn_fn.weight.in_sum2")
    got = np.asarray(hc.data, dtype=np.float64).ravel() if hc is not None else np.zeros(0)
    check(got.shape == want.shape and np.allclose(got, want, rtol=2e-5, atol=1e-6),
          f"hc_attn_fn sums vs numpy: max rel {np.max(np.abs(got - want) / np.maximum(want, 1e-9)) if got.shape == want.shape else got.shape}")
    qa, kv = im.get("blk.1.attn_q_a.weight.in_sum2"), im.get("blk.1.attn_kv.weight.in_sum2")
    check(qa is not None and kv is not None and np.array_equal(np.asarray(qa.data), np.asarray(kv.data)),
          "attn_q_a and attn_kv see the same rows")

    # ds4-convert reads it; the quantization follows it
    fixture = os.path.join(ROOT, "tests", "fixtures", "ds4tiny", "A")
    with_im, without = os.path.join(tmp, "with.gguf"), os.path.join(tmp, "without.gguf")
    a = run("./ds4-convert", fixture, with_im, "--type", "q2", "--imatrix", out)
    b = run("./ds4-convert", fixture, without, "--type", "q2")
    check(a.returncode == 0 and b.returncode == 0, f"convert: {a.stderr[-300:]!r} {b.stderr[-300:]!r}")
    if a.returncode == 0 and b.returncode == 0:
        ta, tb = tensors(with_im), tensors(without)
        gate = "blk.0.ffn_gate_exps.weight"
        check(ta[gate].tensor_type == tb[gate].tensor_type and ta[gate].tensor_type != gguf.GGMLQuantizationType.F32
              and bytes(np.asarray(ta[gate].data).tobytes()) != bytes(np.asarray(tb[gate].data).tobytes()),
              f"{gate}: quantized differently with the imatrix")
        norm = "blk.0.attn_norm.weight"
        check(np.array_equal(np.asarray(ta[norm].data), np.asarray(tb[norm].data)), f"{norm} unchanged")
    bad = os.path.join(tmp, "bad.gguf")
    with open(bad, "wb") as f:
        f.write(open(out, "rb").read()[:200])
    c = run("./ds4-convert", fixture, os.path.join(tmp, "x.gguf"), "--type", "q2", "--imatrix", bad)
    check(c.returncode != 0 and c.stderr.strip(), f"a truncated imatrix is refused: {c.stderr[-200:]!r}")

    # refusals
    r = run("./ds4", "-m", MODEL, "--imatrix-dataset", ds)
    check(r.returncode == 2 and r.stderr == "ds4: --imatrix-dataset and --imatrix-out go together\n", f"pairing: {r.stderr!r}")
    r = run("./ds4", "-m", MODEL, "--imatrix-dataset", ds, "--imatrix-out", os.path.join(tmp, "t.gguf"))
    check(r.returncode == 1 and "no tokenizer" in r.stderr, f"text on a model without a tokenizer: {r.stderr!r}")
    with open(os.path.join(tmp, "badids.txt"), "w") as f:
        f.write("1,2,x\n")
    r = run("./ds4", "-m", MODEL, "--imatrix-dataset", os.path.join(tmp, "badids.txt"), "--imatrix-ids", "--imatrix-out",
            os.path.join(tmp, "t.gguf"))
    check(r.returncode == 1 and not os.path.exists(os.path.join(tmp, "t.gguf")), f"bad ids: {r.stderr!r}")

    # the shipped prompt set, both chat renders, on a model with a tokenizer
    if os.path.exists(DEMO):
        entries = [e for e in re.split(r"\n@@@\n", open(PROMPTS).read().rstrip("\n")) if e]
        out2 = os.path.join(tmp, "demo.gguf")
        r = run("./ds4", "-m", DEMO, "-t", "2", "--ctx", "4096", "--imatrix-dataset", PROMPTS, "--imatrix-out", out2)
        check(r.returncode == 0 and f"in {2 * len(entries)} chunks" in r.stdout, f"demo prompt set: {r.stdout!r} {r.stderr[-300:]!r}")
    else:
        print("note: models/demo.gguf missing, the shipped prompt set is not run")

results.done()
