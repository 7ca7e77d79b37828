"""ds4-server --batched-session N under a long prefill (issue 11).

1. A streaming client keeps decoding while another slot prefills a prompt of
   many chunks: the batcher's per-step trace lines ("batch step K: decode
   rows D, prefill rows P, decode waited W steps") must show decode rows in
   steps between the long prompt's first and last chunk, and no decode token
   ever waited for a step that started after it was submitted (W == 0: it
   waits at most for the chunk already running). Ordering, not timing.
   A new request arriving during such a prefill is answered before it ends,
   and its first prompt slice, like every decode token, was never left out
   of a step that started after it was submitted ("prefill waited 0").
2. A request cancelled mid-prefill (its client hangs up) stops prefilling,
   frees its slot (the next request is answered, /health shows no busy slot)
   and leaves the disk KV cache with only complete, CRC-valid files.
3. An idle slot taken over by another conversation is first saved to the
   disk KV cache (an evict checkpoint holding that conversation), and when
   the conversation returns its next turn is restored from disk.
Greedy sampling makes the decoder deterministic, so the checks do too."""
import json
import os
import re
import shutil
import socket
import tempfile
import threading

from server_helper import Results, Server, demo_model_or_skip, wait_for
from test_kv_restart import FLAGS, check_cache_dir, parse_kvc

NAME = "test_batched_faults"
DS4_KVC_EVICT = 3   # kvdisk_file.h: why a checkpoint was written
STEP = re.compile(r"batch step (\d+): decode rows (\d+), prefill rows (\d+), decode waited (\d+) steps, "
                  r"prefill waited (\d+) steps")


