"""The HTTP layer against hostile or odd clients, on loopback, each bounded:
auth is decided from the headers before a byte of the body is read (a
tokenless client streaming a huge delta gets 401 at once, nothing buffered);
half-closed clients (shutdown(SHUT_WR), `nc -N`) get their whole answer while
a reset client still aborts its request; every error is an OpenAI error
object. No timing assertions: socket reads have generous deadlines."""
import json
import socket
import struct

import pytest

from server_fixture import ADMIN, Server, metrics, wait_until

AUTH = "Authorization: Bearer " + ADMIN + "\r\n"


@pytest.fixture(scope="module")
def srv():
    s = Server("--max-model-len", "256")
    yield s
    assert s.stop() == 0


def read_answer(c, timeout=20.0):
    """Bytes until the server closes or a whole Content-Length answer is in."""
    c.settimeout(timeout)
    out = b""
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            out += b
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= n:
                    break
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def error_of(answer):
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    e = json.loads(body)
    assert set(e) >= {"error"} and set(e["error"]) == {"message", "type", "param", "code"}, e
    assert isinstance(e["error"]["message"], str) and e["error"]["message"], e
    return status, e["error"]


# ---- 1. auth before the body ----
@pytest.mark.parametrize("token", [None, "wrong"])
def test_tokenless_delta_is_refused_before_its_body(srv, token):
    """Headers announce 1 GiB and no body byte is sent: the 401 must come from
    the headers alone (a server that waits for the body never answers)."""
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    c.sendall(f"POST /admin/v1/weights/delta HTTP/1.1\r\nHost: x\r\n{auth}"
              f"Content-Type: application/octet-stream\r\nContent-Length: {1 << 30}\r\n\r\n".encode())
    got = read_answer(c)
    c.close()
    assert got.startswith(b"HTTP/1.1 401"), got[:200]
    st, e = error_of(got)
    assert e["type"] == "authentication_error"
    assert srv.request("GET", "/health")[0] == 200


def test_streaming_tokenless_client_is_cut_off(srv):
    """A tokenless client that keeps sending gets its 401 and the connection
    closes: the server reads no more of the body."""
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    c.sendall(f"POST /pause HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 30}\r\n\r\n".encode())
    sent, closed = 0, False
    chunk = bytes(1 << 16)
    try:
        while sent < (256 << 20):  # far more than any socket buffer: the server must have closed
            c.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    c.close()
    assert closed, f"the server kept reading a tokenless body ({sent} bytes sent)"


def test_over_the_limit_is_413_from_content_length(srv):
    """An authorized request announcing more than --max-body-bytes and waiting
    for 100 Continue: 413 before any body byte (a client already sending has
    its body dropped as it comes, then the 413: test_server_cli)."""
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              f"Content-Length: {1 << 30}\r\n\r\n".encode())
    got = read_answer(c)
    c.close()
    st, e = error_of(got)
    assert st == 413 and e["code"] == "request_too_large" and "--max-body-bytes" in e["message"]


