#!/usr/bin/env python3
"""Load benchmark for ds4-server: the openai SDK with asyncio, streamed chat
completions at several concurrency levels against a running server.

    python3 scripts/bench_server_load.py --base http://127.0.0.1:8000/v1 \
        --concurrency 1,4,8,16 --requests 16 --max-tokens 32

For each level, `requests` requests (distinct prompts, greedy) are sent with
at most `concurrency` in flight. Prints one Markdown table: time to first
token and inter-token latency percentiles (p50/p90/p99, ms), aggregate output
tokens/s (tokens streamed / wall time of the level) and requests/s. A
benchmark: it prints, it never asserts."""
import argparse
import asyncio
import time

import openai


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


async def level(base, concurrency, requests, max_tokens):
    client = openai.AsyncOpenAI(base_url=base, api_key="none", timeout=3600, max_retries=0)
    sem = asyncio.Semaphore(concurrency)
    ttft, itl = [], []

    async def guarded(i):
        async with sem:
            return await one(client, i, max_tokens, ttft, itl)

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(guarded(i) for i in range(requests)))
    wall = time.perf_counter() - t0
    await client.close()
    return ttft, itl, sum(counts), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    print("| concurrency | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | output tok/s | requests/s |")
    print("|---|---|---|---|---|")
    for c in (int(x) for x in a.concurrency.split(",")):
        ttft, itl, tokens, wall = asyncio.run(level(a.base, c, a.requests, a.max_tokens))
        print(f"| {c} | {pct(ttft, 50):.0f} / {pct(ttft, 90):.0f} / {pct(ttft, 99):.0f} | "
              f"{pct(itl, 50):.0f} / {pct(itl, 90):.0f} / {pct(itl, 99):.0f} | {tokens / wall:.1f} | "
              f"{a.requests / wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
