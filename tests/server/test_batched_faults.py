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
2. A request cancelled mid-prefill (its client hangs up) stops prefilling at
   the next chunk, frees its slot (the next request is answered, /health
   shows no busy slot) and leaves the disk KV cache with only complete,
   CRC-valid files.
3. An idle slot taken over by another conversation is first saved to the
   disk KV cache (an evict checkpoint holding that conversation), and when
   the conversation returns its next turn is restored from disk.
Greedy sampling makes the decoder deterministic, so the checks do too.

No check rests on how fast the machine (CPU or disk) is. With the cache
flags used here a prefill saves every 64 tokens, and every save takes the
cache directory's lock (kvdisk_index.h: an exclusive flock on <dir>/.lock,
which another process may hold). The test holds that lock (CacheLock) to
keep a long prompt from getting past its first save point while it hangs up
(2) or while a new request reaches its slot (1), and releases it after; the
decoder of (1) is given more tokens than it can emit during the long
prefill whatever the speeds (see interleaving). Each of (2) and the new
request of (1) runs on a server whose slots are still empty: a slot holding
an earlier conversation saves it (evict) before prefilling, which the held
lock would block before the first chunk."""
import contextlib
import fcntl
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


class CacheLock:
    """Holds the disk KV cache's directory lock while in the with-block:
    every save the server makes (prefill save points, evict, frontier saves)
    waits for it (kvdisk_index.h), and a slot waiting at a save point does
    not advance its prefill."""

    def __init__(self, cache_dir):
        self.path = os.path.join(cache_dir, ".lock")

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)   # closing the descriptor releases the flock


def server_saw_hangup(srv, client):
    """True once the kernel has delivered the client's FIN to the server's end
    of this connection (that socket is in CLOSE_WAIT): from then on the
    server's disconnect check (a poll for POLLRDHUP) sees the hang-up."""
    client_port = client.getsockname()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, remote, state = cols[1], cols[2], cols[3]
            if (int(local.rsplit(":", 1)[1], 16) == srv.port and int(remote.rsplit(":", 1)[1], 16) == client_port
                    and state == "08"):
                return True
    return False


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


# The decoder must still be decoding when the long prompt's prefill ends.
# That is not a race between CPU and disk speeds: a prefill stops at a save
# point every 64 tokens and a decoder saves on every 64-token frontier, both
# under the server's one disk-cache mutex, so while the long prompt saves
# (however slow the disk) the decoder gets at most to its next frontier and
# waits there: about 64 decode tokens per chunk, ~3600 for this prompt's 55
# chunks (an fsync slowed by 300 ms gets there: 3511 decode steps during the
# prefill, where the old budget of 3000 ran out before its end).
# 8000 tokens (the context holds them) leaves more than twice that. The
# greedy decoder does not stop early: it runs to the length limit.
DECODER_TOKENS = 8000


