"""HTTPS in the server (--tls-cert/--tls-key) end to end: a self-signed
certificate made here with the openssl CLI; the official openai client
trusting it completes, a client that does not trust it fails the handshake;
trainer push verifies the certificate (--cacert; without it the push fails;
--insecure warns). Also: bad TLS flags fail at start-up with a fix, the
plain-HTTP-admin-on-a-public-address warning, and the connection limits
(an idle half-sent request is closed after --connection-timeout, oversized
headers are refused) while the server keeps serving."""
import json
import os
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from conftest import BUILD, ROOT
from server_fixture import ADMIN, Server

TRAINER = os.environ.get("TRAINER_BIN", os.path.join(BUILD, "trainer"))
BINARY = os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu"))
AUTH = {"Authorization": "Bearer " + ADMIN}


def make_cert(d, name, cn="localhost"):
    cert, key = str(d / f"{name}.pem"), str(d / f"{name}.key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", f"/CN={cn}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("the openssl CLI is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = make_cert(d, "server")
    other, _ = make_cert(d, "other")  # a CA the server's certificate does not chain to
    return {"dir": d, "cert": cert, "key": key, "other": other}


@pytest.fixture(scope="module")
def tls_srv(certs):
    s = Server("--tls-cert", certs["cert"], "--tls-key", certs["key"])
    yield s
    assert s.stop() == 0


def get(url, ctx, timeout=30):
    with urllib.request.urlopen(urllib.request.Request(url), context=ctx, timeout=timeout) as r:
        return r.status, r.read().decode()


def test_openai_client_over_https(tls_srv, certs):
    assert tls_srv.url.startswith("https://127.0.0.1:")
    ctx = ssl.create_default_context(cafile=certs["cert"])
    c = openai.OpenAI(base_url=tls_srv.url + "/v1", api_key="unused", max_retries=0,
                      http_client=openai.DefaultHttpxClient(verify=ctx))
    r = c.completions.create(model="tiny-qwen3", prompt="Hello", max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    chat = c.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                     stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    # how many tokens share an event depends on when the server fills the stream, so count
    # tokens (usage) and the finish, not events
    chunks = list(chat)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 3
    assert get(tls_srv.url + "/health", ctx) == (200, '{"status":"ok"}')


def test_untrusted_client_fails(tls_srv, certs):
    for ctx in (ssl.create_default_context(), ssl.create_default_context(cafile=certs["other"])):
        with pytest.raises(urllib.error.URLError) as e:
            get(tls_srv.url + "/health", ctx)
        assert isinstance(e.value.reason, ssl.SSLCertVerificationError), e.value
    c = openai.OpenAI(base_url=tls_srv.url + "/v1", api_key="unused", max_retries=0,
                      http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=certs["other"])))
    with pytest.raises(openai.APIConnectionError):
        c.models.list()
    # plain HTTP to the HTTPS port gets no HTTP answer; the server keeps serving
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(tls_srv.url.replace("https://", "http://") + "/health", timeout=10).read()
    assert get(tls_srv.url + "/health", ssl.create_default_context(cafile=certs["cert"]))[0] == 200


def test_trainer_push_verifies_certificate(tls_srv, certs):
    if not os.path.exists(TRAINER):
        pytest.skip("trainer binary not built")
    from test_server_admin import bump_bf16
    d = certs["dir"]
    v0, v1 = os.path.join(ROOT, "models/tiny-qwen3"), str(d / "v1")
    bump_bf16(v0, v1, ["model.norm.weight"])
    delta = str(d / "1.delta")
    r = subprocess.run([TRAINER, "diff", v0, v1, "-o", delta, "--base-version", "0", "--target-version", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    base = ["--to", tls_srv.url, "--admin-token", ADMIN, "--deadline", "20", "--retries", "0"]
    # the server's certificate is self-signed: without --cacert libcurl refuses it
    r = subprocess.run([TRAINER, "push", delta] + base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "FAILED" in r.stdout and "certificate" in r.stdout.lower(), r.stdout + r.stderr
    r = subprocess.run([TRAINER, "push", delta, "--cacert", certs["other"]] + base, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "FAILED" in r.stdout, r.stdout + r.stderr
    ctx = ssl.create_default_context(cafile=certs["cert"])
    req = urllib.request.Request(tls_srv.url + "/admin/v1/weights", headers=AUTH)
    assert json.loads(urllib.request.urlopen(req, context=ctx, timeout=30).read())["version"] == 0
    r = subprocess.run([TRAINER, "push", delta, "--cacert", certs["cert"]] + base, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "all 1 samplers on version 1" in r.stdout, r.stdout + r.stderr
    assert json.loads(urllib.request.urlopen(req, context=ctx, timeout=30).read())["version"] == 1
    r = subprocess.run([TRAINER, "push", delta, "--insecure"] + base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "noop" in r.stdout, r.stdout + r.stderr
    assert "--insecure" in r.stderr and "NOT verified" in r.stderr


def start_fail(*args):
    r = subprocess.run([BINARY, "--port", "0", "--threads", "1", "--kv-mem-mb", "64"] + list(args),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "listening" not in r.stdout, r.stdout
    return r.stderr


def test_bad_tls_flags_fail_at_startup(certs, tmp_path):
    assert "needs both --tls-cert" in start_fail("--tls-cert", certs["cert"])
    assert "cannot open" in start_fail("--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", certs["key"])
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert "not a PEM file" in start_fail("--tls-cert", str(junk), "--tls-key", certs["key"])
    # a well-formed PEM that is not this certificate's key: GnuTLS refuses the pair
    other_key = str(certs["dir"] / "other.key")
    assert "not a matching PEM certificate" in start_fail("--tls-cert", certs["cert"], "--tls-key", other_key)


def warnings_of(*args):
    s = Server(*args)
    assert s.stop() == 0  # the warning is logged before "listening"; stop() waits for all of stderr
    return "".join(s.stderr)


def test_plain_http_admin_on_public_address_warns(certs):
    err = warnings_of("--host", "0.0.0.0")
    assert "WARNING: the admin endpoints" in err and "plain HTTP on 0.0.0.0" in err, err
    assert ADMIN not in err  # the admin token is never logged
    assert "WARNING: the admin endpoints" not in warnings_of("--host", "127.0.0.1")
    assert "WARNING: the admin endpoints" not in warnings_of("--host", "0.0.0.0", "--tls-cert", certs["cert"],
                                                             "--tls-key", certs["key"])


def test_slow_client_is_cut_and_big_headers_refused():
    s = Server("--connection-timeout", "1", "--max-header-bytes", "8192")
    try:
        # a client that sends half a request line and stalls is closed after ~1 s idle; the
        # socket timeout is the deadline, below the 30 s default so an ignored flag fails here
        stalled = socket.create_connection(("127.0.0.1", s.port), timeout=25)
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        got = b""
        while True:  # a server that holds the connection fails the test with socket.timeout
            chunk = stalled.recv(4096)
            if not chunk:
                break
            got += chunk
        stalled.close()
        assert not got.startswith(b"HTTP/1.1 200"), got
        # headers past the per-connection memory are refused with an HTTP error, not held
        big = socket.create_connection(("127.0.0.1", s.port), timeout=15)
        big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 16384 + b"\r\n\r\n")
        line = big.recv(4096).split(b"\r\n")[0]
        big.close()
        assert line.split()[1] in (b"413", b"431"), line
        assert s.request("GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0
