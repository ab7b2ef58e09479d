"""Every error case answers with the OpenAI error shape and the right status,
and the server keeps serving after each."""
import concurrent.futures as cf
import json
import socket

import openai
import pytest

from server_fixture import ADMIN, Server, metrics


@pytest.fixture(scope="module")
def srv():
    s = Server("--max-model-len", "256", "--max-n", "8")
    yield s
    assert s.stop() == 0


def still_serving(s, headers=None):
    assert s.request("GET", "/health")[0] == 200
    st, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers=headers)
    assert st == 200 and r["usage"]["completion_tokens"] == 2


def check_error(s, status, path, body=None, raw=None, param=None, headers=None, method="POST", ok_headers=None):
    st, r = s.request(method, path, body, raw=raw, headers=headers)
    assert st == status, r
    assert set(r) == {"error"} and set(r["error"]) == {"message", "type", "param", "code"}, r
    assert isinstance(r["error"]["message"], str) and r["error"]["message"]
    if param is not None:
        assert r["error"]["param"] == param, r
    still_serving(s, ok_headers if ok_headers is not None else headers)
    return r["error"]


BAD = [
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -5}, "top_k"),
    ({"prompt": "hi", "min_p": 2}, "min_p"),
    ({"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "n": 9}, "n"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 1000}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "hi", "logprobs": True}, "logprobs"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 1000}}, "logit_bias"),
    ({"prompt": "hi", "seed": "x"}, "seed"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "stream_options": 3}, "stream_options"),
    ({"prompt": "hi", "return_token_ids": 1}, "return_token_ids"),
    ({"prompt": [151936]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
    ({"prompt": [1] * 300}, "prompt"),
    ({"prompt": [1] * 250, "max_tokens": 10}, "max_tokens"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_completion_params(srv, body, param):
    e = check_error(srv, 400, "/v1/completions", body, param=param)
    assert e["type"] == "invalid_request_error"


CHAT_BAD = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 2}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": []}, "tool_choice"),
]


@pytest.mark.parametrize("body,param", CHAT_BAD, ids=[p for _, p in CHAT_BAD])
def test_bad_chat_params(srv, body, param):
    check_error(srv, 400, "/v1/chat/completions", body, param=param)


def test_malformed_json(srv):
    check_error(srv, 400, "/v1/completions", raw=b'{"prompt": "hi",')
    check_error(srv, 400, "/v1/completions", raw=b'[1, 2]')
    check_error(srv, 400, "/v1/completions", raw=b'')


def test_invalid_utf8(srv):
    check_error(srv, 400, "/v1/completions", raw=b'{"prompt": "\xff\xfe bad"}')
    check_error(srv, 400, "/v1/chat/completions", raw=b'{"messages": [{"role": "user", "content": "\xc3"}]}')


def test_unknown_model_is_404(srv):
    e = check_error(srv, 404, "/v1/completions", {"model": "gpt-5", "prompt": "hi"})
    assert e["code"] == "model_not_found"
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny-qwen3", prompt="hi", max_tokens=10000)
    still_serving(srv)


def test_unknown_route_and_method(srv):
    check_error(srv, 404, "/v1/nothing", {})
    check_error(srv, 405, "/v1/completions", method="GET")


def test_admin_needs_token(srv):
    check_error(srv, 401, "/admin/v1/weights", method="GET")
    check_error(srv, 401, "/pause", {}, headers={"Authorization": "Bearer wrong"})
    st, r = srv.request("GET", "/admin/v1/weights", headers={"Authorization": "Bearer " + ADMIN})
    assert st == 200 and r["version"] == 0 and len(r["tensors"]) > 0


def test_client_disconnect_aborts(srv):
    body = json.dumps({"prompt": "hi", "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data:" not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        s.close()
    import time
    for _ in range(200):
        st, m = srv.request("GET", "/metrics")
        run = [l for l in m.splitlines() if l.startswith("sampler_num_requests_running ")]
        disc = [l for l in m.splitlines() if l.startswith("sampler_stream_disconnects_total ")]
        if run and float(run[0].split()[1]) == 0 and int(disc[0].split()[1]) >= 3:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("disconnected streams were not aborted:\n" + m)
    ab = [l for l in m.splitlines() if 'finish_reason="abort"' in l]
    assert int(ab[0].split()[1]) >= 3
    still_serving(srv)


def test_client_disconnect_aborts_whole_response(srv):
    import time

    def aborted():
        m = srv.request("GET", "/metrics")[1]
        return int(float([l for l in m.splitlines() if 'finish_reason="abort"' in l][0].split()[1]))

    before = aborted()
    # n = 8 x 255 tokens (max-model-len 256) with top-p over the whole vocabulary: seconds of work, so it
    # is still running when the client leaves (one 200-token sample took ~0.5 s: too short to be sure)
    body = json.dumps({"prompt": "hi", "n": 8, "max_tokens": 255, "ignore_eos": True, "top_p": 0.5}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 30  # the request runs, then its client leaves
    while metrics(srv)["sampler_num_requests_running"] == 0:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.01)
    s.close()
    deadline = time.monotonic() + 30
    while aborted() <= before:
        assert time.monotonic() < deadline, "a whole-response request was not aborted when its client left"
        time.sleep(0.05)
    still_serving(srv)


def test_auth_and_body_limit():
    s = Server("--max-body-bytes", "4096", api_key="sk-test")
    try:
        h = {"Authorization": "Bearer sk-test"}
        check_error(s, 401, "/v1/completions", {"prompt": "hi"}, headers={"Authorization": "Bearer nope"}, ok_headers=h)
        st, _ = s.request("GET", "/v1/models")
        assert st == 401
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
        e = check_error(s, 413, "/v1/completions", {"prompt": "x" * 10000}, headers=h)
        assert e["code"] == "request_too_large"
        # health and metrics need no key
        assert s.request("GET", "/metrics")[0] == 200
        check_error(s, 401, "/pause", {}, headers=h)
    finally:
        assert s.stop() == 0


def test_queue_full_is_503():
    s = Server("--max-waiting", "1", "--max-running-seqs", "1")
    try:
        body = {"prompt": "hi", "max_tokens": 24, "ignore_eos": True, "top_p": 0.5}

        def one(_):
            return s.post("/v1/completions", body)

        with cf.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, range(8)))
        codes = sorted(st for st, _ in res)
        assert 200 in codes and 503 in codes, codes
        for st, r in res:
            if st == 503:
                assert r["error"]["type"] == "server_error" and r["error"]["code"] == "overloaded"
        still_serving(s)
    finally:
        assert s.stop() == 0
