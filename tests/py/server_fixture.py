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
        cmd = [binary, "--port", "0", "--threads", "1", "--kv-mem-mb", "64", "--admin-token", ADMIN,
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
        threading.Thread(target=self._drain, daemon=True).start()

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


def wait_idle(s, timeout=30):
    """Poll /metrics until nothing runs, waits or holds KV blocks; (metrics, seconds waited)."""
    t0 = time.monotonic()
    while True:
        m = metrics(s)
        if m["sampler_num_requests_running"] == 0 and m["sampler_num_requests_waiting"] == 0 and \
                m["sampler_kv_blocks_used"] == 0 and m["sampler_inflight_requests"] == 0:
            return m, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"server not idle after {timeout} s: {m}")
        time.sleep(0.05)
