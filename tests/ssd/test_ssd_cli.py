"""--ssd-streaming through the real binaries on the demo model (random
weights: only equality with the mapped path and structure are checked):
- ds4 --dump-logits --logits-all (prefill) and --dump-logprobs (decode) give
  byte-identical JSON with the routed experts streamed through a cache of
  one layer's selection (every layer evicts) and without streaming;
- the start-up report line and the --ssd-streaming-stats line appear;
- with room for them, the next layer's guessed experts are read early
  (counted in the stats line) and the output is still byte-identical;
- the automatic budget inside a cgroup v1 memory limit (where this process
  may create one) stays under the limit and gives the same logits;
- bad values and a budget below one layer's selection: one line, exit != 0;
  a sub-option without --ssd-streaming: one line, exit != 0, in ds4,
  ds4-bench and ds4-server;
- faults through the test-only hooks of expert_cache.h: an injected EIO
  gives its line, exit 1 and no logits file; DS4_TEST_EXPERT_NO_DIRECT takes
  the buffered path with its warning line and byte-identical logits;
- ds4-bench adds the expert cache CSV columns; ds4-server answers a greedy
  completion with the same text as a mapped server; one whose expert read
  fails once answers that request with an error and the next one with the
  mapped server's text (a transient error does not kill a server).
"""
import json, os, re, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from server_helper import Results, Server, demo_model_or_skip  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
MODEL = "models/demo.gguf"
results = Results("test_ssd_cli")
check = results.check


def run(argv, prefix=(), env=None):
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def ds4(*args, prefix=(), env=None):
    return run(["./ds4", "-m", MODEL, "-t", "2", *args], prefix, env)


demo_model_or_skip("test_ssd_cli")
tmp = tempfile.mkdtemp(prefix="ds4-ssd-")
ids = ",".join(str(i) for i in (0, 17, 300, 4242, 99, 12345, 7, 7, 512, 1000, 20000, 31, 64, 65, 66, 900))
# the demo model selects this many experts per token (the minimum slot count)
k = next(int(l.split()[-1]) for l in run(["./ds4-gguf-dump", MODEL]).stdout.splitlines()
         if "expert_used_count" in l)
STREAM = ["--ssd-streaming", "--ssd-streaming-cache-experts", str(k), "--ssd-streaming-cold"]


def outputs(extra, prefix=(), env=None):
    """(prefill logits JSON, greedy decode JSON, stderr) for one configuration."""
    lg, lp = os.path.join(tmp, "lg.json"), os.path.join(tmp, "lp.json")
    r1 = ds4("--token-ids", ids, "--dump-logits", lg, "--logits-all", *extra, prefix=prefix, env=env)
    r2 = ds4("-p", "Streaming experts from disk", "--nothink", "--dump-logprobs", lp, "-n", "12", *extra,
             prefix=prefix, env=env)
    check(r1.returncode == 0 and r2.returncode == 0, f"ds4 {extra}: {r1.stderr[-300:]} {r2.stderr[-300:]}")
    read = lambda p: open(p, "rb").read() if os.path.exists(p) else b""
    out = (read(lg), read(lp), r1.stderr + r2.stderr)
    for p in (lg, lp):
        if os.path.exists(p):
            os.unlink(p)
    return out


ref = outputs([])
check(len(ref[0]) > 1000 and len(ref[1]) > 100, "mapped run produced logits")
st = outputs([*STREAM, "--ssd-streaming-stats"])
check(st[0] == ref[0], "prefill logits differ with --ssd-streaming")
check(st[1] == ref[1], "decoded logprobs differ with --ssd-streaming")
check(re.search(rf"ssd-streaming: .* resident, expert cache {k} slots", st[2]), "report line: " + st[2][:400])
m = re.search(r"ssd-streaming stats: (\d+) tokens, hit rate ([\d.]+)%.*?([\d.]+) MiB read per token", st[2])
check(m and int(m.group(1)) > 0 and float(m.group(3)) > 0, "stats line: " + st[2][-400:])

# room for the next layer's guessed experts beside a decode layer's own: the
# guesses are read early and change nothing in the output
guess = outputs(["--ssd-streaming", "--ssd-streaming-cache-experts", str(3 * k), "--ssd-streaming-cold",
                 "--ssd-streaming-stats"])
check(guess[0] == ref[0] and guess[1] == ref[1], "logits differ with next-layer guesses read early")
# the second stats line is the decode run's (a prefill batch guesses nothing)
m = re.findall(r"next-layer guesses [\d.]+% right \((\d+) of (\d+), (\d+) read ahead\)", guess[2])
check(len(m) == 2 and int(m[1][0]) <= int(m[1][1]) and int(m[1][2]) > 0, "guess stats: " + guess[2][-400:])

buffered = outputs(STREAM, env={"DS4_TEST_EXPERT_NO_DIRECT": "1"})
check(buffered[0] == ref[0] and buffered[1] == ref[1], "logits differ with buffered (non-O_DIRECT) reads")
check("refuses O_DIRECT" in buffered[2] and "buffered reads" in buffered[2], "buffered warning: " + buffered[2][:400])

