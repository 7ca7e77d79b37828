#!/usr/bin/env python3
"""Load benchmark for ds4-server: the openai SDK with asyncio, streamed chat
completions at several concurrency levels against one or more running
servers.

    python3 scripts/bench_server_load.py --base http://127.0.0.1:8000/v1 \
        --concurrency 1,4,8,16 --requests 16 --max-tokens 32 --rounds 3

    # two servers side by side (e.g. --batched-session 8 against 1), interleaved
    python3 scripts/bench_server_load.py --concurrency 1 --requests 2 --rounds 7 \
        --base b8=http://127.0.0.1:8001/v1,b1=http://127.0.0.1:8002/v1

For each round, each concurrency level and each server in turn (so load on a
shared machine falls on all of them alike; every other round in reverse
order, so no server always finds the page cache warmed by another), `requests` requests (distinct
prompts, greedy) are sent with at most `concurrency` in flight. Prints one
Markdown table: time to first token and inter-token latency percentiles
(p50/p90/p99 ms, pooled over the rounds), aggregate output tokens/s (tokens
streamed / wall time of the level) as min / median / max over the rounds,
each server's median against the first server's at the same level, and the
cores this client used (median over the rounds). The
load average before and after is printed with it. A benchmark: it prints,
it never asserts."""
import argparse
import asyncio
import os
import statistics
import time


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


async def one(client, i, max_tokens, ttft, itl):
    prompt = f"Request {i}: " + " ".join(f"word{i}_{k}" for k in range(8 + i % 7))
    start = time.perf_counter()
    last = None
    n = 0
    stream = await client.chat.completions.create(model="deepseek-chat", stream=True, max_tokens=max_tokens,
                                                  temperature=0, messages=[{"role": "user", "content": prompt}])
    async for ev in stream:
        if not ev.choices or not ev.choices[0].delta.content:
            continue
        now = time.perf_counter()
        if last is None:
            ttft.append((now - start) * 1000)
        else:
            itl.append((now - last) * 1000)
        last = now
        n += 1
    return n


async def level(base, concurrency, requests, max_tokens, first_id, ttft, itl):
    """One level against one server; returns its output tokens/s and the
    cores this client process used meanwhile (its CPU time over the wall time:
    on a machine of few cores that is taken from the server)."""
    import openai  # here, so that bench_server_aiperf.py can share pct() without the SDK

    client = openai.AsyncOpenAI(base_url=base, api_key="none", timeout=3600, max_retries=0)
    sem = asyncio.Semaphore(concurrency)

    async def guarded(i):
        async with sem:
            return await one(client, first_id + i, max_tokens, ttft, itl)

    t0, cpu0 = time.perf_counter(), time.process_time()
    counts = await asyncio.gather(*(guarded(i) for i in range(requests)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await client.close()
    return sum(counts) / wall, cpu / wall


def servers(spec):
    """"URL" or "label=URL,label=URL" -> [(label, url)]."""
    out = []
    for item in spec.split(","):
        label, _, url = item.rpartition("=")
        out.append((label or url, url))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000/v1", help="URL, or label=URL,label=URL,...")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    bases = servers(a.base)
    levels = [int(x) for x in a.concurrency.split(",")]
    stats = {(label, c): ([], [], [], []) for label, _ in bases for c in levels}   # ttft, itl, tok/s, cores per round
    load_before = os.getloadavg()
    next_id = 0
    for rnd in range(a.rounds):
        for c in levels:
            # every other round in reverse order: the servers share the model's
            # page cache, and whichever runs first warms it for the next
            for label, url in bases if rnd % 2 == 0 else bases[::-1]:
                ttft, itl, rates, cores = stats[(label, c)]
                # prompts differ between runs, so no server reuses another run's prefix
                rate, used = asyncio.run(level(url, c, a.requests, a.max_tokens, next_id, ttft, itl))
                rates.append(rate)
                cores.append(used)
                next_id += a.requests
    load_after = os.getloadavg()
    print(f"load average (1/5/15 min): before {load_before[0]:.1f} / {load_before[1]:.1f} / {load_before[2]:.1f}, "
          f"after {load_after[0]:.1f} / {load_after[1]:.1f} / {load_after[2]:.1f}; {a.rounds} rounds, "
          f"{a.requests} requests of {a.max_tokens} tokens per level\n")
    print("| server | concurrency | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | "
          "output tok/s min / median / max | median vs first server | client CPU, cores |")
    print("|---|---|---|---|---|---|---|")
    for c in levels:
        ref = statistics.median(stats[(bases[0][0], c)][2])
        for label, _ in bases:
            ttft, itl, rates, cores = stats[(label, c)]
            med = statistics.median(rates)
            print(f"| {label} | {c} | {pct(ttft, 50):.0f} / {pct(ttft, 90):.0f} / {pct(ttft, 99):.0f} | "
                  f"{pct(itl, 50):.0f} / {pct(itl, 90):.0f} / {pct(itl, 99):.0f} | "
                  f"{min(rates):.2f} / {med:.2f} / {max(rates):.2f} | {med / ref:.2f}x | "
                  f"{statistics.median(cores):.2f} |", flush=True)


if __name__ == "__main__":
    main()
