"""lm-eval-harness (0.4.13, model `local-completions`) end to end against
ds4-server: the three local tasks in tests/server/lmeval/ (multiple choice,
loglikelihood, rolling loglikelihood; local JSONL data, no network) run
through POST /v1/completions with token-id prompts, echo and logprobs, and
lm-eval's tokenizer is the server's own (/tokenizer_info, /tokenize).

lm-eval talks to the server through a recording proxy, so the test sees
exactly what went over the wire. The oracles:
* token ids: HF `tokenizers` on the DeepSeek tokenizer.json, split into
  context / continuation the way lm-eval documents it (trailing context
  spaces move to the continuation, the whole text is encoded once);
* every request lm-eval sent is one of those sequences, and every prompt
  token after the first came back with a finite logprob;
* per item, lm-eval's log-likelihood and is_greedy equal those of a direct
  single-prompt request (max_tokens 0, a different request shape and order),
  and for a few items those of `./ds4 --token-ids --dump-logits --logits-all`
  log-softmaxed in numpy (no server involved), within 1e-4;
* acc, perplexity and bits_per_byte follow from those log-likelihoods.

lm-eval runs through lm_eval.evaluator.evaluate with the registry's
local-completions model: simple_evaluate adds only seeding and an
environment report, which imports torch (tens of seconds) where it happens
to be installed.
"""
import contextlib
import http.server
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

import numpy as np
from tokenizers import Tokenizer

from server_helper import MODEL, ROOT, Results, Server, demo_model_or_skip

NAME = "test_lm_eval"
TASK_DIR = os.path.join(ROOT, "tests", "server", "lmeval")
TASKS = ["ds4_lmeval_mc", "ds4_lmeval_ll", "ds4_lmeval_rolling"]
VOCAB = os.path.join(ROOT, "data", "deepseek-v3-tokenizer.json")
DS4 = os.path.join(ROOT, "ds4")
BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
TOL = 1e-4


