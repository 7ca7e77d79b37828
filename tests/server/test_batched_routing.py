#!/usr/bin/env python3
"""A conversation's next turn goes to the slot that holds it, even when the
client sends it before that slot's worker is idle again (issue 11, queue.h).

A client that has read an answer sends its next turn at once; the worker
that answered may still be doing its bookkeeping (disk saves, publishing
tool ids). DS4_TEST_SLOT_LINGER_GATE holds that window open: while the gate
file exists, a slot that has answered stays busy, and the test removes the
file once it has seen what it checks. So the window is as long as the test
needs on any machine (it used to be a fixed 1.5 s sleep: on a machine or a
load where the next turn came later than that, the race never happened and
the check passed whatever the queue did).

1. With --batched-session 2 the other slot is idle while the answering slot
   lingers, and taking it would re-prefill the whole conversation. The queue
   must instead wait for the answered slot (/health: the next turn stays
   queued beside an idle slot), so the next turn reuses the live KV: its
   usage reports the earlier turn's prompt as cached.
2. A request that shares nothing with the lingering slot's prompt must not
   wait for it: it is answered by the idle slot while the gate still keeps
   the first slot busy. (It is sent before the related turn: the queue is
   FIFO, so a request queued behind a turn that waits for the lingering
   slot waits too.) The related turn, sent next, goes to the slot that
   holds its conversation once the gate is gone."""
import json
import os
import tempfile
import threading

from server_helper import Results, Server, demo_model_or_skip, wait_for

NAME = "test_batched_routing"


def chat(srv, msgs, max_tokens=6):
    status, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs, "model": "m", "max_tokens": max_tokens, "temperature": 0})
    return status, json.loads(body)


def health(srv):
    status, _, body = srv.request("GET", "/health")
    return json.loads(body) if status == 200 else {}


def in_thread(fn):
    """Runs fn on a thread; returns (thread, list that gets fn's result)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def cached(answer):
    return answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    fd, gate = tempfile.mkstemp(prefix="ds4-linger-gate-")
    os.close(fd)
    os.environ["DS4_TEST_SLOT_LINGER_GATE"] = gate
    srv = Server("--batched-session", "2", ctx=4096)
    try:
        first = [{"role": "user", "content": " ".join(f"w{k}" for k in range(120))}]
        status, a = chat(srv, first)        # slot X answers, then lingers while the gate exists
        res.check(status == 200, "first turn answered")
        prompt1 = a["usage"]["prompt_tokens"]
        nxt = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                       {"role": "user", "content": "and then?"}]
        t, done = in_thread(lambda: chat(srv, nxt))
        wait_for(lambda: done or health(srv).get("queued") == 1, "the next turn is queued or answered", res)
        h = health(srv)
        res.check(not done and h.get("queued") == 1 and h.get("slots_busy") == 1,
                  f"the next turn waits for the lingering slot beside an idle one: /health {h}")
        os.unlink(gate)                     # slot X may go idle now
        t.join(120)
        res.check(done and done[0][0] == 200, "next turn answered")
        if done and done[0][0] == 200:
            b = done[0][1]
            res.check(cached(b) >= prompt1 - 8,
                      f"the next turn reused the live session: {cached(b)} of {b['usage']['prompt_tokens']} prompt "
                      f"tokens cached, the first turn had {prompt1}")

        # an unrelated request is not held back by a lingering slot; the gate
        # is put back once both slots are idle (a slot that answered just now
        # must not find it before it has gone idle)
        wait_for(lambda: health(srv).get("slots_busy") == 0, "both slots idle", res)
        open(gate, "w").close()
        status, c = chat(srv, first, max_tokens=2)       # slot X answers, then lingers
        res.check(status == 200, "the first conversation answered again")
        t, done = in_thread(lambda: chat(srv, [{"role": "user", "content": "zzz unrelated"}], max_tokens=2))
        t.join(120)
        res.check(done and done[0][0] == 200, "the unrelated request is answered")
        h = health(srv)
        res.check(os.path.exists(gate) and h.get("slots_busy", 0) >= 1,
                  f"... while the first slot still lingered: /health {h}")
        related = first + [{"role": "user", "content": "x"}]
        t, done = in_thread(lambda: chat(srv, related))
        wait_for(lambda: done or health(srv).get("queued") == 1, "the related request is queued or answered", res)
        os.unlink(gate)
        t.join(120)
        res.check(done and done[0][0] == 200, "the related request was answered after the linger")
        if done and done[0][0] == 200 and status == 200:
            res.check(cached(done[0][1]) >= c["usage"]["prompt_tokens"] - 8,
                      f"the related request reused its conversation's slot: {cached(done[0][1])} cached")
        res.check(srv.alive(), "server alive")
    finally:
        if os.path.exists(gate):
            os.unlink(gate)                 # else the slots linger until the server stops
        srv.stop()
    res.done()


if __name__ == "__main__":
    main()
