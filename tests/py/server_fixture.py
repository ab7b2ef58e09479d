"""Start sampler-cpu on a free loopback port for the server tests and stop it
with SIGTERM (checking the graceful exit)."""
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

from conftest import BUILD, ROOT

ADMIN = "admin-secret"


class Server:
    def __init__(self, *args, model=None, api_key=None):
        binary = os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu"))
        # 16 MiB of KV: 32768 tokens of the tiny model, more than any test here holds at once; the
        # server faults its KV in at start, so every start pays for its size (x ~300 starts a run)
        cmd = [binary, "--port", "0", "--threads", "1", "--kv-mem-mb", "16", "--admin-token", ADMIN,
               "--log-level", "warn"]
        if model:
            cmd += ["--model", model]
        if api_key:
            cmd += ["--api-key", api_key]
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.split()[2].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        self.stderr = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self):
        for l in self.proc.stderr:
            self.stderr.append(l)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """(status, parsed JSON or text) without raising on HTTP errors."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drainer.join(timeout)  # the pipe ends with the process: self.stderr is then complete
        if self.proc.returncode != 0:
            print("server stderr:\n" + "".join(self.stderr))  # shown by pytest on failure
        return self.proc.returncode


def metrics(s):
    """GET /metrics of Server s as {name: value}."""
    st, text = s.request("GET", "/metrics")
    assert st == 200
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


# How long a condition wait may take before the test fails: far past what any
# condition here needs on a loaded machine. It only bounds a wait for something
# that never happens; no test asserts on how long a wait took.
DEADLINE_S = 120


def wait_until(cond, what, timeout=DEADLINE_S, interval=0.02):
    """Poll cond() until it returns something truthy and return that; fail the
    test (naming `what`, a string or a function giving one) only if it never
    does within the deadline."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what() if callable(what) else what}: not within {timeout} s")
        time.sleep(interval)


def wait_idle(s, timeout=DEADLINE_S):
    """Poll /metrics until nothing runs, waits or holds KV blocks; (metrics, seconds waited)."""
    t0 = time.monotonic()
    last = {}

    def idle():
        m = last["m"] = metrics(s)
        return m["sampler_num_requests_running"] == 0 and m["sampler_num_requests_waiting"] == 0 and \
            m["sampler_kv_blocks_used"] == 0 and m["sampler_inflight_requests"] == 0
    wait_until(idle, lambda: f"server idle ({last.get('m')})", timeout)
    return last["m"], time.monotonic() - t0
