"""The disk KV cache on a full file system, on the demo model: a 3 MiB tmpfs
holds two cache files of this model (about 1.2 MiB each). Five different
conversations keep saving; every save that meets the full disk evicts the
oldest files and succeeds on its retry, so no save fails, and /metrics shows
it: writes that met a full disk, files evicted to make room, no failures,
the out-of-space gauge at 0. Needs root for the mount: elsewhere it says NOT
RUN and exits 77."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_kv_full_disk"
FLAGS = ["--kv-cache-min-tokens", "16", "--kv-disk-space-mb", "64"]


def metrics(srv):
    st, _, b = srv.request("GET", "/metrics")
    assert st == 200
    out = {}
    for ln in b.decode().splitlines():
        if ln.startswith("ds4_kv_disk"):
            k, v = ln.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main():
    demo_model_or_skip(NAME)
    tmp = tempfile.mkdtemp(prefix="ds4-kvfull-")
    cache = os.path.join(tmp, "cache")
    os.mkdir(cache, 0o700)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", cache], capture_output=True,
                       text=True)
    if m.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"{NAME}: NOT RUN: cannot mount a tmpfs ({m.stderr.strip()}); needs root")
        sys.exit(77)
    t = Results(NAME)
    try:
        srv = Server("--kv-disk-dir", cache, *FLAGS)
        try:
            for i in range(5):
                st, _, b = srv.request("POST", "/v1/chat/completions", {
                    "model": "m", "thinking": False, "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"conversation {i} is about " + "boats and rivers " * 10}]})
                t.check(st == 200, f"conversation {i}: {st} {b[:200]!r}")
            got = metrics(srv)
            log = open(srv.log.name, encoding="utf-8", errors="replace").read()
        finally:
            srv.stop()
        sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(cache, "*.kv"))]
        t.check(sizes and max(sizes) > 1 << 20, f"cache files of over 1 MiB fill a 3 MiB disk: {sizes}")
        t.check(got.get("ds4_kv_disk_no_space_total", 0) >= 1, f"no save met the full disk: {got}")
        t.check(got.get("ds4_kv_disk_no_space_evictions_total", 0) >= 1, f"nothing evicted to make room: {got}")
        t.check(got.get('ds4_kv_disk_save_failures_total{reason="no_space"}') == 0,
                f"saves failed for lack of space: {got}")
        t.check(got.get("ds4_kv_disk_out_of_space") == 0, f"out-of-space gauge: {got}")
        t.check(got.get("ds4_kv_disk_saves_total", 0) > 2, f"no more saves than two files hold: {got}")
        t.check("the disk is full; evicted" in log, "the eviction on a full disk is logged")
    finally:
        subprocess.run(["umount", cache])
        shutil.rmtree(tmp, ignore_errors=True)
    t.done()


if __name__ == "__main__":
    main()