def test_admin_disabled_is_403_before_the_body():
    """No --admin-token: the admin routes are off, and say so (403) from the headers alone."""
    import os
    import subprocess
    from conftest import BUILD, ROOT
    binary = os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu"))
    p = subprocess.Popen([binary, "--port", "0", "--threads", "1", "--kv-mem-mb", "64", "--log-level", "warn"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        port = int(p.stdout.readline().split()[2].rsplit(":", 1)[1])
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(f"POST /admin/v1/weights/delta HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 32}\r\n\r\n".encode())
        got = read_answer(c)
        c.close()
        st, e = error_of(got)
        assert st == 403 and e["type"] == "permission_error" and "--admin-token" in e["message"], got[:300]
    finally:
        p.terminate()
        assert p.wait(60) == 0


# ---- 6. half-closed clients ----
def half_closed(port, req):
    c = socket.create_connection(("127.0.0.1", port), timeout=60)
    c.sendall(req)
    c.shutdown(socket.SHUT_WR)
    out = b""
    c.settimeout(60)
    while True:
        b = c.recv(65536)
        if not b:
            break
        out += b
    c.close()
    return out


def post(path, body):
    b = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(b)}\r\n\r\n").encode() + b


def test_half_closed_client_gets_the_whole_answer(srv):
    got = half_closed(srv.port, post("/v1/completions", {"prompt": "hi", "max_tokens": 20, "ignore_eos": True}))
    # an interim 100 Continue may come first (the probe that tells half-closed from gone)
    final = got.split(b"HTTP/1.1 100 Continue\r\n\r\n")[-1]
    assert final.startswith(b"HTTP/1.1 200"), got[:300]
    r = json.loads(final.partition(b"\r\n\r\n")[2])
    assert r["usage"]["completion_tokens"] == 20


def test_half_closed_client_gets_the_whole_stream(srv):
    got = half_closed(srv.port, post("/v1/completions", {"prompt": "hi", "max_tokens": 20, "ignore_eos": True,
                                                         "stream": True}))
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    assert b'"finish_reason":"length"' in got and b"data: [DONE]" in got, got[-300:]


def test_reset_client_aborts_its_request(srv):
    aborted = 'sampler_sequences_finished_total{finish_reason="abort"}'
    before = metrics(srv)[aborted]
    tokens = metrics(srv)["sampler_generation_tokens_total"]
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    c.sendall(post("/v1/completions", {"prompt": "hi", "max_tokens": 255, "ignore_eos": True, "n": 4,
                                       "top_p": 0.5}))
    wait_until(lambda: metrics(srv)["sampler_generation_tokens_total"] > tokens, "the request generating")
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    c.close()
    wait_until(lambda: metrics(srv)[aborted] > before, "a reset client's request aborted")
    assert srv.request("GET", "/health")[0] == 200


# ---- 11. errors in OpenAI's shape ----
def test_unknown_route_is_route_not_found(srv):
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    c.sendall(b"GET /nothing/here HTTP/1.1\r\nHost: x\r\n\r\n")
    st, e = error_of(read_answer(c))
    c.close()
    assert st == 404 and e["code"] == "route_not_found", e
    st, r = srv.request("POST", "/v1/nothing", {})
    assert st == 404 and r["error"]["code"] == "route_not_found", r


# ---- 4. JSON amplification ----
def test_json_with_too_many_values_is_413_before_parsing(srv):
    """1.1M empty objects in an ignored field (3.3 MB, under --max-body-bytes):
    refused by the pre-scan, naming its limit, not parsed into a 250+ MB tree."""
    raw = b'{"prompt": "hi", "max_tokens": 1, "ignored": [' + b"{}," * 1100000 + b'{}]}'
    st, r = srv.request("POST", "/v1/completions", raw=raw)
    assert st == 413 and "1048576" in r["error"]["message"], (st, str(r)[:300])
    st, r = srv.request("POST", "/v1/completions", raw=b'{"prompt": "hi", "ignored": ' + b"[" * 100 + b"]" * 100 + b"}")
    assert st == 400 and "64" in r["error"]["message"], r
    # what legitimate requests look like still fits: long token-id prompts, big logit_bias
    st, r = srv.post("/v1/completions", {"prompt": [1] * 200, "max_tokens": 1,
                                         "logit_bias": {str(i): 0 for i in range(5000)},
                                         "ignored": "a \\\" [[[[[[ string that is not nesting" * 100})
    assert st == 200, r


# ---- 5. slowloris ----
def trickler(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(b"GET /health HTTP/1.1\r\n")
    return c


def closed_by_server(c, timeout):
    """True once the server closed c (EOF, reset, or a send that fails) within timeout."""
    import time
    end = time.monotonic() + timeout
    c.settimeout(0.2)
    while time.monotonic() < end:
        try:
            c.sendall(b"X")  # one more header byte: restarts an idle timer, not a total deadline
            if c.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_trickled_headers_hit_the_header_deadline():
    s = Server("--header-timeout", "2", "--connection-timeout", "60")
    try:
        c = trickler(s.port)
        # every byte restarts the 60 s idle timer; only the 2 s total deadline can close it within 40 s
        assert closed_by_server(c, 40), "a trickling client kept its connection past --header-timeout"
        c.close()
        assert s.request("GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0


def test_health_answers_during_a_slowloris_attack():
    import threading
    import time
    import urllib.request
    s = Server("--max-connections", "100", "--header-timeout", "30", "--connection-timeout", "60")
    socks, stop = [], threading.Event()
    try:
        for _ in range(200):
            socks.append(trickler(s.port))

        def trickle():
            while not stop.is_set():
                for c in list(socks):
                    try:
                        c.send(b"X")
                    except OSError:
                        pass
                stop.wait(0.5)
        th = threading.Thread(target=trickle, daemon=True)
        th.start()
        answered, end = False, time.monotonic() + 60
        while not answered and time.monotonic() < end:
            try:
                with urllib.request.urlopen(s.url + "/health", timeout=2) as r:
                    answered = r.status == 200
            except OSError:
                time.sleep(0.1)
        assert answered, "/health never answered while 200 connections trickled their headers"
        # the connections over --max-connections were closed, not left in the backlog
        gone = 0
        for c in socks:
            c.settimeout(0.05)
            try:
                gone += c.recv(1) == b""
            except socket.timeout:
                pass
            except OSError:
                gone += 1
        assert gone >= 99, f"only {gone} of 200 trickling connections were closed at --max-connections 100"
    finally:
        stop.set()
        for c in socks:
            c.close()
        assert s.stop() == 0


# ---- 1b. a delta body is spooled to an unlinked file, not held in the heap ----
def test_delta_body_is_spooled_to_an_unlinked_file(tmp_path, monkeypatch):
    import os
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    s = Server()
    try:
        n = 4 << 20
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(f"POST /admin/v1/weights/delta HTTP/1.1\r\nHost: x\r\n{AUTH}"
                  f"Content-Length: {n}\r\n\r\n".encode() + bytes(n // 2))

        def spooled():  # the half body sits in a deleted file in TMPDIR, open in the server
            fds = os.path.join("/proc", str(s.proc.pid), "fd")
            for f in os.listdir(fds):
                try:
                    t = os.readlink(os.path.join(fds, f))
                except OSError:
                    continue
                if t.startswith(str(spool) + "/sampler-delta-") and t.endswith("(deleted)"):
                    return os.stat(os.path.join(fds, f)).st_size >= n // 2
            return False
        wait_until(spooled, "the delta body spooled to an unlinked file in TMPDIR")
        assert os.listdir(spool) == []  # unlinked at once: nothing to clean up after a crash
        c.sendall(bytes(n // 2))
        st, e = error_of(read_answer(c, 60))
        c.close()
        assert st == 400 and e["code"] == "invalid_delta", e  # zeros are no delta: it was read from the file
    finally:
        assert s.stop() == 0
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    s = Server()
    try:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(f"POST /admin/v1/weights/delta HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: 64\r\n\r\n".encode()
                  + b"SDLT" + bytes(60))
        st, e = error_of(read_answer(c, 60))
        c.close()
        assert st == 507 and "TMPDIR" in e["message"], e
    finally:
        assert s.stop() == 0
