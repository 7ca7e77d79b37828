"""ds4-server as a pipeline coordinator (src/dist.c) with one ./ds4 worker on
loopback ports, against a single-process ds4-server on the demo model:
- greedy chat completions through the route equal the single process's;
- a worker stopped with SIGSTOP (its connection stays open, it answers
  nothing): the request in flight fails with an error answer naming the
  route's silence after --dist-reply-timeout, and the server stays up;
  resumed, the worker registers again and the next request equals the
  single process's;
- a worker killed with SIGKILL: the next request fails with an error
  answer; a restarted worker is replayed and the request after it equals
  the single process's.
The demo model has random weights: outputs are compared, never read."""
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "server"))
from server_helper import ROOT, MODEL, Server, Results, demo_model_or_skip, free_port  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SECRET = "server-route"


def start_worker(port):
    return subprocess.Popen([DS4, "-t", "1", "-m", MODEL, "--role", "worker", "--layers", "3:output",
                             "--coordinator", "127.0.0.1", str(port), "--dist-secret", SECRET, "--ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def chat(srv, text):
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": text}]})
    if status != 200:
        return status, body.decode(errors="replace")
    return status, json.loads(body)["choices"][0]["message"]["content"]


def main():
    demo_model_or_skip("test_dist_server")
    res = Results("test_dist_server")
    prompts = ["first question", "second question", "third question", "fourth question"]
    single = Server()
    try:
        want = [chat(single, p) for p in prompts]
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
        worker.kill()
        worker.wait()
        split.stop()
    res.done()


if __name__ == "__main__":
    main()
