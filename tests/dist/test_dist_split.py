"""Pipeline parallelism across processes (src/dist/dist.c) on loopback: a
coordinator and 1 or 2 workers, each a separate ./ds4 process holding its
own layer slice, give the single process's output byte for byte:

- prefill, every position's logits (--dump-logits --logits-all), whole, in
  chunks of 3 (--prefill-chunk) and pipelined (--dist-prefill-chunk 2
  --dist-prefill-window 3 on the coordinator: chunks flow worker to worker
  with up to 3 in flight), on the oracle model (build/ds4tiny/A-f32) and the
  demo model;
- decode: a greedy continuation with logprobs (--dump-logprobs) on the demo
  model, where every step goes through the route;
- a worker killed with SIGKILL and restarted: the next request equals the
  single process again;
- a worker's data socket listens on its own address on the way to the
  coordinator (coordinator on 127.0.0.2, worker data on 127.0.0.1);
- --debug on a 3-way split prints the route (each hop's layers and address)
  and, per request, every hop's telemetry gathered from the result frames;
- --dist-activation-bits: 32 gives the single process's logits byte for
  byte; at 16 and 8 every hop receives exactly the format's bytes for its
  hidden states (n tokens x n_hc x n_embd values: 2 bytes each at 16, 1 and a
  4-byte scale per n_embd at 8, against 4 at 32), read from the --debug
  telemetry (the logits at 16 and 8 are checked in test_dist_route);
- a worker's registration line accounts the KV state of its own layers,
  less than the whole model's.
Refusals: a wrong secret, another numerics mode and a slice overlapping a
registered worker are refused with one line each (the worker exits 1); a
coordinator without workers reports an incomplete route; a bad
--dist-activation-bits, or one given to a worker, gets one line.
Ports are free loopback ports; nothing binds beyond 127.0.0.1."""
import hashlib
import hmac
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_wire as wire  # noqa: E402  (NNG's wire protocol spoken by hand)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
DS4 = os.path.join(ROOT, "ds4")
TINY = os.path.join(ROOT, BUILD, "ds4tiny", "A-f32.gguf")
DEMO = os.path.join(ROOT, "models", "demo.gguf")
SECRET = "test-secret"
VERSION = 7   # the protocol version (src/dist/dist_proto.c)
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


