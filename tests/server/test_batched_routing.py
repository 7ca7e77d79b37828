#!/usr/bin/env python3
"""A conversation's next turn goes to the slot that holds it, even when the
client sends it before that slot's worker is idle again (issue 11, queue.h).

A client that has read an answer sends its next turn at once; the worker
that answered may still be doing its bookkeeping (disk saves, publishing
tool ids). DS4_TEST_SLOT_LINGER_MS widens that window to 1.5 s so the race
happens every time: with --batched-session 2 the other slot is idle, and
taking it would re-prefill the whole conversation. The queue must instead
wait for the answered slot, so the next turn reuses the live KV: its
usage reports the earlier turn's prompt as cached. A request that shares
nothing with the lingering slot's body must not wait for it: it is served by
the idle slot while the first slot still lingers (checked by order, not
timing: its answer arrives before the lingering slot has taken any job)."""
import json
import os
import threading

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_batched_routing"


def chat(srv, msgs, max_tokens=6):
    # "messages" first: the queue routes by the longest common body prefix
    status, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs, "model": "m", "max_tokens": max_tokens, "temperature": 0})
    return status, json.loads(body)


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    os.environ["DS4_TEST_SLOT_LINGER_MS"] = "1500"
    srv = Server("--batched-session", "2", ctx=4096)
    try:
        first = [{"role": "user", "content": " ".join(f"w{k}" for k in range(120))}]
        status, a = chat(srv, first)
        res.check(status == 200, "first turn answered")
        prompt1 = a["usage"]["prompt_tokens"]
        # sent while the answering slot still lingers (1.5 s)
        nxt = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                       {"role": "user", "content": "and then?"}]
        status, b = chat(srv, nxt)
        res.check(status == 200, "next turn answered")
        cached = b["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        res.check(cached >= prompt1 - 8,
                  f"the next turn reused the live session: {cached} of {b['usage']['prompt_tokens']} prompt tokens "
                  f"cached, the first turn had {prompt1}")

        # an unrelated request is not held back by a lingering slot
        done = []
        status, c = chat(srv, first, max_tokens=2)       # slot X answers, then lingers
        t = threading.Thread(target=lambda: done.append(chat(srv, first + [{"role": "user", "content": "x"}])))
        t.start()                                         # related: waits for X
        status2, d = chat(srv, [{"role": "user", "content": "zzz unrelated"}], max_tokens=2)
        res.check(status == 200 and status2 == 200, "both answered")
        res.check(not done, "the unrelated request was served by the idle slot while the related one still waited")
        t.join(60)
        res.check(done and done[0][0] == 200, "the related request was answered after the linger")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
    res.done()


if __name__ == "__main__":
    main()
