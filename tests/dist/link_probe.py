#!/usr/bin/env python3
"""Probes a link between two hosts (tests/dist/netns_hosts.sh): the round
trip it costs and whether it delivers bytes whole and in order. Used by
tests/dist/test_netdelay.sh and bench_dist_link.sh.

  link_probe.py echo ADDR PORT          TCP echo server (every connection), and
                                        a UDP sink on the same port that answers
                                        each datagram "DONE n" with how many
                                        numbered datagrams came, and whether in
                                        order ("in-order n" / "out-of-order n")
  link_probe.py ping ADDR PORT COUNT    COUNT one-byte TCP round trips on one
                                        connection (the first opens it and is not
                                        counted); prints "rtt_ms MIN AVG MAX"
  link_probe.py bulk ADDR PORT BYTES    sends BYTES seeded random bytes and
                                        reads the echo; prints "bulk ok" or why not
  link_probe.py udp ADDR PORT COUNT     sends COUNT numbered datagrams, then
                                        "DONE"; prints the sink's answer
"""
import os
import random
import socket
import struct
import sys
import threading
import time


def echo(addr, port):
    tcp = socket.create_server((addr, port))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # a burst of datagrams arrives at once after the delay: room for all
    # (SO_RCVBUFFORCE, 33: root may exceed rmem_max)
    udp.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
    udp.bind((addr, port))

    def serve(conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def sink():
        seen, in_order, last = 0, True, -1
        while True:
            data, peer = udp.recvfrom(64)
            if data.startswith(b"DONE"):
                udp.sendto(b"%s %d" % (b"in-order" if in_order else b"out-of-order", seen), peer)
                seen, in_order, last = 0, True, -1
                continue
            (n,) = struct.unpack("<I", data[:4])
            in_order &= n == last + 1
            last, seen = n, seen + 1

    threading.Thread(target=sink, daemon=True).start()
    print("listening", flush=True)
    while True:
        conn, _ = tcp.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def connect(addr, port):
    for _ in range(100):   # the echo server may still be starting
        try:
            s = socket.create_connection((addr, port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except ConnectionRefusedError:
            time.sleep(0.05)
    sys.exit(f"link_probe: cannot connect to {addr}:{port}")


def recv_exactly(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            sys.exit("link_probe: the connection closed early")
        out += chunk
    return bytes(out)


def ping(addr, port, count):
    s = connect(addr, port)
    rtts = []
    for i in range(count + 1):
        t0 = time.monotonic()
        s.sendall(b"p")
        recv_exactly(s, 1)
        if i:
            rtts.append((time.monotonic() - t0) * 1e3)
    print(f"rtt_ms {min(rtts):.3f} {sum(rtts) / len(rtts):.3f} {max(rtts):.3f}")


def bulk(addr, port, nbytes):
    payload = random.Random(nbytes).randbytes(nbytes)
    s = connect(addr, port)
    got = bytearray()

    def reader():
        got.extend(recv_exactly(s, nbytes))

    t = threading.Thread(target=reader)
    t.start()
    s.sendall(payload)
    t.join()
    print("bulk ok" if bytes(got) == payload else f"bulk differs ({len(got)} bytes back)")


def udp(addr, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(30)
    for n in range(count):
        s.sendto(struct.pack("<I", n) + os.urandom(28), (addr, port))
    s.sendto(b"DONE", (addr, port))
    print(s.recv(64).decode())


if __name__ == "__main__":
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "echo":
        echo(addr, port)
    else:
        {"ping": ping, "bulk": bulk, "udp": udp}[mode](addr, port, int(sys.argv[4]))
