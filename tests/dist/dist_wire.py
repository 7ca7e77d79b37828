"""Helpers for the pipeline tests that look at the wire (test_dist_replay,
test_dist_limits): a process's listening TCP ports and resident memory from
/proc, a loopback capture of TCP streams, and NNG's SP-over-TCP framing
spoken by hand (an 8-byte header 00 'S' 'P' 00, the 16-bit protocol id,
00 00; then messages, each after its 64-bit big-endian length)."""
import os
import socket
import struct
import threading
import time

PUSH, REQ = 0x50, 0x30   # NNG protocol ids: push0 talks to pull0, req0 to rep0


def sp_header(proto):
    return b"\x00SP\x00" + struct.pack(">H", proto) + b"\x00\x00"


def listening_ports(pid):
    """The TCP ports process pid listens on (IPv4, /proc/net/tcp state 0A)."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return set()
    ports = set()
    with open("/proc/%d/net/tcp" % pid) as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_ports(pid, n, tries=600):
    """The listening ports of pid once there are at least n (bounded wait)."""
    for _ in range(tries):
        ports = listening_ports(pid)
        if len(ports) >= n:
            return ports
        time.sleep(0.1)
    return listening_ports(pid)


def messages(stream):
    """The complete SP messages of one direction of a connection, after its
    8-byte header."""
    out, at = [], 8
    while at + 8 <= len(stream):
        n = int.from_bytes(stream[at:at + 8], "big")
        if at + 8 + n > len(stream):
            break
        out.append(stream[at + 8:at + 8 + n])
        at += 8 + n
    return out


class LoopbackCapture:
    """Records the TCP payload sent to the chosen ports over loopback (an
    AF_PACKET socket on lo: needs CAP_NET_RAW), each connection reassembled
    by sequence number. start() is False without the capability."""

    def __init__(self):
        self.ports = set()
        self.segments = {}   # (source port, destination port) -> {seq: payload}
        self.lock = threading.Lock()
        self.sock = None

    def start(self):
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 25)
            self.sock.bind(("lo", 0))
        except (PermissionError, OSError):
            return False
        threading.Thread(target=self.run, daemon=True).start()
        return True

    def run(self):
        while True:
            try:
                pkt, addr = self.sock.recvfrom(1 << 18)
            except OSError:
                return
            if addr[2] == socket.PACKET_OUTGOING:   # lo shows each packet twice
                continue
            ip = pkt[14:]
            if len(ip) < 20 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            tcp = ip[ihl:struct.unpack(">H", ip[2:4])[0]]
            sport, dport, seq = struct.unpack(">HHI", tcp[:8])
            data = tcp[(tcp[12] >> 4) * 4:]
            if data and dport in self.ports:
                with self.lock:
                    self.segments.setdefault((sport, dport), {})[seq] = data

    def streams_to(self, port):
        """Every recorded connection to port, each as the bytes sent (in
        order, from its first recorded byte)."""
        out = []
        with self.lock:
            conns = [dict(v) for (s, d), v in self.segments.items() if d == port]
        for segs in conns:
            data, at = b"", None
            for seq in sorted(segs):
                if at is not None and seq != at:
                    break   # a gap: the rest was not recorded
                data += segs[seq]
                at = (seq + len(segs[seq])) & 0xffffffff
            out.append(data)
        return out

    def close(self):
        if self.sock:
            self.sock.close()


def push(port, body):
    """One message to an NNG pull socket over a raw connection; True once
    sent and the peer's header came back."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(sp_header(PUSH))
            peer = b""
            while len(peer) < 8:
                chunk = s.recv(8 - len(peer))
                if not chunk:
                    return False
                peer += chunk
            s.sendall(len(body).to_bytes(8, "big") + body)
            time.sleep(0.5)
            return peer[:4] == b"\x00SP\x00"
    except OSError:
        return False


class Lines:
    """A process's stderr lines, read by a thread; wait_for() is a bounded
    wait for a line containing a text."""

    def __init__(self, proc):
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self.run, args=(proc,), daemon=True).start()

    def run(self, proc):
        for line in proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, text, seconds=30):
        with self.cond:
            self.cond.wait_for(lambda: any(text in l for l in self.lines), timeout=seconds)
            return any(text in l for l in self.lines)

    def text(self):
        with self.cond:
            return "".join(self.lines)
