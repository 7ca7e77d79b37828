"""The binaries speak one command-line dialect (src/options/cli_args.h):
- every binary rejects an unknown option with exit 2 and the same line,
  "PROG: unknown option OPT (see --help)";
- ds4, ds4-server, ds4-bench, ds4-agent and ds4-eval accept the shared model flags
  (-m, -t, --cpu, --prefill-chunk N, --numerics exact|ds4) and refuse any other
  --numerics spelling (ds4-bench took 0|1 once);
- a missing model says what to do (-m models/demo.gguf, ./download_model.sh),
  including when no -m is given and the default ./ds4flash.gguf is absent,
  instead of the circular "run make demo";
- a FIFO or directory given as the model is refused at once, not opened;
- a shared option's bad or missing value gets the same line in every binary
  (one range per option, "PROG: OPT: bad value 'V' (WHAT)").
Flags are parsed against a model path that does not exist, which stops every
binary right after its arguments were accepted (exit 1, not 2); on the demo
model, the load line shows --numerics took effect in ds4, ds4-server and
ds4-bench.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_BINARIES = ["ds4", "ds4-server", "ds4-bench", "ds4-agent", "ds4-eval"]
ALL_BINARIES = MODEL_BINARIES + ["ds4-convert", "ds4-gguf-dump", "ds4-make-model", "ds4-vocab"]


# One check collector for every script test (tests/server/server_helper.py).
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_helper import Results  # noqa: E402

results = Results("test_shared_flags")
check = results.check


def run(binary, *args, cwd=ROOT):
    # stdin closed: the interactive ds4 must never wait for input here. A
    # binary still running after 60 s (blocked opening a FIFO) fails.
    try:
        return subprocess.run([os.path.join(ROOT, binary), *args], cwd=cwd, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, None, "", "still running after 60 s")


def says_what_to_do(stderr):
    return "-m models/ds4-tiny.gguf" in stderr and "./download_model.sh" in stderr and "run make demo" not in stderr


for b in ALL_BINARIES:
    r = run(b, "--frobnicate")
    check(r.returncode == 2 and r.stderr == f"{b}: unknown option --frobnicate (see --help)\n",
          f"{b} unknown option: rc {r.returncode}, {r.stderr!r}")

with tempfile.TemporaryDirectory() as tmp:
    absent = os.path.join(tmp, "absent.gguf")
    for b in MODEL_BINARIES:
        for numerics in ("exact", "ds4"):
            r = run(b, "--cpu", "--numerics", numerics, "--prefill-chunk", "64", "-t", "1", "-m", absent)
            check(r.returncode == 1 and says_what_to_do(r.stderr) and r.stderr.count("\n") == 1,
                  f"{b} shared flags (--numerics {numerics}) then a one-line missing-model hint: "
                  f"rc {r.returncode}, {r.stderr!r}")
        r = run(b, "--numerics", "1", "-m", absent)
        check(r.returncode == 2 and "--numerics" in r.stderr, f"{b} refuses --numerics 1: {r.stderr!r}")
        r = run(b, "-m")
        check(r.returncode == 2 and r.stderr == f"{b}: -m needs a value\n", f"{b} -m without value: {r.stderr!r}")
        fifo = os.path.join(tmp, "model.fifo")
        os.mkfifo(fifo)
        r = run(b, "-m", fifo)
        check(r.returncode == 1 and "not a regular file" in r.stderr, f"{b} refuses a FIFO: {r.stderr!r}")
        os.unlink(fifo)
        r = run(b, "-m", tmp)
        check(r.returncode == 1 and "not a regular file" in r.stderr, f"{b} refuses a directory: {r.stderr!r}")
    # one range and one line per shared option (options/cli_args.h): every
    # binary refuses the same bad value of the same option with the same
    # words, only its name first
    for args, line in ((("-t", "x"), "-t: bad value 'x' (an integer in [0, 4096])"),
                       (("--ctx", "15"), "--ctx: bad value '15' (an integer in [16, 16777216])"),
                       (("--prefill-chunk", "0"), "--prefill-chunk: bad value '0' (an integer in [1, 1048576])"),
                       (("--numerics", "f16"), "--numerics: bad value 'f16' (exact or ds4)"),
                       (("--gpu-devices",), "--gpu-devices needs a value")):
        for b in MODEL_BINARIES:
            if b in ("ds4-bench", "ds4-eval") and args[0] == "--ctx":
                continue   # ds4-bench sweeps contexts with --ctx-start/--ctx-max; ds4-eval sizes its own
            r = run(b, "-m", absent, *args)
            check(r.returncode == 2 and r.stderr == f"{b}: {line}\n", f"{b} {' '.join(args)}: {r.stderr!r}")
    # the default model (no -m) of the CLI and the server, run where it is absent
    for b, args in (("ds4", ["-p", "hi"]), ("ds4-server", [])):
        r = run(b, *args, cwd=tmp)
        check(r.returncode == 1 and says_what_to_do(r.stderr) and "ds4flash.gguf" in r.stderr,
              f"{b} without -m: rc {r.returncode}, {r.stderr!r}")

# The shared flags take effect, not only parse: each binary's load line on the
# demo model reports the numerics asked for ("f32" is what exact runs as).
DEMO = os.path.join(ROOT, "models", "demo.gguf")
check(os.path.exists(DEMO), "models/demo.gguf is missing (make demo-model)")


def load_line(binary, *args):
    """The engine's load line ("...numerics X"); the server is stopped once it has printed it."""
    p = subprocess.Popen([os.path.join(ROOT, binary), "-m", DEMO, "-t", "1", "--cpu", "--prefill-chunk", "64", *args],
                         cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        for line in p.stderr:
            if " numerics " in line:
                return line.strip()
        return ""
    finally:
        p.kill()
        p.wait()


if os.path.exists(DEMO):
    for numerics, shown in (("exact", "numerics f32"), ("ds4", "numerics ds4")):
        for binary, args in (("ds4", ["--nothink", "-n", "1", "-p", "hi"]),
                             ("ds4-server", ["--port", "0"]),
                             ("ds4-bench", ["--ctx-start", "64", "--ctx-max", "64", "--gen-tokens", "1"])):
            line = load_line(binary, "--numerics", numerics, *args)
            check(line.endswith(shown), f"{binary} --numerics {numerics}: load line {line!r}")

results.done()
