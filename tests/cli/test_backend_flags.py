"""Other engines' backend flags on ds4, ds4-server, ds4-bench and ds4-agent
(a command line copied from them should say what this build can do, not
"unknown option"):
- `--metal` and `--backend NAME` for a backend this build lacks: exit 2 and
  one line naming the flag and the backends the build has ("this build has:
  cpu" here, "cpu, cuda" in a CUDA build);
- `--backend cpu` is accepted (the binary goes on to the missing model);
- `--gpu-vram` / `--gpu-devices` without `--cuda` change nothing, and a run on
  the demo model (ds4, the engine's load) says so in exactly one warning
  line, also when both are given or `--cpu` is spelled out; never without
  them.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results, demo_model_or_skip  # noqa: E402

NAME = "test_backend_flags"
res = Results(NAME)
BINARIES = ["ds4", "ds4-server", "ds4-bench", "ds4-agent"]
WARNING = "ds4: warning: --gpu-vram/--gpu-devices have no effect without --cuda (running on the CPU)\n"


def run(binary, *args):
    return subprocess.run([os.path.join(ROOT, binary), *args], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


# The binaries in the root are built from $BUILD's library: the CUDA stand-in
# (none.o) is linked exactly when the build has no CUDA backend.
members = subprocess.run(["ar", "t", os.path.join(ROOT, os.environ.get("BUILD", "build"), "libds4.a")],
                         capture_output=True, text=True).stdout.split()
has = "cpu" if "none.o" in members else "cpu, cuda"

with tempfile.TemporaryDirectory() as tmp:
    absent = os.path.join(tmp, "absent.gguf")
    for b in BINARIES:
        for flags, named in ((["--metal"], "--metal"), (["--backend", "metal"], "--backend metal"),
                             (["--backend", "rocm"], "--backend rocm")):
            r = run(b, *flags, "-m", absent)
            res.check(r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"{b}: {named}: ") and
                      r.stderr.endswith(f"this build has: {has}\n"),
                      f"{b} {' '.join(flags)}: one line naming the build's backends: rc {r.returncode}, {r.stderr!r}")
        r = run(b, "--backend", "cpu", "-m", absent)
        res.check(r.returncode == 1 and "unknown option" not in r.stderr and absent in r.stderr,
                  f"{b} --backend cpu accepted: rc {r.returncode}, {r.stderr!r}")
        r = run(b, "--backend")
        res.check(r.returncode == 2 and r.stderr == f"{b}: --backend needs a value\n",
                  f"{b} --backend without a value: rc {r.returncode}, {r.stderr!r}")

demo_model_or_skip(NAME)
MODEL = os.path.join(ROOT, "models", "demo.gguf")
for flags in (["--gpu-vram", "8"], ["--gpu-devices", "0"], ["--gpu-vram", "8,8", "--gpu-devices", "0,1"],
              ["--cpu", "--gpu-vram", "auto"]):
    r = run("ds4", "-m", MODEL, "-t", "1", "-n", "1", "-p", "hi", *flags)
    res.check(r.returncode == 0 and r.stderr.count(WARNING) == 1,
              f"ds4 {' '.join(flags)}: one warning, then it runs: rc {r.returncode}, {r.stderr!r}")
r = run("ds4", "-m", MODEL, "-t", "1", "-n", "1", "-p", "hi")
res.check(r.returncode == 0 and "--gpu-vram" not in r.stderr, f"no GPU flags, no warning: {r.stderr!r}")
res.done()
