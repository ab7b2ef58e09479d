"""trainer push against stub samplers (python http.server) that implement the
admin endpoint contract of docs/delta-format.md: the body must be the delta
file byte for byte with the admin token; 200 / 409 / 503 / 401 answers and a
GET whose hashes disagree must give the right per-sampler outcome and exit
status."""
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from delta_ckpt import TRAINER, parse_delta, random_weights, step, write_checkpoint

TOKEN = "s3cret-admin"


class Stub:
    """One sampler. mode: ok | flaky (first POST 503) | conflict | badhash | down (always 503)."""

    def __init__(self, delta_bytes, mode):
        self.delta, self.mode, self.posts, self.gets, self.bad = delta_bytes, mode, 0, 0, []
        self.meta = parse_delta(delta_bytes)
        self.version = self.meta["base"]
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, code, obj):
                b = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def authorized(self):
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.reply(401, {"error": {"message": "bad admin token"}})
                    return False
                return True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/admin/v1/weights/delta":
                    return self.reply(404, {"error": {"message": "no such endpoint"}})
                stub.posts += 1
                if not self.authorized():
                    return
                if body != stub.delta:
                    stub.bad.append("body differs from the delta file")
                    return self.reply(400, {"error": {"message": "bad body"}})
                if stub.mode == "down" or (stub.mode == "flaky" and stub.posts == 1):
                    return self.reply(503, {"error": {"message": "engine busy"}})
                if stub.mode == "conflict":
                    return self.reply(409, {"error": {"message": "base version mismatch"}, "current_version": 7})
                noop = stub.version == stub.meta["target"]
                stub.version = stub.meta["target"]
                self.reply(200, {"version": stub.version, "model_fingerprint": f"{stub.meta['fingerprint']:016x}",
                                 "noop": noop, "tensors_updated": 0 if noop else len(stub.meta["tensors"])})

            def do_GET(self):
                if self.path != "/admin/v1/weights":
                    return self.reply(404, {"error": {"message": "no such endpoint"}})
                stub.gets += 1
                if not self.authorized():
                    return
                t = {x["name"]: f"{x['hash_after']:016x}" for x in stub.meta["tensors"]}
                t["lm_head.weight"] = "00000000000000aa"
                if stub.mode == "badhash":
                    k = sorted(t)[0]
                    t[k] = "%016x" % (int(t[k], 16) ^ 1)
                self.reply(200, {"version": stub.version, "model_fingerprint": f"{stub.meta['fingerprint']:016x}",
                                 "tensors": t})

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture(scope="module")
def delta(tmp_path_factory):
    d = tmp_path_factory.mktemp("push")
    w0 = random_weights(11)
    write_checkpoint(d / "v0", w0)
    write_checkpoint(d / "v1", step(w0, 12))
    subprocess.run([TRAINER, "diff", d / "v0", d / "v1", "-o", d / "s.delta"], check=True, capture_output=True)
    return d / "s.delta"


def push(delta, stubs, *extra, token=TOKEN):
    args = [TRAINER, "push", str(delta), "--admin-token", token]
    for s in stubs:
        args += ["--to", s.url + "/"]
    return subprocess.run(args + [str(e) for e in extra], capture_output=True, text=True, timeout=60)


def make(delta, *modes):
    b = open(delta, "rb").read()
    return [Stub(b, m) for m in modes]


def test_push_ok_with_retry(delta):
    stubs = make(delta, "ok", "flaky", "ok")
    try:
        p = push(delta, stubs)
        assert p.returncode == 0, p.stdout + p.stderr
        assert [s.posts for s in stubs] == [1, 2, 1]  # the 503 was retried
        assert all(s.gets == 1 and not s.bad for s in stubs)
        assert "all 3 samplers on version 1" in p.stdout
        # replay: the samplers answer noop, push still succeeds
        p = push(delta, stubs)
        assert p.returncode == 0 and p.stdout.count(" noop ") == 3, p.stdout
    finally:
        for s in stubs:
            s.close()


def test_push_fails_loudly(delta):
    stubs = make(delta, "ok", "conflict", "badhash")
    try:
        p = push(delta, stubs)
        assert p.returncode == 1
        assert "FAILED: 2 of 3" in p.stderr
        lines = {s.url: next(l for l in p.stdout.splitlines() if s.url in l) for s in stubs}
        assert " ok " in lines[stubs[0].url]
        assert "conflict" in lines[stubs[1].url] and "version 7" in lines[stubs[1].url]
        assert "hash" in lines[stubs[2].url]
        assert stubs[1].posts == 1  # a conflict is not retried
    finally:
        for s in stubs:
            s.close()


def test_push_bad_token_and_deadline(delta):
    stubs = make(delta, "ok", "down")
    try:
        p = push(delta, stubs[:1], token="wrong")
        assert p.returncode == 1 and "HTTP 401" in p.stdout and stubs[0].posts == 1  # 4xx: no retry
        p = push(delta, stubs[1:], "--deadline", 1.5, "--retries", 1000)
        assert p.returncode == 1 and "HTTP 503" in p.stdout and "deadline" in p.stdout
        assert 1 < stubs[1].posts < 1000
    finally:
        for s in stubs:
            s.close()