def post(port, body):
    """A raw streaming-capable request; returns the socket."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def long_prompt(tag, words):
    return " ".join(f"{tag}{k}" for k in range(words))


def steps(srv):
    """[(line index, decode rows, prefill rows, decode waited, prefill waited)] of
    the trace so far, and its lines."""
    lines = srv.trace_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = STEP.search(line)
        if m:
            out.append((i, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return out, lines


def interleaving(res, srv):
    decoder = post(srv.port, {"model": "m", "max_tokens": 3000, "stream": True, "temperature": 0,
                              "messages": [{"role": "user", "content": "keep talking"}]})
    got = bytearray()
    while got.count(b"data: ") < 3:       # it is decoding
        b = decoder.recv(65536)
        if not b:
            break
        got += b
    res.check(got.count(b"data: ") >= 3, "the decoder streams")
    stop = threading.Event()

    def drain():
        while not stop.is_set():
            try:
                if not decoder.recv(65536):
                    return
            except OSError:
                return
    reader = threading.Thread(target=drain)
    reader.start()
    before = len(srv.trace_text().splitlines())
    status, _, _ = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": long_prompt("p", 1500)}]}, timeout=600)
    res.check(status == 200, f"long prompt answered: {status}")
    all_steps, lines = steps(srv)
    after = [st for st in all_steps if st[0] >= before]
    chunks = [st for st in after if st[2] > 0]
    res.check(len(chunks) >= 6, f"the long prompt took {len(chunks)} prefill chunks, want >= 6")
    if chunks:
        first, last = chunks[0][0], chunks[-1][0]
        between = [st for st in after if first < st[0] < last and st[1] > 0]
        print(f"long prompt: {len(chunks)} chunks, {len(between)} steps between them with decode rows")
        res.check(len(between) >= 1, "the decoder advanced between the long prompt's chunks")
        res.check(not any("client went away" in l or "usage:" in l for l in lines[before:last]),
                  "the decoder was still running during the whole prefill")
    res.check(all(st[3] == 0 for st in after),
              f"a decode token waited for a later step: {[st for st in after if st[3]]}")
    stop.set()
    decoder.close()
    reader.join()


def new_request_during_long_prefill(res, srv):
    """A request arriving while another slot prefills a prompt of dozens of
    chunks starts its own prefill at the next step: it is answered before the
    long prompt's prefill ends, and no step ever left out a prompt's first
    slice that was already waiting (prefill waited 0)."""
    wait_for(lambda: health_idle(srv), "both slots idle", res)
    n_before = len(steps(srv)[0])
    long_client = post(srv.port, {"model": "m", "max_tokens": 2, "temperature": 0,
                                  "messages": [{"role": "user", "content": long_prompt("n", 3000)}]})
    wait_for(lambda: any(st[2] > 0 for st in steps(srv)[0][n_before:]), "the long prompt prefills", res)
    status, _, _ = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": long_prompt("short", 120)}]})
    res.check(status == 200, f"the new request is answered: {status}")
    long_client.close()     # the rest of the long prefill is not needed
    wait_for(lambda: health_idle(srv), "the long prompt's slot is freed", res)
    all_steps, lines = steps(srv)
    after = all_steps[n_before:]
    first = after[0][0] if after else len(lines)
    answered = next((i for i in range(first, len(lines)) if "usage:" in lines[i]), None)
    cancelled = next((i for i in range(first, len(lines)) if "client went away during prefill" in lines[i]), None)
    res.check(answered is not None and cancelled is not None and answered < cancelled,
              f"the new request finished while the long prompt was still prefilling (lines {answered}, {cancelled})")
    prefills = sum(1 for st in after if st[2] > 0 and (answered is None or st[0] < answered))
    print(f"new request during a long prefill: {prefills} steps with prefill rows before its answer")
    res.check(all(st[3] == 0 and st[4] == 0 for st in after),
              f"a waiting decode token or first prompt slice was left out of a step: "
              f"{[st for st in after if st[3] or st[4]]}")


def health_idle(srv):
    status, _, body = srv.request("GET", "/health")
    return status == 200 and json.loads(body).get("slots_busy") == 0


def cancel_mid_prefill(res, srv, cache_dir):
    n_before = len(steps(srv)[0])
    s = post(srv.port, {"model": "m", "max_tokens": 4, "temperature": 0,
                        "messages": [{"role": "user", "content": long_prompt("c", 3000)}]})
    # hang up once its prefill has begun (a step with prefill rows appeared)
    wait_for(lambda: any(st[2] > 0 for st in steps(srv)[0][n_before:]), "the cancelled prompt prefills", res)
    s.close()
    wait_for(lambda: "client went away during prefill" in srv.trace_text(), "the prefill notices the hang-up", res)
    wait_for(lambda: health_idle(srv), "its slot is freed", res)
    chunks = sum(1 for st in steps(srv)[0][n_before:] if st[2] > 0)
    res.check(chunks < 24, f"the cancelled prompt stopped early ({chunks} chunks)")
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "after"}]})
    res.check(status == 200 and json.loads(body)["choices"], "the next request is answered")
    check_cache_dir(res, cache_dir, "cancelled mid-prefill")


def chat(srv, msgs):
    status, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs, "model": "m", "max_tokens": 6, "temperature": 0})
    return status, json.loads(body)


def evict_and_return(res, srv, cache_dir):
    conv = [{"role": "user", "content": long_prompt("a", 200)}]
    status, a1 = chat(srv, conv)
    res.check(status == 200, "conversation A answered")
    # B and C share nothing with any slot's conversation, so each takes the
    # least recently used slot: B the other one, C then A's
    for name in ("b", "c"):
        status, _ = chat(srv, [{"role": "user", "content": long_prompt(name, 200)}])
        res.check(status == 200, f"conversation {name.upper()} answered")
    evicted = []
    for n in os.listdir(cache_dir):
        if n.endswith(".kv"):
            kvc = parse_kvc(os.path.join(cache_dir, n))
            if kvc["reason"] == DS4_KVC_EVICT and b"a199" in kvc["text"]:
                evicted.append(n)
    res.check(len(evicted) == 1, f"A's slot saved to disk before C reused it: {evicted}")
    before = len(srv.trace_text())
    conv = conv + [{"role": "assistant", "content": a1["choices"][0]["message"]["content"]},
                   {"role": "user", "content": "and then?"}]
    status, _ = chat(srv, conv)
    res.check(status == 200, "conversation A's next turn answered")
    res.check("cache: disk cache" in srv.trace_text()[before:], "A's next turn restored from the disk cache")


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    cache_dir = tempfile.mkdtemp(prefix="ds4-batched-kv-")
    try:
        srv = Server("--batched-session", "2", "--kv-disk-dir", cache_dir, *FLAGS, ctx=8192)
        try:
            interleaving(res, srv)
            cancel_mid_prefill(res, srv, cache_dir)
            evict_and_return(res, srv, cache_dir)
            # last: the long prompt's save points fill the cache budget that
            # evict_and_return's checkpoint must survive in
            new_request_during_long_prefill(res, srv)
            res.check(srv.alive(), "server alive")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    res.done()


if __name__ == "__main__":
    main()
