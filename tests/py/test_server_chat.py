"""/v1/chat/completions with the openai client: prompts equal transformers'
apply_chat_template (goldens), whole and streamed responses agree, n > 1,
logprobs, and tool calls / reasoning parsed from a model that really emits
them (successor_model.py), whole and streamed."""
import json
import os

import openai
import pytest

from conftest import ROOT
from server_fixture import Server
from successor_model import write_successor_model

GOLDEN = json.load(open(os.path.join(ROOT, "tests/data/server_chat_golden.json")))
TOOLS = GOLDEN[2]["tools"]


@pytest.fixture(scope="module")
def srv():
    s = Server()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def body_of(case):
    b = {k: case[k] for k in ("messages", "tools", "chat_template_kwargs", "add_generation_prompt") if k in case}
    return b


@pytest.mark.parametrize("i", range(len(GOLDEN)))
def test_prompt_equals_transformers_template(srv, i):
    case = GOLDEN[i]
    st, r = srv.post("/v1/chat/completions", dict(body_of(case), max_tokens=1, return_token_ids=True))
    assert st == 200, r
    assert r["prompt_token_ids"] == case["prompt_token_ids"]
    assert r["usage"]["prompt_tokens"] == len(case["prompt_token_ids"])
    st, t = srv.post("/tokenize", body_of(case))
    assert st == 200 and t["tokens"] == case["prompt_token_ids"]


def test_text_parts_are_joined(srv):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}]
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "return_token_ids": True})
    assert st == 200 and r["prompt_token_ids"] == GOLDEN[0]["prompt_token_ids"]


def test_whole_and_stream_agree(client):
    kw = dict(model="tiny-qwen3", messages=GOLDEN[0]["messages"], max_tokens=8, seed=9, n=2)
    whole = client.chat.completions.create(**kw, extra_body={"return_token_ids": True})
    assert len(whole.choices) == 2 and whole.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"return_token_ids": True}))
    for ch in whole.choices:
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == ch.index)
        ids = [i for c in chunks if c.choices and c.choices[0].index == ch.index
               for i in (c.choices[0].model_extra.get("token_ids") or [])]
        assert text == ch.message.content
        assert ids == ch.model_extra["token_ids"]
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant", "assistant"]
    assert chunks[-1].usage.completion_tokens == 16
    assert whole.model_extra["prompt_token_ids"] == GOLDEN[0]["prompt_token_ids"]


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="tiny-qwen3", messages=GOLDEN[0]["messages"], max_tokens=4, seed=1,
                                       logprobs=True, top_logprobs=3, extra_body={"return_sampler_logprobs": True})
    c = r.choices[0]
    assert len(c.logprobs.content) == 4
    for e, lp in zip(c.logprobs.content, c.model_extra["sampler_logprobs"]):
        assert abs(e.logprob - lp) < 1e-6 and len(e.top_logprobs) == 3
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob


@pytest.fixture(scope="module")
def tool_srv(srv, tmp_path_factory):
    text = '<think>Let me check.</think><tool_call>{"arguments":{"city":"Paris"},"name": "get_weather"}</tool_call>'
    st, t = srv.post("/tokenize", {"prompt": text})
    st, p = srv.post("/tokenize", {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS})
    st, eos = srv.post("/tokenize", {"prompt": "<|im_end|>"})
    chain = [p["tokens"][-1]] + t["tokens"] + eos["tokens"]
    d = write_successor_model(str(tmp_path_factory.mktemp("succ")), chain)
    s = Server(model=d, *("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3")))
    yield s
    assert s.stop() == 0


def test_tool_calls_whole(tool_srv):
    c = openai.OpenAI(base_url=tool_srv.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model=c.models.list().data[0].id,
                                  messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                  temperature=0, max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.model_extra.get("reasoning_content") == "Let me check."
    assert ch.message.content is None
    assert len(ch.message.tool_calls) == 1
    tc = ch.message.tool_calls[0]
    assert tc.type == "function" and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    assert r.usage.completion_tokens == 22  # 21 chain tokens + <|im_end|>


def test_tool_calls_streamed(tool_srv):
    c = openai.OpenAI(base_url=tool_srv.url + "/v1", api_key="x", max_retries=0)
    chunks = list(c.chat.completions.create(model=c.models.list().data[0].id,
                                            messages=[{"role": "user", "content": "Weather in Paris?"}],
                                            tools=TOOLS, temperature=0, max_tokens=40, stream=True))
    reasoning = "".join(x.choices[0].delta.model_extra.get("reasoning_content") or "" for x in chunks)
    content = "".join(x.choices[0].delta.content or "" for x in chunks)
    calls = [tc for x in chunks for tc in (x.choices[0].delta.tool_calls or [])]
    assert reasoning == "Let me check." and content == ""
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_text(tool_srv):
    st, r = tool_srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                                                   "tools": TOOLS, "tool_choice": "none", "temperature": 0,
                                                   "max_tokens": 40})
    assert st == 200
    m = r["choices"][0]["message"]
    assert m["tool_calls"] == [] and r["choices"][0]["finish_reason"] == "stop"
    assert m["content"].startswith("<tool_call>{") and m["content"].endswith("</tool_call>")
