"""Starts ./ds4-server on a free loopback port with the demo model for the
server script tests. The demo model has random weights: generated text is
meaningless, so tests check protocol shapes, never content (tool-call paths
use --scripted-output, a test-only flag that makes every generation emit a
fixed text through the real decode loop)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("DS4_SERVER_TEST_MODEL") or os.path.join(ROOT, "models", "demo.gguf")
SERVER = os.environ.get("DS4_SERVER_BIN") or os.path.join(ROOT, "ds4-server")


def demo_model_or_skip(name):
    """Builds models/demo.gguf if needed; exits 77 (skipped, see
    tests/run_tests.sh) with a SKIP line if it can't."""
    if not os.path.exists(MODEL):
        r = subprocess.run(["make", "-s", "demo-model"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(MODEL):
            print(f"SKIP {name}: the demo model could not be built (make demo-model): "
                  f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            sys.exit(77)
    if not os.path.exists(SERVER):
        print(f"FAIL {name}: {SERVER} is missing (make ds4-server)")
        sys.exit(1)


def write_temp_file(text, suffix=".txt"):
    """A private temporary file holding text (a --scripted-output script);
    the caller unlinks it."""
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def read_to_eof(sock):
    """Everything the peer sends until it closes the connection."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def recv_until(sock, done):
    """What the peer sends until done(bytes so far), EOF or a socket error."""
    out = b""
    try:
        while not done(out):
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    # A port free_port() saw free can be taken before the server binds it (by
    # a client's ephemeral port, or another test run on the machine): the
    # server then exits with "cannot listen" and is started on another port.
    PORT_TRIES = 5

    def __init__(self, *extra, ctx=2048):
        self.trace = tempfile.NamedTemporaryFile(prefix="ds4-trace-", suffix=".log", delete=False).name
        for attempt in range(self.PORT_TRIES):
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            self.log = tempfile.NamedTemporaryFile(prefix="ds4-server-", suffix=".log", delete=False)
            args = [SERVER, "-m", MODEL, "--port", str(self.port), "--ctx", str(ctx), "-t", "2",
                    "--trace", self.trace, *extra]
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
            if self.wait_ready():
                return
            log = open(self.log.name, encoding="utf-8", errors="replace").read()
            os.unlink(self.log.name)
            if "cannot listen" not in log or attempt + 1 == self.PORT_TRIES:
                os.unlink(self.trace)
                raise RuntimeError("ds4-server exited: " + log)

    def wait_ready(self):
        """True once this process listens (its log says so: an answer alone
        could come from another server on a port taken before ours bound it)
        and answers; False when it exited."""
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            if "ds4-server: listening on" in open(self.log.name, encoding="utf-8", errors="replace").read():
                try:
                    with urllib.request.urlopen(self.base + "/v1/models", timeout=2) as r:
                        if r.status == 200:
                            return True
                except urllib.error.HTTPError:
                    return True  # it answers (401 when started with an API key)
                except OSError:
                    pass
            time.sleep(0.2)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("ds4-server did not come up: " + open(self.log.name, errors="replace").read()[-2000:])

    def request(self, method, path, body=None, headers=None, timeout=120):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        # urllib would label a body form-encoded; the server wants JSON.
        headers = {"Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def trace_text(self):
        with open(self.trace, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in (self.trace, self.log.name):
            try:
                os.unlink(p)
            except OSError:
                pass


def wait_for(cond, what, res, tries=3000):
    """Polls cond every 0.1 s (a bounded wait for the server's state, not a
    timing check); a failed check when it never holds."""
    for _ in range(tries):
        if cond():
            return True
        time.sleep(0.1)
    res.check(False, f"never happened: {what}")
    return False


class Results:
    """Tiny check collector: every failed check is printed, exit code at the end."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {self.name}: {what}", flush=True)

    def done(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