def ds4(args, timeout=120):
    return subprocess.run([DS4, "-t", "1", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def start_worker(model, layers, port, secret=SECRET, extra=()):
    return subprocess.Popen([DS4, "-t", "1", "-m", model, "--role", "worker", "--layers", layers,
                             "--coordinator", "127.0.0.1", str(port), "--dist-secret", secret, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def registration_line(w):
    """The worker's line saying it registered (or its last line before it
    exited); lines saying no answer came yet are passed over."""
    line = w.stderr.readline()
    while line and "no answer from" in line:
        line = w.stderr.readline()
    return line


def exit_of(w):
    """A worker expected to exit on its own: its status (None when it was
    still running after 60 s, then killed) and its stderr."""
    try:
        rc = w.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    err = w.stderr.read() if rc is not None else ""
    stop([w])
    return rc, err


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def output_of(args, out):
    r = ds4([*args])
    if r.returncode != 0:
        return ("exit %d: %s" % (r.returncode, r.stderr.strip().splitlines()[-1:] or "")).encode()
    with open(out, "rb") as f:
        return f.read()


def coordinator_args(model, first_slice, port, wait="20"):
    return ["-m", model, "--role", "coordinator", "--layers", first_slice, "--listen", "127.0.0.1", str(port),
            "--dist-secret", SECRET, "--dist-wait", wait]


def coordinator(model, first_slice, port, args, out, wait="20"):
    return output_of([*coordinator_args(model, first_slice, port, wait), *args], out)


def splits(n_layer):
    half = n_layer // 2 - 1
    return [["0:%d" % half, "%d:output" % (half + 1)],
            ["0:0", "1:%d" % (n_layer - 2), "%d:output" % (n_layer - 1)]]


def compare_splits(model, n_layer, cases, tmp):
    """cases: (name, args of both runs, extra args of the coordinator)"""
    for name, args, coord_extra in cases:
        out = os.path.join(tmp, "out.json")
        want = output_of(["-m", model, *args(out)], out)
        check(not want.startswith(b"exit"), "%s %s single: %s" % (os.path.basename(model), name, want[:200]))
        for parts in splits(n_layer):
            port = free_port()
            workers = [start_worker(model, s, port) for s in parts[1:]]
            try:
                got = coordinator(model, parts[0], port, [*args(out), *coord_extra], out)
            finally:
                stop(workers)
            check(got == want, "%s %s split %s: differs from the single process (%s)"
                  % (os.path.basename(model), name, "/".join(parts), got[:200] if got.startswith(b"exit") else "output"))


def main():
    if not (os.access(DS4, os.X_OK) and os.path.exists(TINY) and os.path.exists(DEMO)):
        print("test_dist_split: SKIPPED: needs ./ds4, %s and %s (make test builds them)" % (TINY, DEMO))
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        ids = "--token-ids", "5,6,7,8,9,10,11,12,13,14"
        prefill = [("prefill", lambda o: [*ids, "--dump-logits", o, "--logits-all"], ()),
                   ("chunked prefill", lambda o: [*ids, "--dump-logits", o, "--logits-all", "--prefill-chunk", "3"], ()),
                   ("pipelined prefill", lambda o: [*ids, "--dump-logits", o, "--logits-all"],
                    ("--dist-prefill-chunk", "2", "--dist-prefill-window", "3"))]
        compare_splits(TINY, 6, prefill, tmp)
        decode = [("decode", lambda o: ["-p", "hello there", "--nothink", "--dump-logprobs", o, "-n", "4",
                                        "--prefill-chunk", "2"], ())]
        compare_splits(DEMO, 6, prefill + decode, tmp)

        # kill -9 a worker, restart it: the next request equals the single process
        out = os.path.join(tmp, "out.json")
        args = [*ids, "--dump-logits", out]
        want = output_of(["-m", DEMO, *args], out)
        port = free_port()
        w = start_worker(DEMO, "3:output", port)
        try:
            first = coordinator(DEMO, "0:2", port, args, out)
            os.kill(w.pid, signal.SIGKILL)
            w.wait()
            w = start_worker(DEMO, "3:output", port)
            again = coordinator(DEMO, "0:2", port, args, out)
        finally:
            stop([w])
        check(first == want and again == want, "restarted worker: output differs")

        # --debug: the route and each request's per-hop telemetry
        port = free_port()
        workers = [start_worker(DEMO, s, port) for s in ("1:4", "5:output")]
        try:
            r = ds4([*coordinator_args(DEMO, "0:0", port), *ids, "--dump-logits", out, "--debug",
                     "--dist-prefill-chunk", "4"])
        finally:
            stop(workers)
        lines = r.stderr.splitlines()
        routes = [l for l in lines if "formed: layers 0..0 here -> layers 1..4 at tcp://127.0.0.1:" in l
                  and " -> layers 5..5 + output at tcp://127.0.0.1:" in l]
        requests = [l for l in lines if l.startswith("ds4 coordinator: request ")]
        check(r.returncode == 0 and len(routes) == 1, "--debug route line: %s" % r.stderr.strip()[-600:])
        # 10 tokens in chunks of 4: three requests, each through all three slices
        spans = ["tokens 0..3", "tokens 4..7", "tokens 8..9"]
        check(len(requests) == 3 and all(
            span in q and q.count(span) == 3 and "layers 0..0 " + span in q and "layers 1..4 " + span in q
            and "layers 5..5 " + span in q and q.count(" eval ") == 3 and q.count(" wait ") == 3
            and q.count(" send ") == 3 and "round trip" in q for q, span in zip(requests, spans)),
            "--debug telemetry lines: %s" % requests)

        # --dist-activation-bits: the bytes each hop received, per format
        dump = subprocess.run([os.path.join(ROOT, "ds4-gguf-dump"), DEMO], capture_output=True, text=True).stdout
        dims = dict(re.findall(r"deepseek4\.(embedding_length|hyper_connection\.count)\s+u32\s+(\d+)", dump))
        n_embd, n_hc = int(dims.get("embedding_length", 0)), int(dims.get("hyper_connection.count", 0))
        received = {}   # bits -> {(layers, first token, tokens): bytes in}
        for bits in ("32", "16", "8"):
            port = free_port()
            workers = [start_worker(DEMO, s, port) for s in ("1:4", "5:output")]
            try:
                r = ds4([*coordinator_args(DEMO, "0:0", port), *args, "--debug", "--dist-prefill-chunk", "4",
                         "--dist-activation-bits", bits])
            finally:
                stop(workers)
            check(r.returncode == 0 and "activations %s-bit" % bits in r.stderr,
                  "--dist-activation-bits %s: %s" % (bits, r.stderr.strip()[-300:]))
            if bits == "32":
                check(r.returncode == 0 and open(out, "rb").read() == want,
                      "--dist-activation-bits 32 differs from the single process")
            received[bits] = {(m.group(1), int(m.group(2)), int(m.group(3)) - int(m.group(2)) + 1): int(m.group(4))
                              for m in re.finditer(
                r"layers (1\.\.4|5\.\.5) tokens (\d+)\.\.(\d+) eval .*? in (\d+) B", r.stderr)}
        hops = sorted(received["32"])
        check(n_embd > 0 and n_hc > 0 and len(hops) == 6 and all(sorted(received[b]) == hops for b in ("16", "8")),
              "hops seen per format: %s (n_embd %d, n_hc %d)" % (received, n_embd, n_hc))
        for hop in hops:
            values = hop[2] * n_hc * n_embd
            saved16 = received["32"][hop] - received["16"].get(hop, 0)
            saved8 = received["32"][hop] - received["8"].get(hop, 0)
            check(saved16 == 2 * values and saved8 == 4 * values - (values + 4 * values // n_embd),
                  "layers %s, %d tokens: %d and %d bytes fewer at 16 and 8 bits than at 32, want %d and %d"
                  % (hop[0], hop[2], saved16, saved8, 2 * values, 4 * values - (values + 4 * values // n_embd)))

        # frames on a data port carry a seal under the worker's link key, bound
        # to the secret and to this worker's registration: a frame from
        # someone without the secret (raw bytes over NNG's push protocol,
        # shaped like a ROUTE frame) is dropped before it is decoded, and so
        # are a WORK frame and a ROUTE frame sealed under the secret alone (not
        # bound to the registration); the route serves on (recorded frames
        # replayed: test_dist_replay.py)
        port = free_port()
        workers = [start_worker(DEMO, s, port) for s in ("1:4", "5:output")]
        try:
            r = ds4([*coordinator_args(DEMO, "0:0", port), *args, "--debug"])
            first = open(out, "rb").read() if r.returncode == 0 else b""
            m = re.search(r"layers 1\.\.4 at tcp://127\.0\.0\.1:(\d+)", r.stderr)
            sent = bool(m) and wire.push(int(m.group(1)), b"DS4P" + struct.pack("<HH", VERSION, 6) + bytes(64))
            route = re.search(r"route (\d+) formed", r.stderr)
            # WORK (type 4): route, request 1, session 1, position 0, one token, hashes, modes, no steering, f32,
            # no floats, no hops
            work = (b"DS4P" + struct.pack("<HH", VERSION, 4) + struct.pack("<QIQIIQQBBff", int(route.group(1)) if route
                                                                             else 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0)
                    + struct.pack("<iBIII", 5, 0, 0, 0, 0))
            unbound_work = bool(m) and wire.push(int(m.group(1)), work + hmac.new(SECRET.encode(), work, hashlib.sha1).digest())
            # ROUTE (type 6), a new id, pointing the worker elsewhere
            stale = (b"DS4P" + struct.pack("<HHQI", VERSION, 6, (int(route.group(1)) if route else 0) + 99, 8)
                     + struct.pack("<H", 20) + b"tcp://127.0.0.1:9999" + bytes(16)
                     + struct.pack("<H", 20) + b"tcp://127.0.0.1:9998" + bytes(16))
            unbound_route = bool(m) and wire.push(int(m.group(1)), stale + hmac.new(SECRET.encode(), stale, hashlib.sha1).digest())
            again = output_of([*coordinator_args(DEMO, "0:0", port), *args], out)
        finally:
            stop(workers)
        err = workers[0].stderr.read()
        dropped = err.count("dropped a frame that fails the seal")
        check(sent and unbound_work and unbound_route and dropped == 3 and first == again == want,
              "an unsealed frame and frames sealed under the bare secret are dropped (%d of 3), the route serves "
              "on: worker said %r" % (dropped, err[-300:]))

        # a worker listens on its own address, not the coordinator's: with the
        # coordinator on 127.0.0.2 the worker's way there starts at 127.0.0.1
        port = free_port()
        w = subprocess.Popen([DS4, "-t", "1", "-m", DEMO, "--role", "worker", "--layers", "3:output", "--coordinator",
                              "127.0.0.2", str(port), "--dist-secret", SECRET], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            r = ds4(["-m", DEMO, "--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.2", str(port),
                     "--dist-secret", SECRET, "--dist-wait", "20", "--debug", *args])
            got = open(out, "rb").read() if r.returncode == 0 else b""
        finally:
            stop([w])
        check(r.returncode == 0 and "+ output at tcp://127.0.0.1:" in r.stderr and "results at tcp://127.0.0.2:" in r.stderr
              and got == want, "worker's own address: %s" % r.stderr.strip()[-400:])

        # bad pipelining flags: one line each
        for flags, line in [(("--dist-activation-bits", "12"), "--dist-activation-bits takes 32, 16 or 8"),
                            (("--dist-prefill-chunk", "0"), "--dist-prefill-chunk: bad value"),
                            (("--dist-prefill-window", "99"), "--dist-prefill-window: bad value"),
                            (("--dist-prefill-chunk", "9000"), "exceeds the local batch")]:
            r = ds4([*coordinator_args(DEMO, "0:2", free_port(), "0.5"), *ids, *flags])
            check(r.returncode != 0 and line in r.stderr, "%s: %s" % (" ".join(flags), r.stderr.strip()))

        # refusals, each with its line; the refused worker exits 1
        port = free_port()
        keep = start_worker(DEMO, "3:output", port)
        coord = subprocess.Popen([DS4, "-t", "1", "-m", DEMO, "--role", "coordinator", "--layers", "0:2", "--listen",
                                  "127.0.0.1", str(port), "--dist-secret", SECRET, "--dist-wait", "60", "--debug"],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 text=True, cwd=ROOT)
        try:
            # the overlap case needs this worker registered first; its line
            # accounts the KV state of its layers only (3 of the 6)
            line = registration_line(keep)
            kv = re.search(r"KV state ([0-9.]+) MiB per \d+-token session for these layers \(([0-9.]+) MiB for all 6\)",
                           line)
            check("registered" in line and kv and 0 < float(kv.group(1)) < float(kv.group(2)),
                  "the first worker registers and accounts its slice's KV: %r" % line)
            for layers, secret, extra, line in [("3:output", "wrong", (), "wrong --dist-secret"),
                                                ("3:output", SECRET, ("--numerics", "exact"), "--numerics"),
                                                ("4:output", SECRET, (), "overlap a registered worker")]:
                rc, err = exit_of(start_worker(DEMO, layers, port, secret, extra))
                check(rc == 1 and line in err, "refusal '%s': rc %s, %s" % (line, rc, err.strip()))
        finally:
            stop([coord, keep])
        r = ds4(["-m", DEMO, "--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1",
                 str(free_port()), "--dist-activation-bits", "16"])
        check(r.returncode != 0 and "--dist-activation-bits goes to the coordinator" in r.stderr,
              "activation bits on a worker: %s" % r.stderr.strip())
        r = ds4(["-m", DEMO, "--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(free_port()),
                 "--dist-wait", "0.5", *args])
        check(r.returncode != 0 and "incomplete route: no worker holds layer 3" in r.stderr,
              "no workers: %s" % r.stderr.strip())
    print("test_dist_split: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
