"""ds4-server as a pipeline coordinator (src/dist/dist.c) with one ./ds4 worker on
loopback ports, against a single-process ds4-server on the demo model:
- greedy chat completions through the route equal the single process's;
- a worker stopped with SIGSTOP (its connection stays open, it answers
  nothing): the request in flight fails with an error answer naming the
  route's silence after --dist-reply-timeout, and the server stays up;
  resumed, the worker registers again and the next request equals the
  single process's;
- a worker killed with SIGKILL: the next request fails with an error
  answer; a restarted worker is replayed and the request after it equals
  the single process's;
- the disk KV cache through the route: a split server stopped with SIGTERM
  saves the conversation (the worker's layers fetched into one normal
  payload); a split server restarted on the same directory loads it (the
  worker's layers sent back), reports the prompt as cached and answers the
  next turn as the single process does.
The demo model has random weights: outputs are compared, never read."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "server"))
from server_helper import ROOT, MODEL, Server, Results, demo_model_or_skip, free_port  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SECRET = "server-route"


def start_worker(port):
    return subprocess.Popen([DS4, "-t", "1", "-m", MODEL, "--role", "worker", "--layers", "3:output",
                             "--coordinator", "127.0.0.1", str(port), "--dist-secret", SECRET, "--ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


# small disk-cache thresholds so a short conversation is saved (as test_kv_restart.py)
KV_FLAGS = ["--kv-cache-min-tokens", "16", "--kv-cache-cold-max-tokens", "100000", "--kv-cache-boundary-trim-tokens",
            "4", "--kv-cache-boundary-align-tokens", "16", "--kv-disk-space-mb", "64"]
LONG = "Explain in detail how a pipeline of processes passes hidden states along a route. " * 3


def chat_full(srv, messages):
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 8, "temperature": 0, "messages": messages})
    if status != 200:
        return status, body.decode(errors="replace"), 0
    j = json.loads(body)
    cached = (j.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return status, j["choices"][0]["message"]["content"], cached


def chat(srv, text):
    return chat_full(srv, [{"role": "user", "content": text}])[:2]


def turns(first_answer):
    return [{"role": "user", "content": LONG}, {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "and then?"}]


def main():
    demo_model_or_skip("test_dist_server")
    res = Results("test_dist_server")
    prompts = ["first question", "second question", "third question", "fourth question"]
    single = Server()
    try:
        want = [chat(single, p) for p in prompts]
        want_first = chat(single, LONG)
        want_second = chat_full(single, turns(want_first[1]))[:2]
    finally:
        single.stop()
    res.check(all(st == 200 for st, _ in want), "single-process answers: %s" % want)

    port = free_port()
    worker = start_worker(port)
    split = Server("--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(port),
                   "--dist-secret", SECRET, "--dist-wait", "30", "--dist-reply-timeout", "3")
    try:
        res.check(chat(split, prompts[0]) == want[0], "through the route: differs from the single process")

        os.kill(worker.pid, signal.SIGSTOP)
        status, text = chat(split, prompts[1])
        res.check(status != 200 and "no answer from the route" in text, "stopped worker: %s %s" % (status, text))
        os.kill(worker.pid, signal.SIGCONT)
        res.check(chat(split, prompts[1]) == want[1], "resumed worker: differs from the single process")

        worker.kill()
        worker.wait()
        status, text = chat(split, prompts[2])
        res.check(status != 200 and ("gone" in text or "incomplete route" in text),
                  "killed worker: %s %s" % (status, text))
        res.check(split.alive(), "the server survives the worker's death")
        worker = start_worker(port)
        res.check(chat(split, prompts[3]) == want[3], "restarted worker: differs from the single process")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        split.stop()

    kv_dir = tempfile.mkdtemp(prefix="ds4-dist-kv-")
    coord = ["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(port), "--dist-secret", SECRET,
             "--dist-wait", "30", "--kv-disk-dir", kv_dir, *KV_FLAGS]
    try:
        first = Server(*coord)
        try:
            res.check(chat(first, LONG) == want_first, "first turn through the route differs")
        finally:
            first.stop()   # SIGTERM: the shutdown save fetches the worker's layers
        res.check(len(os.listdir(kv_dir)) > 0, "the shutdown save wrote no cache file")
        again = Server(*coord)
        try:
            status, text, cached = chat_full(again, turns(want_first[1]))
        finally:
            again.stop()
        res.check((status, text) == want_second, "second turn after a restart from disk differs: %s %s" % (status, text))
        res.check(cached > 0, "the restarted server did not use the cached prompt (cached_tokens %d)" % cached)
    finally:
        shutil.rmtree(kv_dir, ignore_errors=True)
        worker.kill()
        worker.wait()
    res.done()


if __name__ == "__main__":
    main()
