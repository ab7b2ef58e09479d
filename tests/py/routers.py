"""Start the routers the field runs (vllm-router, sglang-router: PyPI
packages with prebuilt binaries) on loopback in front of sampler replicas,
for tests/py/test_routers.py and bench/fleet.py."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available(kind):
    """The command that starts router `kind`, or None when it is not installed."""
    exe = shutil.which({"vllm": "vllm-router", "sglang": "sglang-router"}[kind])
    if exe:
        return [exe] + (["launch"] if kind == "sglang" else [])
    return None


class Router:
    """kind: "vllm" (vllm-router) or "sglang" (sglang-router). Health checks
    every second, one failure marks a worker down, one success brings it back,
    no retries of its own (the tests see each routing decision)."""

    def __init__(self, kind, workers, policy, extra=()):
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = available(kind)
        assert cmd, f"{kind}-router is not installed: pip install -r tests/requirements.txt"
        cmd = cmd + ["--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *workers,
                     "--policy", policy, "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                     "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                     "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
                     "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1",
                     "--log-level", "warning" if kind == "vllm" else "warn", *extra]
        self.log = open(os.devnull, "w") if not os.environ.get("ROUTER_LOG") else sys.stderr
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        t0 = time.monotonic()
        while True:
            try:
                st, w = self.get("/workers")
                if st == 200 and sum(1 for x in w.get("workers", []) if x.get("is_healthy")) == len(workers):
                    break
            except OSError:
                pass
            assert self.proc.poll() is None, f"{kind}-router exited with {self.proc.returncode}"
            assert time.monotonic() - t0 < 120, f"{kind}-router did not start"
            time.sleep(0.1)

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return r.status, json.loads(r.read())

    def healthy(self):
        """{worker url: is_healthy} as the router sees it."""
        st, w = self.get("/workers")
        return {x["url"]: x["is_healthy"] for x in w["workers"]}

    def post(self, path, body, headers=None, timeout=60):
        h = {"Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
