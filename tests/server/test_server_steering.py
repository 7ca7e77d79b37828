"""Per-request directional steering in ds4-server (docs/steering.md): the
"dir_steering" extension field ({"file", "ffn", "attn"}) steers one request
with the file the server was started with.

- A server started with --dir-steering-file F --dir-steering-ffn 0 (unsteered
  by default) answers a greedy completion with dir_steering {ffn: 3, attn: -2}
  exactly as a server started with those scales answers it without the field
  (text and logprobs), and differently from its own unsteered answer; an
  unsteered request after the steered one gets the unsteered answer again
  (the steered KV state is not reused), on /v1/completions and
  /v1/chat/completions.
- With a disk KV cache (small thresholds), steered requests save nothing
  there, whether the scales are the request's or the server's, while an
  unsteered request on the same server does (cache files do not record
  scales, so no other server could reuse a steered state).
- A file name that is not the server's, a server without a file, and a
  malformed field are refused with a 400 naming dir_steering."""
import glob
import json
import os
import random
import struct
import tempfile

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_server_steering"
demo_model_or_skip(NAME)
res = Results(NAME)

PROMPT = "The lighthouse keeper climbed the stairs and"
STEER = {"ffn": 3, "attn": -2}


def direction_file(path, n_layer=6, n_embd=256):
    rng = random.Random(5)
    with open(path, "wb") as f:
        for _ in range(n_layer):
            v = [rng.gauss(0, 1) for _ in range(n_embd)]
            norm = sum(x * x for x in v) ** 0.5
            f.write(struct.pack(f"<{n_embd}f", *(x / norm for x in v)))


def ask(srv, steer=None, chat=False):
    body = {"model": "x", "max_tokens": 12, "temperature": 0}
    if chat:
        body.update(messages=[{"role": "user", "content": PROMPT}], logprobs=True, top_logprobs=2,
                    thinking={"type": "disabled"})
    else:
        body.update(prompt=PROMPT, logprobs=2)
    if steer is not None:
        body["dir_steering"] = steer
    status, _, raw = srv.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body)
    if status != 200:
        return status, json.loads(raw)
    c = json.loads(raw)["choices"][0]
    return status, (c["message"] if chat else c["text"], c.get("logprobs"))


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "dir.f32")
    direction_file(path)
    ref = {}
    srv = Server("--dir-steering-file", path, "--dir-steering-ffn", str(STEER["ffn"]), "--dir-steering-attn",
                 str(STEER["attn"]))
    try:
        for chat in (False, True):
            status, ref[chat] = ask(srv, chat=chat)
            res.check(status == 200, f"server steered by default answers (chat={chat}): {status}")
    finally:
        srv.stop()
    srv = Server("--dir-steering-file", path, "--dir-steering-ffn", "0")
    try:
        for chat in (False, True):
            what = "chat" if chat else "completion"
            _, plain = ask(srv, chat=chat)
            status, steered = ask(srv, {"file": "dir.f32", **STEER}, chat=chat)
            res.check(status == 200, f"{what}: steered request answers 200: {status} {steered}")
            res.check(steered == ref[chat], f"{what}: dir_steering equals the server started with the same scales")
            res.check(steered != plain, f"{what}: the steered answer differs from the unsteered one")
            _, again = ask(srv, chat=chat)
            res.check(again == plain, f"{what}: an unsteered request after a steered one is unsteered")
            _, full = ask(srv, {"file": path, **STEER}, chat=chat)
            res.check(full == ref[chat], f"{what}: the file named by its full path works too")
        for bad, why in (({"file": "other.f32", "ffn": 1}, "another file"), ("dir.f32", "not an object"),
                         ({"ffn": 1}, "no file"), ({"file": "dir.f32", "ffn": "x"}, "a bad scale")):
            status, err = ask(srv, bad)
            res.check(status == 400 and "dir_steering" in json.dumps(err), f"{why} refused with 400: {status} {err}")
    finally:
        srv.stop()
    kv_flags = ["--kv-cache-min-tokens", "16", "--kv-cache-cold-max-tokens", "100000",
                "--kv-cache-boundary-trim-tokens", "4", "--kv-cache-boundary-align-tokens", "16"]
    long_prompt = " ".join(["the keeper counted the ships that passed the rocks at night"] * 6)
    for scales, what in ((["--dir-steering-ffn", "0"], "request-steered"), (["--dir-steering-ffn", "3"], "server-steered")):
        cache = os.path.join(d, "kv-" + what)
        os.mkdir(cache)
        srv = Server("--dir-steering-file", path, *scales, "--kv-disk-dir", cache, *kv_flags)
        try:
            body = {"model": "x", "prompt": long_prompt, "max_tokens": 4, "temperature": 0}
            if what == "request-steered":
                body["dir_steering"] = {"file": "dir.f32", **STEER}
            status, _, _ = srv.request("POST", "/v1/completions", body)
            res.check(status == 200, f"{what}: a long steered completion answers: {status}")
            res.check(not glob.glob(os.path.join(cache, "*.kv")), f"{what}: nothing saved to the disk cache")
            if what == "request-steered":
                body = {"model": "x", "prompt": "Plain: " + long_prompt, "max_tokens": 4, "temperature": 0}
                status, _, _ = srv.request("POST", "/v1/completions", body)
                res.check(status == 200 and glob.glob(os.path.join(cache, "*.kv")),
                          "an unsteered request on the same server saves its prefix (the cache is on)")
        finally:
            srv.stop()
    srv = Server()
    try:
        status, err = ask(srv, {"file": "dir.f32", "ffn": 1})
        res.check(status == 400 and "without" in json.dumps(err), f"no file at start: 400: {status} {err}")
    finally:
        srv.stop()
res.done()
