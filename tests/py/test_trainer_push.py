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


class ChainStub:
    """A sampler without /admin/v1/fleet (404) that applies any delta whose base
    is its version and answers 409 with current_version otherwise; and a router
    stub's GET /workers. Checks the 409 fallback of catching up."""

    def __init__(self, version=0, workers=None):
        self.version, self.hashes, self.posted, self.workers = version, {}, [], workers
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

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/admin/v1/weights/delta":
                    return self.reply(404, {"error": {"message": "no such endpoint"}})
                m = parse_delta(body)
                stub.posted.append((m["base"], m["target"]))
                if m["base"] != stub.version:
                    return self.reply(409, {"error": {"message": "base version mismatch"},
                                            "current_version": stub.version})
                stub.version = m["target"]
                stub.fp = m["fingerprint"]
                stub.hashes.update({x["name"]: f"{x['hash_after']:016x}" for x in m["tensors"]})
                self.reply(200, {"version": stub.version, "noop": False})

            def do_GET(self):
                if self.path == "/workers" and stub.workers is not None:
                    return self.reply(200, {"workers": [{"url": u, "is_healthy": True} for u in stub.workers]})
                if self.path != "/admin/v1/weights":
                    return self.reply(404, {"error": {"message": "no such endpoint"}})
                self.reply(200, {"version": stub.version, "model_fingerprint": f"{stub.fp:016x}",
                                 "tensors": dict(stub.hashes)})

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_push_fleet_catch_up_via_409_targets_file_and_router(tmp_path):
    """Targets from a file and from a router's worker list (deduplicated); a
    sampler at 0 gets delta 2 -> 3: its 409 says where it is, the chain's
    0 -> 1 -> 2 follow in order, then the delta; the one at 2 gets it once."""
    w = [random_weights(21)]
    for k in range(3):
        w.append(step(w[-1], 30 + k))
    for k, x in enumerate(w):
        write_checkpoint(tmp_path / f"v{k}", x)
    chain = tmp_path / "chain"
    chain.mkdir()
    fp = None
    for k in range(3):
        out = chain / f"step-{k + 1}.delta"
        args = [TRAINER, "diff", tmp_path / f"v{k}", tmp_path / f"v{k + 1}", "-o", out, "--base-version", str(k),
                "--target-version", str(k + 1)]
        subprocess.run(args + (["--fingerprint", f"{fp:016x}"] if fp is not None else []), check=True,
                       capture_output=True)
        fp = parse_delta(open(out, "rb").read())["fingerprint"] if fp is None else fp
    late, current = ChainStub(), ChainStub()
    router = ChainStub(workers=[late.url, current.url + "/"])
    try:
        for k in range(2):  # current: 0 -> 2, the way a live sampler got there
            assert push(chain / f"step-{k + 1}.delta", [current]).returncode == 0
        targets = tmp_path / "targets"
        targets.write_text(f"# the fleet\n{late.url}\n\n{current.url}  # again below, via the router\n")
        p = push(chain / "step-3.delta", [], "--targets", targets, "--router", router.url, "--chain", chain)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "to 2 samplers" in p.stdout and "all 2 samplers on version 3" in p.stdout
        assert late.posted == [(2, 3), (0, 1), (1, 2), (2, 3)]
        assert current.posted[-1] == (2, 3) and len(current.posted) == 3
        line = next(l for l in p.stdout.splitlines() if late.url in l)
        assert "caught up with 2 chain deltas" in line and "no readiness endpoint" in line
        assert late.hashes == current.hashes
        # without a chain the one behind fails loudly, the push exits 1
        behind = ChainStub()
        p = push(chain / "step-3.delta", [behind])
        assert p.returncode == 1 and "conflict: sampler at version 0" in p.stdout
        behind.close()
    finally:
        for s in (late, current, router):
            s.close()
