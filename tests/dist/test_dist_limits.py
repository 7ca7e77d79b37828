"""Receive limits on the pipeline's NNG ports (src/dist/dist.c): someone who can
reach them but holds no secret cannot make a process buffer big messages.
A ds4-server coordinator (prefill chunks of 8 tokens) and one ./ds4 worker
on loopback serve a request; then raw connections to the worker's data
port and to each of the coordinator's pipeline ports (registration and
results), each speaking NNG's SP-over-TCP header for the port's protocol,
claim a 1 GiB message and send 32 MiB of it. Every process's resident
memory (VmRSS) stays within 64 MiB of what it was before (without limits
NNG buffers every byte sent: 6 connections x 32 MiB each), the pipeline
serves the next request, and both processes stay up."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "server"))
sys.path.insert(0, HERE)
from server_helper import ROOT, MODEL, Server, Results, demo_model_or_skip, free_port  # noqa: E402
import dist_wire as wire  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SECRET = "limits-secret"
CONNS, CLAIM, SEND, BOUND_KIB = 6, 1 << 30, 32 << 20, 64 << 10


def chat(srv, text):
    status, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": text}]})
    return status, body.decode(errors="replace")[-300:]


def flood(port, proto, conns):
    """A connection claiming a CLAIM-byte message, SEND bytes of it sent (or
    as many as the peer took before it closed); kept open in conns."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        conns.append(s)
        s.sendall(wire.sp_header(proto))
        wire_peer = s.recv(8)
        if len(wire_peer) < 8:
            return
        s.sendall(CLAIM.to_bytes(8, "big"))
        block = bytes(1 << 20)
        for _ in range(SEND // len(block)):
            s.sendall(block)
    except OSError:
        pass   # the peer refused the claim and closed


def rss_peak(pid, base, tries=30):
    """The largest VmRSS seen over a few samples (the last bytes sent may
    still be on their way into the process)."""
    peak = base
    for _ in range(tries):
        peak = max(peak, wire.rss_kib(pid))
        time.sleep(0.1)
    return peak


def main():
    demo_model_or_skip("test_dist_limits")
    res = Results("test_dist_limits")
    port = free_port()
    worker = subprocess.Popen([DS4, "-t", "1", "-m", MODEL, "--role", "worker", "--layers", "3:output",
                               "--coordinator", "127.0.0.1", str(port), "--dist-secret", SECRET, "--ctx", "2048"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    srv = Server("--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(port),
                 "--dist-secret", SECRET, "--dist-wait", "30", "--dist-prefill-chunk", "8")
    conns = []
    try:
        res.check(chat(srv, "first question")[0] == 200, "through the route before the flood")
        data_ports = wire.wait_ports(worker.pid, 1)
        coord_ports = wire.listening_ports(srv.proc.pid) - {srv.port}
        res.check(len(data_ports) == 1 and port in coord_ports and len(coord_ports) == 2,
                  "ports: worker %s, coordinator %s" % (data_ports, coord_ports))
        targets = [(worker.pid, p, wire.PUSH) for p in data_ports]
        targets += [(srv.proc.pid, p, wire.REQ if p == port else wire.PUSH) for p in coord_ports]
        base = {pid: wire.rss_kib(pid) for pid in (worker.pid, srv.proc.pid)}
        threads = [threading.Thread(target=flood, args=(p, proto, conns)) for _, p, proto in targets
                   for _ in range(CONNS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for pid, name in ((worker.pid, "worker"), (srv.proc.pid, "coordinator")):
            peak = rss_peak(pid, base[pid])
            res.check(peak - base[pid] < BOUND_KIB, "%s: VmRSS %d KiB -> %d KiB under %d connections claiming %d MiB"
                      % (name, base[pid], peak, CONNS * sum(t[0] == pid for t in targets), CLAIM >> 20))
        res.check(chat(srv, "second question")[0] == 200, "through the route after the flood")
        res.check(worker.poll() is None and srv.alive(), "worker and coordinator stay up")
    finally:
        for s in conns:
            s.close()
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        srv.stop()
    res.done()


if __name__ == "__main__":
    main()
