"""ds4-server as a tensor-parallel coordinator (src/dist/tp.c) with one ./ds4
--tensor-parallel worker on loopback ports, against a single-process
ds4-server, on the demo model and on GLM's glm-demo (its states travel as
GLM payloads):
- greedy chat completions equal the single process's, also when the next
  request reuses the cached prefix of a session the worker holds;
- a worker killed with SIGKILL while the server is idle: the next request
  fails, after --dist-wait, with an error answer naming the lost worker,
  and the server stays up; a restarted worker gets
  every session's state (TP_STATE) and the requests after it, one of them
  continuing a cached conversation, equal the single process's;
- the disk KV cache: a tensor-parallel server stopped with SIGTERM saves
  the conversation; one restarted on the same directory loads it (the
  loaded state is sent to the worker), reports the prompt as cached and
  answers the next turn as the single process does.
The models have random weights: outputs are compared, never read."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "server"))
from server_helper import ROOT, MODEL, Server, Results, demo_model_or_skip, free_port  # noqa: E402
from test_dist_server import KV_FLAGS, LONG, chat, chat_full, turns  # noqa: E402
import subprocess  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SECRET = "server-tp"


GLM = os.path.join(ROOT, os.environ.get("BUILD", "build"), "glmchat", "glm-demo.gguf")


def start_worker(port, model):
    return subprocess.Popen([DS4, "-t", "1", "-m", model, "--tensor-parallel", "--role", "worker", "--coordinator",
                             "127.0.0.1", str(port), "--dist-secret", SECRET, "--ctx", "32768"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def run(res, model):
    """Every check on one model (the server's -m: the later one given wins)."""
    m = ["-m", model]
    name = os.path.basename(model)

    def check(ok, msg):
        res.check(ok, "%s: %s" % (name, msg))

    prompts = ["first question", "second question", "third question"]
    single = Server(*m)
    try:
        want = [chat(single, p) for p in prompts]
        want_first = chat(single, LONG)
        want_second = chat_full(single, turns(want_first[1]))[:2]
    finally:
        single.stop()
    check(all(st == 200 for st, _ in want), "single-process answers: %s" % want)

    port = free_port()
    worker = start_worker(port, model)
    tp = Server(*m, "--tensor-parallel", "--role", "coordinator", "--listen", "127.0.0.1", str(port),
                "--dist-secret", SECRET, "--dist-wait", "8", "--dist-reply-timeout", "10")
    try:
        check(chat(tp, prompts[0]) == want[0], "tensor parallel: differs from the single process")
        check(chat(tp, LONG) == want_first, "tensor parallel, long prompt: differs")
        worker.kill()
        worker.wait()
        status, text = chat(tp, prompts[1])
        check(status != 200 and "connection closed" in text, "killed worker: %s %s" % (status, text))
        check(tp.alive(), "the server survives the worker's death")
        worker = start_worker(port, model)
        check(chat(tp, prompts[2]) == want[2], "restarted worker: differs from the single process")
        check(chat_full(tp, turns(want_first[1]))[:2] == want_second,
                  "restarted worker, cached conversation continued: differs from the single process")
    finally:
        worker.kill()
        worker.wait()
        tp.stop()

    kv_dir = tempfile.mkdtemp(prefix="ds4-tp-kv-")
    coord = [*m, "--tensor-parallel", "--role", "coordinator", "--listen", "127.0.0.1", str(port), "--dist-secret",
             SECRET, "--dist-wait", "30", "--kv-disk-dir", kv_dir, *KV_FLAGS]
    worker = start_worker(port, model)
    try:
        first = Server(*coord)
        try:
            check(chat(first, LONG) == want_first, "first turn (tensor parallel) differs")
        finally:
            first.stop()
        check(len(os.listdir(kv_dir)) > 0, "the shutdown save wrote no cache file")
        again = Server(*coord)
        try:
            status, text, cached = chat_full(again, turns(want_first[1]))
        finally:
            again.stop()
        check((status, text) == want_second, "second turn after a restart from disk differs: %s %s" % (status, text))
        check(cached > 0, "the restarted server did not use the cached prompt (cached_tokens %d)" % cached)
    finally:
        worker.kill()
        worker.wait()
        shutil.rmtree(kv_dir, ignore_errors=True)


def main():
    demo_model_or_skip("test_tp_server")
    res = Results("test_tp_server")
    if not os.path.exists(GLM):
        print("test_tp_server: SKIPPED: %s missing (make test builds it)" % GLM)
        sys.exit(77)
    for model in (MODEL, GLM):
        run(res, model)
    res.done()


if __name__ == "__main__":
    main()