class Recorder(http.server.ThreadingHTTPServer):
    """Loopback proxy in front of ds4-server: forwards every request unchanged
    and keeps (method, path, request body, status, response body)."""

    daemon_threads = True

    def __init__(self, upstream):
        super().__init__(("127.0.0.1", 0), Forward)
        self.upstream = upstream
        self.log = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def forward(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        req = urllib.request.Request(self.server.upstream + self.path, data=body, method=self.command,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        self.server.log.append((self.command, self.path, body, status, data))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = forward

    def log_message(self, *args):
        pass


def run_lm_eval(t, url, bos_id, eos_id):
    """Returns lm-eval's results (with samples) and everything it printed."""
    import lm_eval.api.registry
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        # lm-eval starts rolling/empty-context sequences with the EOT token
        # unless told otherwise; DeepSeek documents start with BOS, so say so.
        lm = lm_eval.api.registry.get_model("local-completions")(
            base_url=url + "/v1/completions", model="deepseek-v4-flash", tokenizer_backend="remote",
            batch_size=4, num_concurrent=2, max_retries=1, custom_prefix_token_id=bos_id)
        # The remote tokenizer finds EOS as /tokenize(eos_token)[0] with
        # add_special_tokens false: the server must match added tokens there.
        t.check(lm.eot_token_id == eos_id, f"lm-eval sees EOS as {lm.eot_token_id}, expected {eos_id}")
        tasks = TaskManager(include_path=TASK_DIR, include_defaults=False).load(TASKS)
        for t in tasks["tasks"].values():
            t.set_config(key="num_fewshot", value=0)
        res = evaluate(lm=lm, task_dict=tasks, bootstrap_iters=0, log_samples=True, verbosity="ERROR")
    return res, out.getvalue()


def split(tk, context, continuation):
    """(context ids, continuation ids) as lm-eval's causal models define them."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tk.encode(context + continuation, add_special_tokens=False).ids
    k = len(tk.encode(context, add_special_tokens=False).ids)
    return whole[:k], whole[k:]


def direct(srv, ids, ctxlen):
    """Log-likelihood and greedy flag of ids[ctxlen:] from one single-prompt request."""
    st, _, body = srv.request("POST", "/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True,
                                                         "logprobs": 1, "temperature": 0})
    lp = json.loads(body)["choices"][0]["logprobs"] if st == 200 else None
    if lp is None or len(lp["token_logprobs"]) != len(ids):
        return None
    span = range(ctxlen, len(ids))
    return (sum(lp["token_logprobs"][i] for i in span),
            all(lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) for i in span))


def cli(ids, ctxlen, tmp):
    """The same from ./ds4's raw logits of every position, log-softmaxed here."""
    path = os.path.join(tmp, "logits.json")
    r = subprocess.run([DS4, "-m", MODEL, "--ctx", "256", "-t", "2", "--token-ids", ",".join(map(str, ids)),
                        "--dump-logits", path, "--logits-all"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    z = np.array(d["logits"], dtype=np.float64)
    z -= z.max(axis=1, keepdims=True)
    ls = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    span = range(ctxlen, len(ids))
    return (float(sum(ls[i - 1, ids[i]] for i in span)),
            all(int(np.argmax(ls[i - 1])) == ids[i] for i in span))


def check_wire(t, log, expected):
    """Every completions request lm-eval made: a batch of expected token-id
    sequences in lm-eval's loglikelihood shape, answered 200 with one choice
    per prompt whose echo logprobs are finite."""
    paths = [p for _, p, _, _, _ in log]
    t.check("/tokenizer_info" in paths and "/tokenize" in paths, f"lm-eval used the remote tokenizer: {set(paths)}")
    sent = []
    for method, path, body, status, data in log:
        if path != "/v1/completions":
            continue
        req = json.loads(body)
        t.check(status == 200, f"completions status {status}: {data[:300]!r}")
        if status != 200:
            continue
        prompts = req["prompt"]
        t.check(req.get("echo") is True and req.get("max_tokens") == 1 and req.get("logprobs", 0) >= 1
                and isinstance(prompts, list) and all(isinstance(p, list) for p in prompts),
                f"loglikelihood request shape {dict((k, v) for k, v in req.items() if k != 'prompt')}")
        choices = json.loads(data)["choices"]
        t.check(sorted(c["index"] for c in choices) == list(range(len(prompts))),
                f"one choice per prompt: {len(choices)} for {len(prompts)}")
        for c in choices:
            ids = prompts[c["index"]]
            sent.append(tuple(ids))
            lp = c["logprobs"]["token_logprobs"]
            t.check(len(lp) == len(ids) + 1 and lp[0] is None
                    and all(isinstance(x, float) and math.isfinite(x) for x in lp[1:]),
                    f"echo logprobs cover prompt + 1 generated, finite after the first ({len(lp)} for {len(ids)})")
    t.check(sorted(sent) == sorted(expected), f"lm-eval sent {len(sent)} sequences, the HF oracle expects "
            f"{len(expected)}; unexpected: {sorted(set(sent) - set(expected))[:2]}")


def check_metrics(t, res, oracle):
    """acc, perplexity and bits_per_byte recomputed from the direct log-likelihoods."""
    r, samples = res["results"], res["samples"]
    hits = []
    for s in samples["ds4_lmeval_mc"]:
        lls = [oracle[("ds4_lmeval_mc", s["doc_id"], k)][0] for k in range(len(s["arguments"]))]
        hits.append(float(int(np.argmax(lls)) == s["target"]))
        t.check(s["acc"] == hits[-1], f"mc doc {s['doc_id']}: acc {s['acc']} vs oracle {hits[-1]}")
    t.check(abs(r["ds4_lmeval_mc"]["acc,none"] - np.mean(hits)) < 1e-12,
            f"mc acc {r['ds4_lmeval_mc']['acc,none']} vs {np.mean(hits)}")
    ll = [oracle[("ds4_lmeval_ll", s["doc_id"], 0)] for s in samples["ds4_lmeval_ll"]]
    ppl = math.exp(-np.mean([x[0] for x in ll]))
    t.check(math.isclose(r["ds4_lmeval_ll"]["perplexity,none"], ppl, rel_tol=TOL),
            f"ll perplexity {r['ds4_lmeval_ll']['perplexity,none']} vs {ppl}")
    t.check(r["ds4_lmeval_ll"]["acc,none"] == np.mean([x[1] for x in ll]), f"ll acc {r['ds4_lmeval_ll']}")
    docs = samples["ds4_lmeval_rolling"]
    nbytes = sum(len(s["doc"]["text"].encode("utf-8")) for s in docs)
    bpb = -sum(oracle[("ds4_lmeval_rolling", s["doc_id"], 0)][0] for s in docs) / nbytes / math.log(2)
    t.check(math.isclose(r["ds4_lmeval_rolling"]["bits_per_byte,none"], bpb, rel_tol=TOL),
            f"bits_per_byte {r['ds4_lmeval_rolling']['bits_per_byte,none']} vs {bpb}")


def collect(t, res, tk, bos):
    """lm-eval's items with the oracle's token ids:
    (task, doc id, argument index, context length, ids, lm-eval ll, lm-eval is_greedy)."""
    items = []
    for task in TASKS:
        for s in res["samples"][task]:
            for k, (args, resp) in enumerate(zip(s["arguments"], s["resps"])):
                if task == "ds4_lmeval_rolling":  # one window: the prefix token, then the whole text
                    ctx, cont = [bos], tk.encode(args[0], add_special_tokens=False).ids
                    ll, greedy = resp[0], None
                else:
                    ctx, cont = split(tk, args[0], args[1])
                    ll, greedy = resp[0]
                t.check(isinstance(ll, float) and math.isfinite(ll) and len(cont) > 0,
                        f"{task} doc {s['doc_id']} choice {k}: finite loglikelihood {ll}")
                items.append((task, s["doc_id"], k, len(ctx), ctx + cont, ll, greedy))
    return items


def compare(t, items, oracle_fn, what):
    """lm-eval's numbers against an oracle per item; returns the oracle's
    results by (task, doc id, argument index) and the largest ll difference."""
    got, worst = {}, 0.0
    for task, doc, k, ctxlen, ids, ll, greedy in items:
        o = oracle_fn(ids, ctxlen)
        t.check(o is not None, f"{task} doc {doc} choice {k}: {what} failed")
        if o is None:
            continue
        got[(task, doc, k)] = o
        worst = max(worst, abs(ll - o[0]))
        t.check(abs(ll - o[0]) <= TOL, f"{task} doc {doc} choice {k}: lm-eval ll {ll} vs {what} {o[0]}")
        t.check(greedy is None or greedy == o[1], f"{task} doc {doc} choice {k}: is_greedy {greedy} vs {what} {o[1]}")
    return got, worst


def main():
    demo_model_or_skip(NAME)
    if not os.path.exists(DS4):
        print(f"FAIL {NAME}: {DS4} is missing (make ds4)")
        sys.exit(1)
    os.chdir(ROOT)  # the task YAMLs name their data files relative to the repository root
    tmp = tempfile.mkdtemp(prefix="ds4-lmeval-")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=os.path.join(tmp, "hf"),
                      HF_DATASETS_CACHE=os.path.join(tmp, "datasets"), TQDM_DISABLE="1",
                      TOKENIZERS_PARALLELISM="false")
    t = Results(NAME)
    tk = Tokenizer.from_file(VOCAB)
    bos = tk.token_to_id(BOS)
    srv = Server(ctx=2048)
    proxy = Recorder(srv.base)
    try:
        try:
            res, printed = run_lm_eval(t, proxy.url, bos, tk.token_to_id(EOS))
            ok = res is not None and set(TASKS) <= set(res["results"])
            t.check(ok, f"results for {TASKS}: {printed[-2000:]}")
        except Exception as e:  # the whole run is one check; show why it failed
            ok = False
            t.check(False, f"lm-eval run: {e!r}")
        if not ok:
            t.done()
        t.check(srv.alive(), "server alive after lm-eval")

        items = collect(t, res, tk, bos)
        t.check(len(items) == 12 + 3 + 2, f"{len(items)} loglikelihood items")
        check_wire(t, proxy.log, [tuple(it[4]) for it in items])

        # reversed: the server sees the sequences in another order than lm-eval's
        direct_ll, worst_direct = compare(t, items[::-1], lambda ids, n: direct(srv, ids, n), "direct request")
        # the server out of the loop: the first question's choices, the greedy
        # item and the non-ASCII rolling document through ./ds4
        picked = [it for it in items if it[:2] in
                  {("ds4_lmeval_mc", 0), ("ds4_lmeval_ll", 2), ("ds4_lmeval_rolling", 1)}]
        cli_ll, worst_cli = compare(t, picked, lambda ids, n: cli(ids, n, tmp), "./ds4 logits")
        t.check(cli_ll.get(("ds4_lmeval_ll", 2, 0), (0, False))[1],
                "ll doc 2 is not the greedy continuation any more (demo model changed?): put the demo "
                "model's greedy 2-token continuation of its context into tests/server/lmeval/ll.jsonl")
        if len(direct_ll) == len(items):
            check_metrics(t, res, direct_ll)
        t.check(srv.alive(), "server alive at the end")
        print(f"{NAME}: {len(items)} items, {sum(1 for e in proxy.log if e[1] == '/v1/completions')} completions "
              f"requests; max |lm-eval - direct| {worst_direct:.2e}, max |lm-eval - ./ds4| {worst_cli:.2e} "
              f"over {len(picked)} items")
    finally:
        proxy.shutdown()
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    t.done()


if __name__ == "__main__":
    main()