lg = os.path.join(tmp, "eio.json")
r = ds4("--token-ids", ids, "--dump-logits", lg, "--logits-all", *STREAM, env={"DS4_TEST_EXPERT_READ_EIO": "5"})
errs = [l for l in r.stderr.splitlines() if "failed" in l]
check(r.returncode == 1 and len(errs) == 1 and "expert read at offset" in errs[0] and "Input/output error" in errs[0],
      f"injected EIO: rc {r.returncode} '{r.stderr}'")
check(not os.path.exists(lg), "logits written despite a read error")

# inside a memory cgroup (v1) of 256 MiB: the automatic budget must fit it
cg = None
own = [l.split(":")[2] for l in open("/proc/self/cgroup").read().splitlines() if l.split(":")[1] == "memory"]
if own and os.access(f"/sys/fs/cgroup/memory{own[0]}", os.W_OK):
    cg = f"/sys/fs/cgroup/memory{own[0]}/ds4-ssd-test-{os.getpid()}"
    try:
        os.mkdir(cg)
        with open(f"{cg}/memory.limit_in_bytes", "w") as f:
            f.write(str(256 << 20))
    except OSError:
        cg = None
if cg:
    enter = ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]
    lim = outputs(["--ssd-streaming", "--ssd-streaming-cold", "-c", "256", "--prefill-chunk", "64"], prefix=enter)
    check(lim[0] == ref[0] and lim[1] == ref[1], "logits differ under the cgroup limit")
    m = re.search(r"ssd-streaming: ([\d.]+) GiB resident, expert cache (\d+) slots x ([\d.]+) MiB", lim[2])
    check(m and float(m.group(1)) * 1024 + int(m.group(2)) * float(m.group(3)) < 256, "auto budget: " + lim[2][:400])
    peak = int(open(f"{cg}/memory.max_usage_in_bytes").read())
    check(peak <= 256 << 20, f"cgroup peak {peak}")
    os.rmdir(cg)
else:
    print("note: no writable memory cgroup here; the slot-budget checks above still ran")

for bad in (["--ssd-streaming-cache-experts", "12XB"], ["--ssd-streaming-cache-experts"],
            ["--ssd-streaming-preload-experts", "-3"]):
    r = ds4("--token-ids", ids, "--ssd-streaming", *bad)
    check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "ssd-streaming" in r.stderr,
          f"{bad}: rc {r.returncode} '{r.stderr}'")
for binary in ("./ds4", "./ds4-bench", "./ds4-server"):
    for sub_option in (["--ssd-streaming-cold"], ["--ssd-streaming-no-predict"], ["--ssd-streaming-cache-experts", "4"]):
        r = run([binary, "-m", MODEL, "-t", "2", *sub_option])
        check(r.returncode != 0 and r.stderr.strip() == f"{binary[2:]}: the --ssd-streaming-* options need --ssd-streaming",
              f"{binary} {sub_option} without --ssd-streaming: rc {r.returncode} '{r.stderr}'")
r = ds4("--token-ids", ids, "--ssd-streaming", "--ssd-streaming-cache-experts", "64KB")
check(r.returncode == 1 and "smaller than one layer" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      f"tiny budget: rc {r.returncode} '{r.stderr}'")

r = run(["./ds4-bench", "-m", MODEL, "-t", "2", "--ctx-start", "16", "--ctx-max", "16", "--gen-tokens", "4", *STREAM])
rows = [l.split(",") for l in r.stdout.strip().splitlines()]
check(r.returncode == 0 and rows and rows[0][-4:] == ["gen_hit_rate", "gen_mib_per_token", "read_mib_s", "gen_stall_s"]
      and len(rows) == 2 and len(rows[1]) == len(rows[0]), "ds4-bench columns: " + r.stdout + r.stderr[-300:])


def complete(*extra):
    s = Server(*extra)
    try:
        body = {"model": "ds4", "prompt": "The quick brown fox", "max_tokens": 10, "temperature": 0}
        code, _, data = s.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        return code, json.loads(data)["choices"][0]["text"] if code == 200 else data
    finally:
        s.stop()


a, b = complete(), complete(*STREAM)
check(a[0] == 200 and a == b, f"server completions differ: {a} vs {b}")

os.environ["DS4_TEST_EXPERT_READ_EIO"] = "5"
s = Server(*STREAM)
del os.environ["DS4_TEST_EXPERT_READ_EIO"]
try:
    body = {"model": "ds4", "prompt": "The quick brown fox", "max_tokens": 10, "temperature": 0}
    code, _, data = s.request("POST", "/v1/completions", body)
    check(code >= 500 and b"Input/output error" in data, f"request with a failed read: {code} {data[:300]}")
    code, _, data = s.request("POST", "/v1/completions", body)
    check(code == 200 and json.loads(data)["choices"][0]["text"] == a[1], f"retry after a failed read: {code} {data[:300]}")
finally:
    s.stop()

shutil.rmtree(tmp, ignore_errors=True)
results.done()
