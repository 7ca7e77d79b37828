"""ds4-server --batched-session N (issue 11): several requests served at
once, their decode steps batched, and every greedy answer byte-identical to
the same request served alone.

The reference answers come from a --batched-session 1 server, one request
at a time. Then 16 clients at once (openai and anthropic SDKs, streamed and
not, chat / completions / messages, some of them continuing a conversation
of an earlier request) go through a server with 4 slots; each answer must
equal its reference. A client that disconnects mid-stream frees its slot (the
server keeps answering), /health and /metrics (Prometheus text: every
sample line parses, the counters add up to what the test sent) report the
slots, and a slot count whose
KV cannot fit is refused at start with one line. Tool calls: the SDK
test's scripted tool-call flows (exact DSML replay, live continuations by
id, streamed tool calls, Responses and Anthropic tool turns) run three at a
time on a 3-slot server. Greedy sampling
(temperature 0) makes the answers deterministic; the demo model's text is
meaningless, so only equality is checked."""
import concurrent.futures
import json
import os
import re
import socket
import subprocess

import anthropic
import openai

from server_helper import MODEL, SERVER, Results, Server, demo_model_or_skip, read_to_eof, write_temp_file
from test_server_sdk import SCRIPT, scripted_server_tests

NAME = "test_batched_sessions"
MAX_TOKENS = 12


def requests():
    """(kind, payload) pairs: prompts differ in length so prefill chunks and
    decode steps of different slots overlap."""
    out = []
    for i in range(15):
        words = " ".join(f"w{i}x{k}" for k in range(3 + 7 * (i % 5)))
        kind = ("chat", "chat_stream", "messages", "messages_stream", "completions")[i % 5]
        out.append((kind, f"request {i}: {words}"))
    # a conversation continued: its first turn is request 0's prompt
    out.append(("chat_turn2", out[0][1]))
    assert len(out) == 16  # the load: 16 clients through 4 slots
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
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    s.recv(1)
    s.close()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? '
                    r'(-?[0-9.e+-]+|NaN|[+-]Inf)$')


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def storm(port, n):
    """n clients at once: a third hang up right after sending, a third after
    the first bytes of their stream, a third read their answer (one never
    reads until the end). Returns how many complete answers came back."""
    def client(i):
        body = json.dumps({"model": "m", "max_tokens": 4, "stream": i % 2 == 0, "temperature": 0,
                           "messages": [{"role": "user", "content": f"storm {i}"}]}).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=300)
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        if i % 3 == 1:
            s.recv(1)
        if i % 3 != 2:
            s.close()
            return 0
        data = read_to_eof(s)
        s.close()
        return 1 if data.startswith(b"HTTP/1.1 200") else 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        return sum(pool.map(client, range(n)))


def metrics(srv):
    """{name or name{labels}: value}; None when a line is not Prometheus text."""
    status, headers, body = srv.request("GET", "/metrics")
    if status != 200 or not headers.get("Content-Type", "").startswith("text/plain"):
        return None
    out = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = SAMPLE.match(line)
        if not m:
            print(f"bad metrics line: {line!r}")
            return None
        out[m.group(1) + (m.group(2) or "")] = float(m.group(4))
    return out


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
        # 64 clients at once, most of them hanging up: every reader answered,
        # the server keeps serving, its memory back near where it was
        base_rss = rss_kb(srv.proc.pid)
        answered = storm(srv.port, 64)
        res.check(answered == 21, f"storm: {answered} of 21 reading clients answered")
        grown = rss_kb(srv.proc.pid) - base_rss
        res.check(grown < 32 * 1024, f"RSS grew {grown} kB over a 64-client storm")
        # the abandoned streams left no slot behind: a new request is answered
        res.check(run(srv, "chat", reqs[1][1]) == want[1], "answer after abandoned streams")
        status, _, body = srv.request("GET", "/health")
        health = json.loads(body)
        res.check(status == 200 and health.get("slots") == 4 and health.get("slots_busy") == 0,
                  f"/health reports 4 idle slots: {health}")
        m = metrics(srv)
        res.check(m is not None, "/metrics is Prometheus text")
        m = m or {}
        n_chat = sum(1 for k, _ in reqs if k.startswith("chat")) + 1
        chat_ok = m.get('ds4_requests_total{endpoint="/v1/chat/completions",status="200"}', 0)
        res.check(chat_ok >= n_chat, f"chat requests counted: {chat_ok} < {n_chat}")
        res.check(m.get('ds4_requests_total{endpoint="/v1/messages",status="200"}', 0) >= 4, "messages counted")
        res.check(m.get("ds4_slots") == 4 and m.get("ds4_slots_busy") == 0 and m.get("ds4_queue_depth") == 0,
                  "slot gauges")
        res.check(m.get("ds4_generated_tokens_total", 0) > 0 and m.get("ds4_decode_tokens_total", 0) > 0 and
                  m.get("ds4_prefill_tokens_total", 0) > 0 and m.get("ds4_kv_bytes", 0) > 0, "token counters")
        res.check(m.get('ds4_prompt_reuse_total{how="exact token prefix"}', 0) +
                  m.get('ds4_prompt_reuse_total{how="common token prefix"}', 0) +
                  m.get('ds4_prompt_reuse_total{how="live text prefix"}', 0) > 0, "prefix reuse counted")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()

    script = write_temp_file(SCRIPT)
    try:
        srv = Server("--scripted-output", script, "--batched-session", "3", ctx=1024)
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
                list(pool.map(lambda _: scripted_server_tests(res, srv), range(3)))
            res.check(srv.alive(), "scripted server alive")
        finally:
            srv.stop()
    finally:
        os.unlink(script)

    # more sessions than memory: refused at start, one line
    r = subprocess.run([SERVER, "-m", MODEL, "--port", "0", "--ctx", str(1 << 24), "--batched-session", "256"],
                       capture_output=True, text=True, timeout=120)
    lines = [l for l in r.stderr.splitlines() if l.startswith("ds4-server:")]
    res.check(r.returncode != 0 and any("need" in l and "GiB" in l and "--batched-session" in l for l in lines),
              f"oversized slots refused with a clear line: rc {r.returncode}, {r.stderr[-300:]!r}")
    res.done()


if __name__ == "__main__":
    main()
