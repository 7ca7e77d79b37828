"""Recorded pipeline frames sent again (src/dist/dist.c, src/dist/dist_proto.h): a
ds4-server coordinator and one ./ds4 worker on loopback, the link between
them recorded by a packet capture on lo (the frames exactly as the
coordinator sealed them, nothing made up here):

- replayed to the same worker, a recorded WORK frame of a request served
  and the recorded ROUTE frame are dropped as replays;
- the worker killed and restarted (a new registration): the ROUTE frame
  recorded from the first one, sent to the new worker's data port, fails
  its seal and is dropped, and requests through the coordinator keep being
  answered (before the fix the new worker took the old route and every
  request after it failed with "work for route X, this worker is on route
  Y");
- a worker put on another route (a ROUTE of a new id sealed for its
  registration, as a second party holding the secret could send): it
  answers the coordinator's next work WRONG_ROUTE and the coordinator forms
  its route again, so the requests are answered.
Needs CAP_NET_RAW for the capture (root, as CI runs): without it the test
says so and exits 77."""
import hashlib
import hmac
import os
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "server"))
sys.path.insert(0, HERE)
from server_helper import ROOT, MODEL, Server, Results, demo_model_or_skip, free_port  # noqa: E402
import dist_wire as wire  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SECRET = "replay-secret"
HELLO, WORK, ROUTE = 1, 4, 6   # frame types (dist_proto.h)
VERSION = 7


def start_worker(port):
    return subprocess.Popen([DS4, "-t", "1", "-m", MODEL, "--role", "worker", "--layers", "3:output",
                             "--coordinator", "127.0.0.1", str(port), "--dist-secret", SECRET, "--ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def chat(srv, text):
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": text}]})
    return status, body.decode(errors="replace")[-300:]


def frame_type(msg):
    return int.from_bytes(msg[6:8], "little") if msg[:4] == b"DS4P" else None


def route_home(frame):
    """The home address and nonce of a sealed ROUTE frame (dist_proto.h)."""
    at = 8 + 8 + 4
    n = struct.unpack("<H", frame[at:at + 2])[0]
    at += 2 + n + 16
    n = struct.unpack("<H", frame[at:at + 2])[0]
    return frame[at + 2:at + 2 + n], frame[at + 2 + n:at + 2 + n + 16]


def main():
    demo_model_or_skip("test_dist_replay")
    cap = wire.LoopbackCapture()
    if not cap.start():
        print("test_dist_replay: SKIPPED: capturing loopback traffic needs CAP_NET_RAW (run as root)")
        return 77
    res = Results("test_dist_replay")
    port = free_port()
    worker = start_worker(port)
    lines = wire.Lines(worker)
    srv = Server("--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(port),
                 "--dist-secret", SECRET, "--dist-wait", "30", "--dist-reply-timeout", "20")
    try:
        res.check(lines.wait_for("registered"), "the worker registers: %r" % lines.text()[-300:])
        data_port = min(wire.wait_ports(worker.pid, 1) or {0})
        cap.ports.update({data_port, port})   # the link, and the registrations
        first = chat(srv, "first question")
        res.check(first[0] == 200, "through the route: %s %s" % first)
        # the coordinator's connection to the worker's data port: its header, then the ROUTE, then the work
        # (a bounded wait: the capture thread may still be reading the last packets)
        for _ in range(100):
            recorded = [m for s in cap.streams_to(data_port) if s[:8] == wire.sp_header(wire.PUSH)
                        for m in wire.messages(s)]
            if any(frame_type(m) == ROUTE for m in recorded) and any(frame_type(m) == WORK for m in recorded):
                break
            time.sleep(0.1)
        routes = [m for m in recorded if frame_type(m) == ROUTE]
        works = [m for m in recorded if frame_type(m) == WORK]
        res.check(len(routes) == 1 and works, "recorded %d ROUTE and %d WORK frames on the link (%s)"
                  % (len(routes), len(works), [frame_type(m) for m in recorded]))
        if not routes or not works:
            return res.done()

        # the same worker: both are replays
        res.check(wire.push(data_port, works[0]) and lines.wait_for("dropped a replayed frame (request"),
                  "a recorded WORK frame sent again is dropped: %r" % lines.text()[-300:])
        res.check(wire.push(data_port, routes[0]) and lines.wait_for("dropped a replayed ROUTE frame"),
                  "the recorded ROUTE frame sent again is dropped: %r" % lines.text()[-300:])
        res.check(chat(srv, "second question")[0] == 200, "the route serves on after the replays")

        # a new registration: the old ROUTE frame is not for it
        worker.kill()
        worker.wait()
        worker = start_worker(port)
        lines = wire.Lines(worker)
        res.check(lines.wait_for("registered"), "the restarted worker registers: %r" % lines.text()[-300:])
        new_port = min(wire.wait_ports(worker.pid, 1) or {0})
        answers = [chat(srv, "third question") for _ in range(2)]   # the first may find the old hop gone
        res.check(answers[-1][0] == 200, "the restarted worker serves: %s" % answers)
        res.check(wire.push(new_port, routes[0]) and lines.wait_for("dropped a frame that fails the seal", 10),
                  "the old registration's ROUTE frame fails the new worker's seal: %r" % lines.text()[-300:])
        after = [chat(srv, q) for q in ("fourth question", "fifth question")]
        res.check(all(a[0] == 200 for a in after), "requests after the replay are answered: %s" % after)

        # a worker put on another route by someone holding the secret (a
        # ROUTE of a new id sealed for this registration, made here from the
        # registration nonce in the recorded HELLO and the home in the
        # recorded ROUTE): it answers the coordinator's work with
        # WRONG_ROUTE and the coordinator forms its route again
        hellos = [m[4:] for s in cap.streams_to(port) if s[:8] == wire.sp_header(wire.REQ)
                  for m in wire.messages(s) if frame_type(m[4:]) == HELLO and b":%d" % new_port in m]
        home, home_nonce = route_home(routes[0])
        res.check(hellos and home, "recorded the new worker's HELLO (%d) and the route's home (%r)" % (len(hellos), home))
        if hellos and home:
            nonce = hellos[0][8 + 16:8 + 32]
            key = hmac.new(SECRET.encode(), b"ds4 link" + nonce, hashlib.sha1).digest()
            other = (b"DS4P" + struct.pack("<HHQI", VERSION, ROUTE, int.from_bytes(os.urandom(8), "little"), 8)
                     + struct.pack("<H", 0) + bytes(16) + struct.pack("<H", len(home)) + home + home_nonce)
            res.check(wire.push(new_port, other + hmac.new(key, other, hashlib.sha1).digest()),
                      "a ROUTE of another route sent to the worker")
            moved = [chat(srv, q) for q in ("sixth question", "seventh question")]
            res.check(all(a[0] == 200 for a in moved), "the coordinator forms its route again: %s" % moved)
        res.check(worker.poll() is None and srv.alive(), "worker and coordinator stay up")
    finally:
        cap.close()
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        srv.stop()
    res.done()


if __name__ == "__main__":
    main()
