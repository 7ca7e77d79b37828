#!/usr/bin/env python3
"""--power benchmark: CPU time / wall time of a greedy decode at several
--power values (docs/performance.md). A benchmark: prints a table, asserts
nothing.

    scripts/bench_power.py [-m MODEL] [-n TOKENS] [-t THREADS] [--powers 100,50,25]

Each run is `ds4 -m MODEL -t T -p PROMPT -n N --ignore-eos --temp 0 --power P`.
From the line ds4 prints once the model is loaded (so the load and its
page-in are not counted) to the end, /proc/PID/task/*/schedstat is sampled (CPU time and time spent
waiting on a run queue, in ns). Besides CPU / wall, the table gives
CPU / (wall - run-queue wait): on a shared machine the process also waits for
a core, and that time is not the sleep --power adds, so the corrected ratio
is what an idle machine would show. The runs take turns (--rounds), so load
from other work spreads over every value.
"""
import argparse
import glob
import os
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def schedstat(pid):
    cpu = wait = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            c, w, _ = open(f).read().split()
        except (OSError, ValueError):
            continue
        cpu += int(c)
        wait += int(w)
    return cpu / 1e9, wait / 1e9


def run(args, power):
    """(wall, CPU, run-queue wait) of the prompt and the generation: counted
    from ds4's "context ... KV state" line, printed after the model loaded"""
    cmd = [os.path.join(ROOT, "ds4"), "-m", args.model, "-t", str(args.threads), "-p", args.prompt, "-n",
           str(args.tokens), "--ignore-eos", "--temp", "0", "-c", str(args.tokens + 512), "--power", str(power)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start = {}

    def watch():
        for line in p.stderr:
            if "KV state" in line and not start:
                start["t"], (start["cpu"], start["wait"]) = time.monotonic(), schedstat(p.pid)

    reader = threading.Thread(target=watch)
    reader.start()
    last = (0.0, 0.0)
    while p.poll() is None:
        s = schedstat(p.pid)
        if s[0] >= last[0]:
            last = s
        time.sleep(0.05)
    end = time.monotonic()
    reader.join()
    if p.returncode or not start:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode})")
    return end - start["t"], last[0] - start["cpu"], last[1] - start["wait"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "demo.gguf"))
    ap.add_argument("-n", "--tokens", type=int, default=4000)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--powers", default="100,50,25")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt", default="Tell me a long story about a lighthouse keeper.")
    args = ap.parse_args()
    powers = [int(x) for x in args.powers.split(",")]
    rows = {p: [] for p in powers}
    for _ in range(args.rounds):
        for p in powers:
            rows[p].append(run(args, p))
    print(f"model {os.path.basename(args.model)}, {args.tokens} tokens greedy, -t {args.threads}, "
          f"{args.rounds} runs per value (sampled every 50 ms; the last ~50 ms of a run are not seen)\n")
    print("| --power | wall s | CPU s | run-queue wait s | CPU / wall | CPU / (wall - wait) |")
    print("|---|---|---|---|---|---|")
    for p in powers:
        for wall, cpu, wait in rows[p]:
            print(f"| {p} | {wall:.1f} | {cpu:.1f} | {wait:.1f} | {cpu / wall:.2f} | {cpu / (wall - wait):.2f} |")


if __name__ == "__main__":
    main()
