"""ds4-server FIFO queue (server-api.md 1.4, 1.7): streamed requests waiting
behind another one get keep-alives in their family's dialect before their
first real event, and a queued client that disconnects leaves the queue
(its job never runs, the trace says so). Waiting costs nothing: the
connection threads of queued requests use almost no CPU (each used to wake
all the others at every wake-up, a storm that took cores from the slots).

Not timing-fragile: the request holding the worker is scripted to generate
far longer than any wait here and is ended by the test closing its socket
once the queued clients have seen what they should; every wait is for an
event, with a generous deadline.  Its client keeps reading, at a bounded
pace, on a thread: a client that stops reading is dropped once a write has
stalled for two seconds (docs/architecture.md), which would free the worker
early on a machine fast enough to fill the socket buffers within the test."""
import json
import os
import socket
import tempfile
import threading
import time

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_server_queue"


def open_stream(port, path, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def read_until(s, buf, marker, deadline_s=90):
    """Reads until `marker` is in buf (returned) or the peer closes / the deadline passes."""
    deadline = time.time() + deadline_s
    while marker not in buf and time.time() < deadline:
        try:
            b = s.recv(65536)
        except OSError:
            break
        if not b:
            break
        buf += b
    return buf


def keep_reading(s, stop):
    """Reads s slowly until stop is set or the peer closes: enough to keep the
    server's writes moving, few enough bytes that the scripted output lasts."""
    s.settimeout(0.5)
    while not stop.is_set():
        try:
            if not s.recv(16384):
                return
        except socket.timeout:
            continue
        except OSError:
            return
        time.sleep(0.1)


def thread_ticks(pid):
    """{thread id: user + system clock ticks} of every thread of pid"""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return out


def sse_events(buf):
    """(event name or None, data or None, comment or None) per SSE block of a
    chunked stream body (chunk framing removed first)."""
    _, _, body = buf.partition(b"\r\n\r\n")
    text, out = b"", []
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16) if size.strip() else 0
        if n == 0:
            break
        text += rest[:n]
        body = rest[n + 2:]
    for block in text.decode().split("\n\n"):
        if not block:
            continue
        ev = {"event": None, "data": None, "comment": None}
        for line in block.split("\n"):
            if line.startswith(":"):
                ev["comment"] = line[1:].strip()
            elif line.startswith("event: "):
                ev["event"] = line[7:]
            elif line.startswith("data: "):
                ev["data"] = line[6:]
        out.append(ev)
    return out


def main():
    demo_model_or_skip(NAME)
    t = Results(NAME)
    script = tempfile.NamedTemporaryFile("w", prefix="ds4-queue-", suffix=".txt", delete=False)
    script.write("word " * 60000)
    script.close()
    srv = Server("--scripted-output", script.name, ctx=65536)
    p = srv.port
    try:
        # A holds the worker: its scripted output outlasts the test
        a = open_stream(p, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hold"}], "stream": True, "max_tokens": 100000})
        got_a = read_until(a, b"", b"word")
        t.check(b"word" in got_a, f"A generates {got_a[:200]}")
        stop_a = threading.Event()
        drain_a = threading.Thread(target=keep_reading, args=(a, stop_a))
        drain_a.start()

        threads_before = set(thread_ticks(srv.proc.pid))
        # B (Messages), C (Chat), D (Responses) queue behind A
        b = open_stream(p, "/v1/messages", {
            "model": "m", "max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "queued-anthropic-marker"}]})
        c = open_stream(p, "/v1/chat/completions", {
            "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": "queued-chat-marker"}]})
        d = open_stream(p, "/v1/responses", {"stream": True, "max_output_tokens": 3, "input": "queued-resp-marker"})
        # E queues, then its client goes away
        e = open_stream(p, "/v1/chat/completions", {
            "max_tokens": 3, "messages": [{"role": "user", "content": "leaver-marker"}]})
        e.close()

        got_b = read_until(b, b"", b"event: ping")
        got_c = read_until(c, b"", b'"role":"assistant"')
        got_d = read_until(d, b"", b"event: response.in_progress")
        # the queued requests' connection threads (new since A) over 2 s
        ticks0 = {tid: n for tid, n in thread_ticks(srv.proc.pid).items() if tid not in threads_before}
        time.sleep(2)
        ticks1 = thread_ticks(srv.proc.pid)
        used = sum(ticks1.get(tid, n) - n for tid, n in ticks0.items()) / os.sysconf("SC_CLK_TCK")
        t.check(len(ticks0) >= 3 and used < 0.2,
                f"{len(ticks0)} queued connection threads used {used:.2f} s of CPU in 2 s of waiting")
        deadline = time.time() + 60
        while "left the queue" not in srv.trace_text() and time.time() < deadline:
            time.sleep(0.1)
        t.check("queued request left the queue: client went away" in srv.trace_text(),
                "the disconnected queued client leaves the queue")

        # all of that happened while A still held the worker
        t.check(b"message_start" not in got_b and b"content_block" not in got_b and
                sse_events(got_b)[:2] == [{"event": None, "data": None, "comment": "queued"},
                                          {"event": "ping", "data": '{"type":"ping"}', "comment": None}],
                f"queued Messages stream: comment and ping first {got_b[-300:]}")
        evc = sse_events(got_c)
        t.check(got_c.startswith(b"HTTP/1.1 200") and len(evc) >= 2 and evc[0]["comment"] == "queued" and
                json.loads(evc[1]["data"])["choices"][0]["delta"] == {"role": "assistant", "content": ""},
                f"queued Chat stream: comment then the role chunk {got_c[-300:]}")
        evd = sse_events(got_d)
        t.check([x["event"] for x in evd] == [None, "response.created", "response.in_progress"] and
                evd[0]["comment"] == "queued", f"queued Responses stream: created, in_progress {got_d[-300:]}")

        # A ends (its client leaves); B, C, D then run in order and finish
        stop_a.set()
        drain_a.join()
        a.close()
        got_b = read_until(b, got_b, b"event: message_stop")
        got_c = read_until(c, got_c, b"data: [DONE]")
        got_d = read_until(d, got_d, b"event: response.incomplete")
        for s in (b, c, d):
            s.close()
        evb = [x["event"] for x in sse_events(got_b) if x["event"]]
        first = evb.index("message_start") if "message_start" in evb else -1
        t.check(first > 0 and all(x == "ping" for x in evb[:first]) and evb[-1] == "message_stop",
                f"Messages: pings, then a whole message {evb}")
        evc = [x for x in sse_events(got_c) if x["data"]]
        roles = [x for x in evc if x["data"] != "[DONE]" and "role" in json.loads(x["data"])["choices"][0]["delta"]]
        t.check(len(roles) == 1 and evc[-1]["data"] == "[DONE]", f"Chat: one role chunk, then [DONE] {got_c[-300:]}")
        evd = [x["event"] for x in sse_events(got_d) if x["event"]]
        t.check(evd.count("response.created") == 1 and evd[-1] == "response.incomplete",
                f"Responses: one created, incomplete at max_output_tokens {evd}")

        trace = srv.trace_text()
        t.check("queued-anthropic-marker" in trace and "queued-chat-marker" in trace and "queued-resp-marker" in trace,
                "the queued requests ran")
        t.check("leaver-marker" not in trace, "the job of the client that left never ran")

        # the server keeps serving
        st, _, body = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "after"}], "max_tokens": 2})
        t.check(st == 200 and json.loads(body)["object"] == "chat.completion", "served afterwards")
    finally:
        srv.stop()
        os.unlink(script.name)
    t.done()


if __name__ == "__main__":
    main()
