"""ds4-server as a child process for the evaluation tools (eval_tools.py,
claude_code.py): started on a free loopback port, usable once it accepts
connections, stopped on request. Its output goes to a temporary log that a
failed start quotes."""
import os
import socket
import subprocess
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, server, model, *extra, ctx=16384):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([server, "-m", model, "--port", str(self.port), "-t", "1", "--ctx", str(ctx),
                                      *extra], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        self.log.seek(0)
        why = self.log.read()[-500:]
        self._drop_log()
        raise RuntimeError("ds4-server did not start: " + why)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._drop_log()

    def _drop_log(self):
        self.log.close()
        os.unlink(self.log.name)