def interleaving(res, srv):
    decoder = post(srv.port, {"model": "m", "max_tokens": DECODER_TOKENS, "stream": True, "temperature": 0,
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


def new_request_during_long_prefill(res, srv, cache_dir):
    """A request arriving while another slot prefills a prompt of dozens of
    chunks starts its own prefill at the next step: it is answered before the
    long prompt's prefill ends, and no step ever left out a prompt's first
    slice that was already waiting (prefill waited 0).

    The long prompt is held at its first save point (the cache lock) until
    the new request has its slot, so the new request arrives during the
    prefill by construction; after that both advance one chunk per step, and
    the new request needs 5 chunks and 3 tokens where the long prompt has
    more than 120 chunks left. Runs on a fresh server (see the module doc)."""
    wait_for(lambda: health_idle(srv), "both slots idle", res)
    n_before = len(steps(srv)[0])
    short = {}

    def ask_short():
        short["status"], _, short["body"] = srv.request("POST", "/v1/chat/completions", {
            "model": "m", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": long_prompt("short", 120)}]}, timeout=600)
    asker = threading.Thread(target=ask_short)
    with CacheLock(cache_dir):
        long_client = post(srv.port, {"model": "m", "max_tokens": 2, "temperature": 0,
                                      "messages": [{"role": "user", "content": long_prompt("n", 3000)}]})
        wait_for(lambda: any(st[2] > 0 for st in steps(srv)[0][n_before:]), "the long prompt prefills", res)
        asker.start()
        wait_for(lambda: health(srv).get("slots_busy") == 2, "the new request has the other slot", res)
    asker.join(600)
    res.check(short.get("status") == 200, f"the new request is answered: {short.get('status')}")
    n_short = json.loads(short["body"])["usage"]["prompt_tokens"] if short.get("status") == 200 else -1

    def answered_line(lines):
        return next((i for i in range(len(lines)) if f"usage: prompt {n_short} " in lines[i]), None)

    def long_prompt_outcome():
        """After the new request's answer: a later step prefilling the long
        prompt (it was still prefilling), or the long prompt's own answer."""
        all_steps, lines = steps(srv)
        answered = answered_line(lines)
        if answered is None:
            return None
        if any(st[0] > answered and st[2] > 0 for st in all_steps[n_before:]):
            return "prefilling"
        if any("usage:" in l for l in lines[answered + 1:]):
            return "finished"
        return None
    wait_for(lambda: long_prompt_outcome() is not None, "the long prompt prefills on, or ends", res)
    res.check(long_prompt_outcome() == "prefilling",
              f"the new request finished while the long prompt was still prefilling: {long_prompt_outcome()}")
    long_client.close()     # the rest of the long prefill is not needed
    wait_for(lambda: health_idle(srv), "the long prompt's slot is freed", res)
    all_steps, lines = steps(srv)
    after = all_steps[n_before:]
    answered = answered_line(lines)
    prefills = sum(1 for st in after if st[2] > 0 and (answered is None or st[0] < answered))
    print(f"new request during a long prefill: {prefills} steps with prefill rows before its answer")
    res.check(all(st[3] == 0 and st[4] == 0 for st in after),
              f"a waiting decode token or first prompt slice was left out of a step: "
              f"{[st for st in after if st[3] or st[4]]}")


def health(srv):
    status, _, body = srv.request("GET", "/health")
    return json.loads(body) if status == 200 else {}


def health_idle(srv):
    return health(srv).get("slots_busy") == 0


def cancel_mid_prefill(res, srv, cache_dir):
    """The client hangs up while its prompt is held at its first save point
    (the cache lock, so its prefill cannot end first however fast the
    machine); once the lock is released the save completes and the
    disconnect check after that chunk stops the prefill: one chunk in all.
    Runs on a server whose slots are still empty (see the module doc)."""
    wait_for(lambda: health_idle(srv), "both slots idle", res)
    n_before = len(steps(srv)[0])
    with CacheLock(cache_dir):
        s = post(srv.port, {"model": "m", "max_tokens": 4, "temperature": 0,
                            "messages": [{"role": "user", "content": long_prompt("c", 3000)}]})
        # its first chunk has run; it now waits for the lock to save
        wait_for(lambda: any(st[2] > 0 for st in steps(srv)[0][n_before:]), "the cancelled prompt prefills", res)
        s.shutdown(socket.SHUT_RDWR)
        wait_for(lambda: server_saw_hangup(srv, s), "the server's end of the connection sees the hang-up", res)
        s.close()
    wait_for(lambda: "client went away during prefill" in srv.trace_text(), "the prefill notices the hang-up", res)
    wait_for(lambda: health_idle(srv), "its slot is freed", res)
    chunks = sum(1 for st in steps(srv)[0][n_before:] if st[2] > 0)
    res.check(chunks == 1, f"the cancelled prompt stopped at the first chunk after the hang-up ({chunks} chunks)")
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


@contextlib.contextmanager
def batched_server(res):
    """A fresh two-slot server with its own disk KV cache: (server, cache dir)."""
    cache_dir = tempfile.mkdtemp(prefix="ds4-batched-kv-")
    try:
        srv = Server("--batched-session", "2", "--kv-disk-dir", cache_dir, *FLAGS, ctx=8192)
        try:
            yield srv, cache_dir
            res.check(srv.alive(), "server alive")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    with batched_server(res) as (srv, cache_dir):
        cancel_mid_prefill(res, srv, cache_dir)     # first: its slots must be empty
        interleaving(res, srv)
        evict_and_return(res, srv, cache_dir)
    # its own server: empty slots, and a cache whose budget the long prompt's
    # save points may fill without touching evict_and_return's checkpoint
    with batched_server(res) as (srv, cache_dir):
        new_request_during_long_prefill(res, srv, cache_dir)
    res.done()


if __name__ == "__main__":
    main()
