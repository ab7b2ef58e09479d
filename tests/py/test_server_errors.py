"""Every error case answers with the OpenAI error shape and the right status,
and the server keeps serving after each."""
import concurrent.futures as cf
import json
import socket

import openai
import pytest

from server_fixture import ADMIN, Server, metrics, wait_until


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
    seen = {}

    def aborted():
        m = seen["m"] = metrics(srv)
        return m["sampler_num_requests_running"] == 0 and m["sampler_stream_disconnects_total"] >= 3
    wait_until(aborted, lambda: f"disconnected streams aborted ({seen.get('m')})")
    assert seen["m"]['sampler_sequences_finished_total{finish_reason="abort"}'] >= 3
    still_serving(srv)


def test_client_disconnect_aborts_whole_response(srv):
    def aborted():
        return metrics(srv)['sampler_sequences_finished_total{finish_reason="abort"}']

    before = aborted()
    tokens = metrics(srv)["sampler_generation_tokens_total"]
    # n = 8 x 255 tokens (max-model-len 256) with top-p over the whole vocabulary: seconds of work, so it
    # is still running when the client leaves (one 200-token sample took ~0.5 s: it could finish first)
    body = json.dumps({"prompt": "hi", "n": 8, "max_tokens": 255, "ignore_eos": True, "top_p": 0.5}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    # under way (it has generated), so the close lands on a running request
    wait_until(lambda: metrics(srv)["sampler_generation_tokens_total"] > tokens, "the request generating")
    s.close()
    wait_until(lambda: aborted() > before, "a whole-response request aborted when its client left")
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
