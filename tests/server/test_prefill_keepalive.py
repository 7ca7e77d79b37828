"""A streamed request whose prefill takes long gets keep-alives while it is
prefilled, so a client's stream idle timeout does not end it: an SSE comment
(": prefill") and its family's own keep-alive event every 5 s, then the
whole answer.

The prefill is held by the server's test gate (DS4_TEST_PREFILL_GATE: while
the file exists the prefill waits, sending what a long prefill sends), so
the test needs no prompt that takes seconds to prefill. Per family, with
the gate in place the stream shows, before any content:
  Anthropic Messages: message_start, then ": prefill" and an `event: ping`;
  OpenAI Chat Completions: the role chunk, then ": prefill";
  OpenAI Responses: response.created and response.in_progress, then
  ": prefill" and another response.in_progress event.
Then the gate is removed and the scripted answer arrives whole. Waits are
for events with generous deadlines, never for a fixed time."""
import json
import os
import socket
import tempfile
import time

from server_helper import Results, Server, demo_model_or_skip, write_temp_file

NAME = "test_prefill_keepalive"
demo_model_or_skip(NAME)
res = Results(NAME)
ANSWER = "Hello from the scripted model."


def open_stream(port, path, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def read_until(s, buf, done, deadline_s=60):
    """Reads until done(buf), the peer closes or the deadline passes."""
    deadline = time.time() + deadline_s
    while not done(buf) and time.time() < deadline:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        if not b:
            break
        buf += b
    return buf


def sse_events(buf):
    """(event, data, comment) per SSE block of a chunked body."""
    _, _, body = buf.partition(b"\r\n\r\n")
    text = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16) if size.strip() else 0
        if n == 0:
            break
        text += rest[:n]
        body = rest[n + 2:]
    out = []
    for block in text.decode().split("\n\n"):
        ev = {"event": None, "data": None, "comment": None}
        for line in block.split("\n"):
            if line.startswith(":"):
                ev["comment"] = line[1:].strip()
            elif line.startswith("event: "):
                ev["event"] = line[7:]
            elif line.startswith("data: "):
                ev["data"] = line[6:]
        if block:
            out.append(ev)
    return out


CASES = [
    ("Messages", "/v1/messages", {"model": "m", "max_tokens": 32, "stream": True,
                                  "messages": [{"role": "user", "content": "Say hello to Messages."}]},
     lambda ev: ev["event"] == "ping",
     lambda ev: ev["event"] == "content_block_start",
     lambda evs: "".join(json.loads(e["data"])["delta"].get("text", "") for e in evs
                         if e["event"] == "content_block_delta")),
    ("Chat", "/v1/chat/completions", {"max_tokens": 32, "stream": True,
                                      "messages": [{"role": "user", "content": "Say hello to Chat."}]},
     lambda ev: False,
     lambda ev: ev["data"] not in (None, "[DONE]") and
     (json.loads(ev["data"])["choices"] or [{}])[0].get("delta", {}).get("content"),
     lambda evs: "".join((json.loads(e["data"])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                         for e in evs if e["data"] not in (None, "[DONE]"))),
    ("Responses", "/v1/responses", {"max_output_tokens": 32, "stream": True, "input": "Say hello to Responses."},
     lambda ev: ev["event"] == "response.in_progress",
     lambda ev: ev["event"] == "response.output_item.added",
     lambda evs: "".join(json.loads(e["data"])["delta"] for e in evs if e["event"] == "response.output_text.delta")),
]

# Responses' stream opens with one response.in_progress of its own: a
# keep-alive is a second one
KEEP = {"Messages": 1, "Responses": 2}
script = write_temp_file(f"Greeting.</think>{ANSWER}")
with tempfile.TemporaryDirectory(prefix="ds4-keepalive-") as tmp:
    gate = os.path.join(tmp, "prefill-gate")
    os.environ["DS4_TEST_PREFILL_GATE"] = gate
    srv = Server("--scripted-output", script)
    try:
        for label, path, body, family_keepalive, content, text_of in CASES:
            open(gate, "w").close()
            s = open_stream(srv.port, path, body)
            # held in prefill: keep-alives arrive (the family's own one after the comment)
            head = read_until(s, b"", lambda b: b": prefill\n\n" in b and
                              (label == "Chat" or len([e for e in sse_events(b) if family_keepalive(e)]) >= KEEP[label]))
            os.unlink(gate)
            buf = read_until(s, head, lambda b: False)
            s.close()
            evs = sse_events(buf)
            first_content = next((k for k, e in enumerate(evs) if content(e)), len(evs))
            comments = [k for k, e in enumerate(evs) if e["comment"] == "prefill"]
            res.check(buf.startswith(b"HTTP/1.1 200") and comments and comments[0] < first_content,
                      f"{label}: ': prefill' comments before the first content: {[e for e in evs[:6]]}")
            if label != "Chat":
                own = [k for k, e in enumerate(evs) if family_keepalive(e) and k < first_content]
                res.check(len(own) >= KEEP[label], f"{label}: its own keep-alive events before the content: {len(own)}")
            res.check(text_of(evs) == ANSWER, f"{label}: the whole answer after the prefill: {text_of(evs)!r}")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
        os.unlink(script)
res.done()
