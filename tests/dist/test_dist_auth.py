"""Registration's challenge-response (src/dist/dist_proto.h) between separate
./ds4 processes on loopback; the secret never travels:

- every byte a worker and its coordinator exchange on the control
  connection (recorded by a TCP relay between them, both directions, over
  the first registration and the idle heartbeats after it) is free of the
  secret, and it holds KNOCK, CHALLENGE and HELLO frames;
- the recorded CHALLENGE's proof is HMAC-SHA1(secret, "ds4 coordinator" Nw
  Nc) and the recorded HELLO's seal HMAC-SHA1 under HMAC-SHA1(secret,
  "ds4 worker" Nw Nc), computed here with Python's hmac (an independent
  implementation);
- a recorded HELLO sent again to the coordinator is refused (its challenge
  was used), and so is the same HELLO pointed at a fresh challenge (its
  seal does not check: the sender does not know the secret);
- a worker with another secret is refused with one line and exits 1;
- a fake coordinator (one without the secret) answering with a made-up
  proof gets nothing but the KNOCK: the worker says so and exits 1 without
  sending its HELLO;
- TLS (--dist-tls-*, certificates made here with the openssl command, a
  private CA): a 2-way split over tls+tcp gives the single process's
  logits byte for byte, and the recorded control traffic holds neither
  the secret nor a single frame header in the clear; a worker whose
  certificate another CA signed never joins (incomplete route) and says
  that no answer came from the coordinator; a partial
  set of TLS flags and an unreadable file are refused with one line.
NNG's SP-over-TCP framing is spoken by hand (an 8-byte greeting, then
messages with a 64-bit big-endian length; a REQ message starts with its
4-byte request id). Ports are free loopback ports."""
import hashlib
import hmac
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_wire as wire  # noqa: E402  (SP message framing)
import test_dist_split as dist  # noqa: E402  (process helpers, the demo model, the secret)

REQ_GREETING = b"\x00SP\x00\x00\x30\x00\x00"
REP_GREETING = b"\x00SP\x00\x00\x31\x00\x00"
VERSION = 7   # the protocol version (src/dist/dist_proto.c)
KNOCK, CHALLENGE, HELLO, WELCOME, REFUSED = 9, 10, 1, 2, 3
NONCE, SEAL = 16, 20


def frame_type(body):
    """(version, type) of a frame, or None when it is not one."""
    if len(body) < 8 or body[:4] != b"DS4P":
        return None
    return struct.unpack("<HH", body[4:8])


def answered_record(relay):
    """(bytes up, bytes down, requests, replies) of every recorded connection,
    or None while a request on one of them still waits for its reply: REQ/REP
    alternate, so a record where each connection holds as many replies as
    requests is a whole exchange, whatever the two processes' speeds."""
    raw_up, raw_down, ups, downs = b"", b"", [], []
    for c in list(relay.conns):
        up_bytes, down_bytes = bytes(c["up"]), bytes(c["down"])
        up, down = wire.messages(up_bytes), wire.messages(down_bytes)
        if len(up) != len(down):
            return None
        raw_up, raw_down, ups, downs = raw_up + up_bytes, raw_down + down_bytes, ups + up, downs + down
    return raw_up, raw_down, ups, downs


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


class Relay:
    """Accepts one port, relays each connection to `target`, records both
    directions of every connection."""

    def __init__(self, target):
        self.target = target
        self.conns = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target))
            except OSError:   # the coordinator is not up yet: the worker dials again
                a.close()
                continue
            rec = {"up": bytearray(), "down": bytearray()}
            self.conns.append(rec)
            threading.Thread(target=self.pump, args=(a, b, rec["up"]), daemon=True).start()
            threading.Thread(target=self.pump, args=(b, a, rec["down"]), daemon=True).start()

    @staticmethod
    def pump(src, dst, log):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                log += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def request(port, makers):
    """REQ messages over one raw connection to a REP socket, each made from
    the replies so far; the replies' bodies (request ids stripped)."""
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(REQ_GREETING)
        recv_exact(s, 8)
        for i, make in enumerate(makers):
            msg = struct.pack(">I", 0x80000000 | (i + 1)) + make(replies)
            s.sendall(len(msg).to_bytes(8, "big") + msg)
            replies.append(recv_exact(s, int.from_bytes(recv_exact(s, 8), "big"))[4:])
    return replies


def text_of(body):
    """The text of a WELCOME or REFUSED frame (a trailing seal ignored)."""
    n = struct.unpack("<H", body[8:10])[0]
    return body[10:10 + n].decode(errors="replace")


