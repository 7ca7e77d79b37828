"""A pipeline worker (./ds4 --role worker) loads its layer slice through the
engine (ds4_engine_load, then ds4_engine_serve_worker) like every other
process, so the engine's load rules hold for it: an option the engine
refuses for a slice is refused here too, with the engine's one line and exit
1, before the worker tries to register, instead of being ignored:
- --ssd-streaming with a slice (the expert cache walks every layer);
- --cuda with a slice (the GPU upload plan walks every layer);
- an --ssd-streaming-* option without --ssd-streaming.
No coordinator listens on the port given: a worker that got past its load
would wait for one (and this test would time out and fail).
The worker that registers and serves is tests/dist/test_dist_split.py's."""
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DS4 = os.path.join(ROOT, "ds4")
DEMO = os.path.join(ROOT, "models", "demo.gguf")

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(*extra):
    args = [DS4, "-t", "1", "-m", DEMO, "--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1",
            str(free_port()), "--dist-secret", "s", *extra]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(args, None, "", "still running after 30 s: %s" % (e.stderr or b"")[-300:])


if not os.path.exists(DEMO):
    print("test_dist_worker_engine: SKIPPED: %s is missing (make demo)" % DEMO)
    sys.exit(77)

for extra, line in [(("--ssd-streaming",), "works with the CPU backend only, without --ssd-streaming"),
                    (("--cuda",), "works with the CPU backend only"),
                    (("--ssd-streaming-stats",), "the --ssd-streaming-* options need --ssd-streaming")]:
    r = worker(*extra)
    check(r.returncode == 1 and r.stderr.startswith("ds4 worker: ") and line in r.stderr and
          r.stderr.count("\n") == 1, "worker %s: rc %s, %r" % (" ".join(extra), r.returncode, r.stderr))

print("test_dist_worker_engine: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
