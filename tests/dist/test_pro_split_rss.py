#!/usr/bin/env python3
"""A V4 Pro-shaped model split in two processes maps only each half.

Input: $BUILD/ds4pro/pro-shaped-2layer.gguf (mk/pro.mk): ds4-make-model's
`pro` preset (hidden 7168, 128 heads x 512, 16 output groups, q rank 1536,
expert width 3072, the q2 mix) cut to two layers (ratios 128 and 4, so the
second half holds the indexer), 6 routed experts so that one token reads
every expert, and a 1024-id vocabulary.

A coordinator with --layers 0:0 and a worker with --layers 1:output (separate
processes on loopback, docs/distributed.md's two-host layout) prefill four tokens; each
process's peak resident set (getrusage of the child) must lie between

  lower: the bytes of the weights the half reads in full (its layer, and the
         output head on the worker; the embedding is excluded because only
         the four tokens' rows of it are read), and
  upper: its half's bytes in the file (embedding included) + 64 MiB for the
         process itself (binary and libraries, the KV state of --ctx 64,
         activations and scratch; about 10 MiB measured here).

The other half is about 500 MiB, so the upper bound fails if a process maps
and touches the other half's weights; the lower bound fails if the half was
not really used. The half sizes come from the file's tensor table read with
gguf-py, independently of the engine."""
import os
import signal
import subprocess
import sys
import tempfile

from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_dist_split as dist  # noqa: E402  (its process helpers: ports, workers, the secret)

MODEL = os.path.join(dist.ROOT, dist.BUILD, "ds4pro", "pro-shaped-2layer.gguf")
MiB = 1 << 20
PROCESS_ALLOWANCE = 64 * MiB


def half_bytes(r, layer, globals_held, embd_in_full):
    """(bytes the half holds, bytes it reads in full) from the tensor table."""
    held = full = 0
    for t in r.tensors:
        mine = t.name.startswith("blk.%d." % layer) or t.name in globals_held
        if mine:
            held += int(t.n_bytes)
            if t.name != "token_embd.weight" or embd_in_full:
                full += int(t.n_bytes)
    return held, full


def peak_rss(pid):
    """Waits for the child and returns its peak resident set in bytes."""
    _, status, usage = os.wait4(pid, 0)
    return status, usage.ru_maxrss * 1024


def main():
    if not (os.access(dist.DS4, os.X_OK) and os.path.exists(MODEL)):
        print("test_pro_split_rss: SKIPPED: needs ./ds4 and %s (make test builds them)" % MODEL)
        return 77
    r = GGUFReader(MODEL)
    n_layer = int(r.fields["deepseek4.block_count"].contents())
    head = {"output_hc_fn.weight", "output_hc_scale.weight", "output_hc_base.weight", "output_norm.weight",
            "output.weight"}
    halves = [("coordinator 0:0", half_bytes(r, 0, {"token_embd.weight"}, False)),
              ("worker 1:output", half_bytes(r, 1, head, True))]
    file_bytes = os.path.getsize(MODEL)
    ok = n_layer == 2 and int(r.fields["deepseek4.embedding_length"].contents()) == 7168
    if not ok:
        print("FAIL: %s is not the 2-layer Pro-shaped model" % MODEL)
        return 1
    del r
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.json")
        port = dist.free_port()
        worker = dist.start_worker(MODEL, "1:output", port, extra=("--ctx", "64"))
        coord = subprocess.Popen([dist.DS4, "-t", "1", "-m", MODEL, "--role", "coordinator", "--layers", "0:0",
                                  "--listen", "127.0.0.1", str(port), "--dist-secret", dist.SECRET, "--dist-wait", "60",
                                  "--ctx", "64", "--token-ids", "5,6,7,8", "--dump-logits", out],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=dist.ROOT)
        try:
            status, coord_rss = peak_rss(coord.pid)
            coord.returncode = os.waitstatus_to_exitcode(status)
            worker.send_signal(signal.SIGKILL)
            _, worker_rss = peak_rss(worker.pid)
            worker.returncode = -9
        finally:
            for p in (coord, worker):
                if p.returncode is None:
                    p.kill()
                    p.wait()
        err = coord.stderr.read().strip()
        ran = coord.returncode == 0 and os.path.exists(out)
    failed = 0
    if not ran:
        print("FAIL: the split prefill did not run: exit %s, %s" % (coord.returncode, err[-300:]))
        failed += 1
    print("Pro-shaped 2-layer file: %.1f MiB" % (file_bytes / MiB))
    print("%-16s %12s %14s %12s %12s" % ("process", "half MiB", "read in full", "peak RSS", "bounds"))
    for (name, (held, full)), rss in zip(halves, (coord_rss, worker_rss)):
        lo, hi = full, held + PROCESS_ALLOWANCE
        good = lo <= rss <= hi
        print("%-16s %12.1f %14.1f %12.1f %5.0f..%-5.0f %s" % (name, held / MiB, full / MiB, rss / MiB, lo / MiB,
                                                              hi / MiB, "ok" if good else "FAIL"))
        failed += not good
    print("test_pro_split_rss: %d passed, %d failed" % (3 - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
