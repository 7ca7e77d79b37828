"""ds4-server --batched-session N (issue 11): several requests served at
once, their decode steps batched, and every greedy answer byte-identical to
the same request served alone.

The reference answers come from a --batched-session 1 server, one request
at a time. Then 11 clients at once (openai and anthropic SDKs, streamed and
not, chat / completions / messages, some of them continuing a conversation
of an earlier request) go through a server with 4 slots; each answer must
equal its reference. A client that disconnects mid-stream frees its slot (the
server keeps answering), /health reports the slots, and a slot count whose
KV cannot fit is refused at start with one line. Greedy sampling
(temperature 0) makes the answers deterministic; the demo model's text is
meaningless, so only equality is checked."""
import concurrent.futures
import os
import socket
import subprocess
import json

import anthropic
import openai

from server_helper import MODEL, SERVER, Results, Server, demo_model_or_skip

NAME = "test_batched_sessions"
MAX_TOKENS = 12


def requests():
    """(kind, payload) pairs: prompts differ in length so prefill chunks and
    decode steps of different slots overlap."""
    out = []
    for i in range(10):
        words = " ".join(f"w{i}x{k}" for k in range(3 + 7 * (i % 5)))
        kind = ("chat", "chat_stream", "messages", "messages_stream", "completions")[i % 5]
        out.append((kind, f"request {i}: {words}"))
    # a conversation continued: its first turn is request 0's prompt
    out.append(("chat_turn2", out[0][1]))
    return out


def run(srv, kind, text):
    oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", timeout=300, max_retries=0)
    ac = anthropic.Anthropic(base_url=srv.base, api_key="none", timeout=300, max_retries=0)
    msgs = [{"role": "user", "content": text}]
    if kind == "chat":
        r = oc.chat.completions.create(model="deepseek-chat", messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
        return r.choices[0].message.content
    if kind == "chat_turn2":
        msgs = msgs + [{"role": "assistant", "content": "earlier answer"}, {"role": "user", "content": "and then?"}]
        r = oc.chat.completions.create(model="deepseek-chat", messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
        return r.choices[0].message.content
    if kind == "chat_stream":
        parts = []
        for ev in oc.chat.completions.create(model="deepseek-chat", messages=msgs, max_tokens=MAX_TOKENS,
                                             temperature=0, stream=True):
            if ev.choices and ev.choices[0].delta.content:
                parts.append(ev.choices[0].delta.content)
        return "".join(parts)
    if kind == "messages":
        r = ac.messages.create(model="deepseek-chat", messages=msgs, max_tokens=MAX_TOKENS,
                               extra_body={"temperature": 0})
        return "".join(b.text for b in r.content if b.type == "text")
    if kind == "messages_stream":
        with ac.messages.stream(model="deepseek-chat", messages=msgs, max_tokens=MAX_TOKENS,
                                extra_body={"temperature": 0}) as st:
            return "".join(st.text_stream)
    r = oc.completions.create(model="deepseek-chat", prompt=text, max_tokens=MAX_TOKENS, temperature=0)
    return r.choices[0].text


def abandon_stream(port):
    """Starts a long streamed request and disconnects after its first bytes."""
    body = json.dumps({"model": "deepseek-chat", "max_tokens": 2000, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "a long answer please"}]}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    s.recv(1)
    s.close()


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    reqs = requests()

    alone = Server("--batched-session", "1", ctx=1024)
    try:
        want = [run(alone, k, t) for k, t in reqs]
    finally:
        alone.stop()
    res.check(all(isinstance(w, str) for w in want), "reference answers")

    srv = Server("--batched-session", "4", ctx=1024)
    try:
        for _ in range(3):
            abandon_stream(srv.port)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(reqs)) as pool:
            got = list(pool.map(lambda kt: run(srv, *kt), reqs))
        for i, (w, g) in enumerate(zip(want, got)):
            res.check(w == g, f"request {i} ({reqs[i][0]}): batched answer {g!r} != alone {w!r}")
        # the abandoned streams left no slot behind: a new request is answered
        res.check(run(srv, "chat", reqs[1][1]) == want[1], "answer after abandoned streams")
        status, _, body = srv.request("GET", "/health")
        health = json.loads(body)
        res.check(status == 200 and health.get("slots") == 4 and health.get("slots_busy") == 0,
                  f"/health reports 4 idle slots: {health}")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()

    # more sessions than memory: refused at start, one line
    r = subprocess.run([SERVER, "-m", MODEL, "--port", "0", "--ctx", str(1 << 24), "--batched-session", "256"],
                       capture_output=True, text=True, timeout=120)
    lines = [l for l in r.stderr.splitlines() if l.startswith("ds4-server:")]
    res.check(r.returncode != 0 and any("need" in l and "GiB" in l and "--batched-session" in l for l in lines),
              f"oversized slots refused with a clear line: rc {r.returncode}, {r.stderr[-300:]!r}")
    res.done()


if __name__ == "__main__":
    main()
