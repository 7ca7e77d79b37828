#!/usr/bin/env python3
"""Load benchmark for ds4-server with NVIDIA's aiperf (PyPI `aiperf`), the
load generator issue 11 asks for: streamed greedy chat completions at
several concurrency levels against a running server.

    python3 -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf
    ./ds4-server -m MODEL --batched-session 8 --ctx 2048 -t 2 --port 8000 &
    python3 scripts/bench_server_aiperf.py --aiperf /tmp/aiperf/bin/aiperf \\
        --url http://127.0.0.1:8000 --concurrency 1,4,8,16 --requests 16 \\
        --input-tokens 48 --output-tokens 32 --rounds 2

aiperf writes synthetic prompts of --input-tokens tokens, counted with the
DeepSeek tokenizer the repository carries (data/deepseek-v3-tokenizer.json,
put in a temporary folder in the layout Hugging Face loaders read); output
tokens are the server's own usage counts (--use-server-token-count), since
text a random-weight model writes need not re-tokenize to the same count.
Each round runs every level once, every other round in reverse order, each
with its own seed, so no two runs send the same prompts and the server's
prefix reuse plays no part.

Prints one Markdown table: time to first token and inter-token latency
percentiles (p50 / p90 / p99 ms, pooled over the rounds from aiperf's
per-request records; the inter-token latencies are every gap between two
streamed tokens), aggregate output tokens/s (aiperf's output token
throughput: tokens over the level's wall time) as min / median / max over
the rounds, the median against concurrency 1, and the CPU aiperf itself used
while its requests ran (its processes' CPU, sampled from /proc every 0.2 s,
between the first request's start and the last one's end, over that time;
median of the rounds): on a machine of few cores that is taken from the
server, and the table measures both. The load average before
and after is printed with it. A benchmark: it prints, it never asserts."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_server_load import pct  # the same percentiles as the openai-SDK table

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "data", "deepseek-v3-tokenizer.json")


def tokenizer_dir(tmp):
    d = os.path.join(tmp, "tokenizer")
    os.makedirs(d)
    shutil.copyfile(TOKENIZER, os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return d


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """CPU seconds of root and its descendants, with what they reaped
    (utime, stime, cutime, cstime of /proc/PID/stat)."""
    parent, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parent[int(pid)] = int(fields[1])
        cpu[int(pid)] = sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
    total = 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += seconds
    return total


def cpu_between(samples, start, end):
    """Cores used from start to end (wall seconds), from (time, cpu) samples."""
    def at(t):
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        return samples[-1][1] if t > samples[-1][0] else samples[0][1]
    return (at(end) - at(start)) / (end - start) if end > start else 0.0


def run_level(args, tok, tmp, concurrency, seed):
    out = os.path.join(tmp, f"run-{seed}")
    cmd = [args.aiperf, "profile", "--model", args.model, "--url", args.url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", tok, "--concurrency", str(concurrency),
           "--request-count", str(args.requests), "--prompt-input-tokens-mean", str(args.input_tokens),
           "--prompt-input-tokens-stddev", "0", "--output-tokens-mean", str(args.output_tokens),
           "--output-tokens-stddev", "0", "--extra-inputs", "temperature:0", "--use-server-token-count",
           "--random-seed", str(seed), "--ui-type", "none", "--artifact-dir", out]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    # aiperf's processes' CPU, sampled while it runs: only what they use
    # between the first request's start and the last one's end competes with
    # the server (start-up and reports do not)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(0.2):
            samples.append((time.time(), tree_cpu(proc.pid)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    output = proc.communicate()[0]
    done.set()
    sampler.join()
    if proc.returncode:
        sys.exit(f"aiperf failed (exit {proc.returncode}):\n{output[-3000:]}")
    with open(os.path.join(out, "profile_export_aiperf.json")) as f:
        summary = json.load(f)
    ttft, itl, errors = [], [], 0
    first, last = float("inf"), 0.0
    with open(os.path.join(out, "profile_export.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            first = min(first, rec["metadata"]["request_start_ns"] / 1e9)
            last = max(last, rec["metadata"]["request_end_ns"] / 1e9)
            m = rec.get("metrics", {})
            if "time_to_first_token" not in m:
                errors += 1
                continue
            ttft.append(m["time_to_first_token"]["value"])
            itl += m.get("inter_chunk_latency", {}).get("value", [])
    cores = cpu_between(samples, first, last) if len(samples) > 1 else float("nan")
    return summary["output_token_throughput"]["avg"], ttft, itl, errors, cores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    ap.add_argument("--model", default="deepseek-chat", help="model name sent (deepseek-chat: no thinking)")
    ap.add_argument("--api-key", default=os.environ.get("DS4_API_KEY", ""))
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16, help="requests per level and round")
    ap.add_argument("--input-tokens", type=int, default=48)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    tmp = tempfile.mkdtemp(prefix="ds4-aiperf-")
    try:
        tok = tokenizer_dir(tmp)
        load_before = os.getloadavg()
        rates = {c: [] for c in levels}
        ttft = {c: [] for c in levels}
        itl = {c: [] for c in levels}
        cores = {c: [] for c in levels}
        errors = 0
        for rnd in range(args.rounds):
            for c in (levels if rnd % 2 == 0 else levels[::-1]):
                rate, t, i, e, used = run_level(args, tok, tmp, c, seed=1000 * (rnd + 1) + c)
                cores[c].append(used)
                rates[c].append(rate)
                ttft[c] += t
                itl[c] += i
                errors += e
                print(f"round {rnd + 1}, concurrency {c}: {rate:.2f} output tok/s", file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
          f"{args.rounds} rounds x {args.requests} requests per level, {args.input_tokens} prompt tokens, "
          f"at most {args.output_tokens} output tokens; requests without a first token: {errors}\n")
    print("| concurrency | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | output tok/s (min / median / max) "
          f"| aggregate vs concurrency {levels[0]} | aiperf's own CPU, cores |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(rates[levels[0]])
    for c in levels:
        r = rates[c]
        print(f"| {c} | {pct(ttft[c], 50):.0f} / {pct(ttft[c], 90):.0f} / {pct(ttft[c], 99):.0f} "
              f"| {pct(itl[c], 50):.0f} / {pct(itl[c], 90):.0f} / {pct(itl[c], 99):.0f} "
              f"| {min(r):.2f} / {statistics.median(r):.2f} / {max(r):.2f} | {statistics.median(r) / base:.2f}x "
              f"| {statistics.median(cores[c]):.2f} |")


if __name__ == "__main__":
    main()
