"""ds4-server --batched-session N and a client that never reads (issue 11).

A raw-socket client with the smallest receive buffer sends a streamed chat
request with a long max_tokens and then reads nothing. The server caps each
connection's send buffer, so the socket fills within a few hundred tokens;
its writes then make no progress for the write-stall limit (2 s) and the
client is dropped. Meanwhile another client streams on the second slot.

Checks (ordering and state, never timing):
- the trace names the drop ("stopped reading"), and the other client's
  decode steps ran while the stalled slot was blocked (a long run of batch
  steps with one decode row after the two clients had decoded together);
- the other client is answered in full afterwards, and a new request too;
- /health shows every slot free again; the round is run twice and RSS grows
  less than 16 MiB over the second (the first touches the slots' KV);
- the stalled client's stream was cut (no terminating [DONE]);
- the disk KV cache holds only complete, CRC-valid files.
The waits are bounded polls of the server's state (generous bounds for a
loaded machine), not timing checks."""
import json
import re
import shutil
import socket
import tempfile
import threading

from server_helper import Results, Server, demo_model_or_skip, read_to_eof, wait_for
from test_batched_sessions import rss_kb
from test_kv_restart import FLAGS, check_cache_dir

NAME = "test_batched_stall"
STEP = re.compile(r"batch step (\d+): decode rows (\d+), prefill rows (\d+)")
DROPPED = "client stopped reading (a write stalled) and was dropped"
RSS_BOUND_KB = 16 * 1024


def request_bytes(port, body):
    data = json.dumps(body).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def stalled_client(port):
    """Connects with a tiny receive window and sends a long streamed request."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)   # the kernel rounds it up to its minimum
    s.connect(("127.0.0.1", port))
    s.sendall(request_bytes(port, {"model": "m", "max_tokens": 1800, "stream": True, "temperature": 0,
                                   "messages": [{"role": "user", "content": "never read this"}]}))
    return s


def health(srv):
    status, _, body = srv.request("GET", "/health")
    return json.loads(body) if status == 200 else {}


def decode_rows_by_line(lines):
    return [(i, int(m.group(2))) for i, line in enumerate(lines) for m in [STEP.search(line)] if m]


def longest_single_row_run(lines, upto):
    """The longest run of consecutive batch steps holding one decode row,
    after the first step that held both clients' rows and before line upto."""
    rows = [d for i, d in decode_rows_by_line(lines) if i < upto]
    first_pair = next((k for k, d in enumerate(rows) if d >= 2), len(rows))
    best = run = 0
    for d in rows[first_pair:]:
        run = run + 1 if d == 1 else 0
        best = max(best, run)
    return first_pair < len(rows), best


def stall_round(res, srv, cache_dir, label):
    """One client that never reads beside one that streams; see the module doc."""
    before = len(srv.trace_text().splitlines())
    stalled = stalled_client(srv.port)
    other = socket.create_connection(("127.0.0.1", srv.port), timeout=600)
    other.sendall(request_bytes(srv.port, {"model": "m", "max_tokens": 1200, "stream": True, "temperature": 0,
                                           "messages": [{"role": "user", "content": "keep streaming"}]}))
    other_data = []
    reader = threading.Thread(target=lambda: other_data.append(read_to_eof(other)))
    reader.start()

    def dropped_line():
        lines = srv.trace_text().splitlines()
        return next((i for i in range(before, len(lines)) if DROPPED in lines[i]), None)
    wait_for(lambda: dropped_line() is not None, f"{label}: the non-reading client is dropped", res)
    lines = srv.trace_text().splitlines()[before:]
    paired, run = longest_single_row_run(lines, (dropped_line() or len(lines) + before) - before)
    res.check(paired, f"{label}: both clients decoded together before the stall")
    # A write stalls for 2 s; a busy slot misses a step only while it takes
    # longer than the batcher's 2 ms grace to submit its next token.
    print(f"{label}: the other client decoded alone for {run} steps in a row while the stalled slot was blocked")
    res.check(run >= 10, f"{label}: the other client kept decoding during the stall ({run} steps in a row)")

    # the stalled slot is free again while the other client still streams
    wait_for(lambda: health(srv).get("slots_busy", 2) <= 1, f"{label}: the stalled slot is freed", res)
    reader.join(timeout=600)
    other.close()
    got = other_data[0] if other_data else b""
    res.check(got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in got,
              f"{label}: the other client got its whole stream")
    stalled.settimeout(60)
    try:
        cut = read_to_eof(stalled)
    except OSError:   # a reset: the server closed with our bytes unread, also a cut stream
        cut = b""
    stalled.close()
    res.check(b"data: [DONE]" not in cut, f"{label}: the stalled client's stream was cut")

    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "after"}]})
    res.check(status == 200 and json.loads(body)["choices"], f"{label}: a new request is answered")
    wait_for(lambda: health(srv).get("slots_busy") == 0, f"{label}: every slot is free", res)
    check_cache_dir(res, cache_dir, label)


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    cache_dir = tempfile.mkdtemp(prefix="ds4-stall-kv-")
    srv = Server("--batched-session", "2", "--kv-disk-dir", cache_dir, *FLAGS, ctx=2048)
    try:
        # The first round also touches the slots' preallocated KV pages, so
        # the second one measures what a dropped client leaves behind.
        stall_round(res, srv, cache_dir, "round 1")
        base_rss = rss_kb(srv.proc.pid)
        stall_round(res, srv, cache_dir, "round 2")
        grown = rss_kb(srv.proc.pid) - base_rss
        print(f"RSS over the second round: {grown:+d} kB")
        res.check(grown < RSS_BOUND_KB, f"RSS grew {grown} kB over a round (bound {RSS_BOUND_KB} kB)")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
        shutil.rmtree(cache_dir, ignore_errors=True)
    res.done()


if __name__ == "__main__":
    main()