def fake_coordinator(sock, seen):
    """A REP peer without the secret: answers every KNOCK with a random
    nonce and a made-up proof, records every request body."""
    try:
        c, _ = sock.accept()
        c.settimeout(30)
        c.sendall(REP_GREETING)
        recv_exact(c, 8)
        while True:
            n = int.from_bytes(recv_exact(c, 8), "big")
            msg = recv_exact(c, n)
            seen.append(msg[4:])
            reply = msg[:4] + b"DS4P" + struct.pack("<HH", VERSION, CHALLENGE) + os.urandom(NONCE) + os.urandom(SEAL)
            c.sendall(len(reply).to_bytes(8, "big") + reply)
    except (OSError, ConnectionError):
        pass


def make_ca(d, name):
    """A CA and one certificate it signs for 127.0.0.1 (CN and DNS name),
    EC P-256 keys; the paths (cert, key, ca)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", name + "-ca.key",
        "-out", name + "-ca.pem", "-days", "365", "-subj", "/CN=ds4 test CA " + name)
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", name + ".key",
        "-out", name + ".csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=DNS:127.0.0.1\n")
    run("x509", "-req", "-in", name + ".csr", "-CA", name + "-ca.pem", "-CAkey", name + "-ca.key", "-CAcreateserial",
        "-out", name + ".pem", "-days", "365", "-extfile", "ext")
    return [os.path.join(d, name + x) for x in (".pem", ".key", "-ca.pem")]


def tls_args(files):
    return ["--dist-tls-cert", files[0], "--dist-tls-key", files[1], "--dist-tls-ca", files[2]]


def test_tls(check, secret):
    if not shutil.which("openssl"):
        check(False, "TLS: the openssl command is needed to make test certificates")
        return
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        good, other = make_ca(d, "cluster"), make_ca(d, "stranger")
        out = os.path.join(d, "out.json")
        ids = ["--token-ids", "5,6,7,8,9,10,11,12,13,14", "--dump-logits", out, "--logits-all"]
        want = dist.output_of(["-m", dist.DEMO, *ids], out)
        port = dist.free_port()
        relay = Relay(port)
        w = dist.start_worker(dist.DEMO, "3:output", relay.port, extra=tls_args(good))
        try:
            got = dist.output_of([*dist.coordinator_args(dist.DEMO, "0:2", port), *tls_args(good), *ids], out)
        finally:
            dist.stop([w])
        traffic = b"".join(bytes(c["up"]) + bytes(c["down"]) for c in relay.conns)
        check(got == want, "TLS split: differs from the single process (%s)" % got[:200])
        check(len(traffic) > 1000 and b"DS4P" not in traffic and secret not in traffic,
              "TLS: %d bytes recorded, frame headers in the clear: %s" % (len(traffic), b"DS4P" in traffic))

        port = dist.free_port()
        w = dist.start_worker(dist.DEMO, "3:output", port, extra=tls_args(other))
        try:
            r = dist.ds4([*dist.coordinator_args(dist.DEMO, "0:2", port, "3"), *tls_args(good), *ids])
            said = w.stderr.readline()   # the worker's own account, once its first wait runs out
        finally:
            dist.stop([w])
        check(r.returncode != 0 and "incomplete route: no worker holds layer 3" in r.stderr,
              "TLS: a certificate of another CA joins: %s" % r.stderr.strip()[-300:])
        check("no answer from tls+tcp://127.0.0.1:%d yet" % port in said and "certificates" in said,
              "TLS: the worker says no answer came: %r" % said)

        for args, line in [(tls_args(good)[:2], "TLS needs all of --dist-tls-cert, --dist-tls-key and --dist-tls-ca"),
                           (tls_args(good)[:4] + ["--dist-tls-ca", os.path.join(d, "missing.pem")], "cannot read")]:
            r = dist.ds4([*dist.coordinator_args(dist.DEMO, "0:2", dist.free_port(), "1"), *args, *ids])
            check(r.returncode != 0 and line in r.stderr and len(r.stderr.strip().splitlines()) == 1,
                  "TLS flags %s: %r" % (args[::2], r.stderr.strip()))


def main():
    if not (os.access(dist.DS4, os.X_OK) and os.path.exists(dist.DEMO)):
        print("test_dist_auth: SKIPPED: needs ./ds4 and %s (make test builds them)" % dist.DEMO)
        return 77
    check, secret = dist.check, dist.SECRET.encode()
    port = dist.free_port()
    coord = subprocess.Popen([dist.DS4, "-t", "1", "-m", dist.DEMO, "--role", "coordinator", "--layers", "0:2",
                              "--listen", "127.0.0.1", str(port), "--dist-secret", dist.SECRET, "--dist-wait", "60"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=dist.ROOT)
    relay = Relay(port)
    worker = dist.start_worker(dist.DEMO, "3:output", relay.port)
    try:
        check("registered" in dist.registration_line(worker), "the worker registers through the relay")
        # the worker says HELLO again after each idle second: wait for two more
        # handshakes on the record, each answered (no clock: the relay's record
        # is the signal; the checks below read that one record, where reading
        # it twice let a reply still in flight drop out of one reading)
        # (a bound only so a protocol mismatch fails instead of hanging)
        record = None
        for _ in range(600):
            if worker.poll() is not None:
                break
            record = answered_record(relay)
            if record and sum(frame_type(m[4:]) == (VERSION, HELLO) for m in record[2]) >= 3:
                break
            threading.Event().wait(0.2)
        up, down, ups, downs = record or (b"", b"", [], [])
        check(secret not in up and secret not in down and secret.hex().encode() not in up + down,
              "the secret is not in the recorded control traffic (%d bytes up, %d down)" % (len(up), len(down)))
        ups = [m[4:] for m in ups]
        downs = [m[4:] for m in downs]
        knocks = [m for m in ups if frame_type(m) == (VERSION, KNOCK)]
        hellos = [m for m in ups if frame_type(m) == (VERSION, HELLO)]
        challenges = [m for m in downs if frame_type(m) == (VERSION, CHALLENGE)]
        check(len(hellos) >= 3 and len(knocks) == len(challenges) >= len(hellos),
              "recorded %d KNOCK, %d CHALLENGE, %d HELLO" % (len(knocks), len(challenges), len(hellos)))

        # the proofs, by an independent HMAC: request/reply pairs alternate
        pairs = list(zip(ups, downs))
        good = 0
        for (knock, chal), (hello, answer) in zip(pairs, pairs[1:]):
            if frame_type(knock) != (VERSION, KNOCK) or frame_type(hello) != (VERSION, HELLO):
                continue
            nw, nc, proof = knock[8:8 + NONCE], chal[8:8 + NONCE], chal[8 + NONCE:]
            key = hmac.new(secret, b"ds4 worker" + nw + nc, hashlib.sha1).digest()
            good += (proof == hmac.new(secret, b"ds4 coordinator" + nw + nc, hashlib.sha1).digest()
                     and hello[8:8 + NONCE] == nc
                     and hello[-SEAL:] == hmac.new(key, hello[:-SEAL], hashlib.sha1).digest()
                     and frame_type(answer) == (VERSION, WELCOME)
                     and answer[-SEAL:] == hmac.new(key, answer[:-SEAL], hashlib.sha1).digest())
        check(good == len(hellos), "%d of %d handshakes check against Python's hmac" % (good, len(hellos)))

        # a recorded HELLO again: its challenge was used
        replies = request(port, [lambda _: hellos[0]])
        check(frame_type(replies[0]) == (VERSION, REFUSED) and "used or lapsed challenge" in text_of(replies[0]),
              "a replayed HELLO is refused: %r" % replies[0][:120])
        # the same HELLO pointed at a fresh challenge: the seal does not check
        replies = request(port, [lambda _: knocks[0],
                                 lambda r: hellos[0][:8] + r[0][8:8 + NONCE] + hellos[0][8 + NONCE:]])
        check(frame_type(replies[0]) == (VERSION, CHALLENGE) and frame_type(replies[1]) == (VERSION, REFUSED)
              and "wrong --dist-secret" in text_of(replies[1]), "a HELLO sealed without the secret: %r" % replies[1][:120])

        # another secret: refused with one line, exit 1
        rc, err = dist.exit_of(dist.start_worker(dist.DEMO, "3:output", port, "not-the-secret"))
        lines = [l for l in err.strip().splitlines() if "no answer from" not in l]
        check(rc == 1 and len(lines) == 1 and "wrong --dist-secret" in lines[0],
              "another secret: rc %s, %r" % (rc, err))
    finally:
        dist.stop([worker, coord])

    # a fake coordinator gets the KNOCK and nothing else
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    seen = []
    t = threading.Thread(target=fake_coordinator, args=(sock, seen), daemon=True)
    t.start()
    rc, err = dist.exit_of(dist.start_worker(dist.DEMO, "3:output", sock.getsockname()[1]))
    sock.close()
    check(rc == 1 and "does not prove it holds this secret" in err, "fake coordinator: rc %s, %r" % (rc, err))
    check(len(seen) == 1 and frame_type(seen[0]) == (VERSION, KNOCK),
          "the fake coordinator saw only a KNOCK: %s" % [frame_type(m) for m in seen])
    test_tls(check, secret)
    print("test_dist_auth: %d passed, %d failed" % (dist.passed, dist.failed))
    return 1 if dist.failed else 0


if __name__ == "__main__":
    sys.exit(main())
