"""POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API)
with the official anthropic client: a tool round trip whose prompts equal what
/v1/chat/completions renders for the same conversation (chat's prompts are
checked against transformers' template by test_server_chat.py), thinking on
and off, the stop reasons, the stream's event sequence agreeing with the whole
answer, the RL fields, the token-in path, x-api-key auth and Anthropic's error
shape. The agent model (agent_model.py) really emits reasoning and tool calls."""
import json
import urllib.request

import anthropic
import pytest

from agent_model import CALL_TEXT, CHAT_TOOLS, PLAIN, REASONING, WEATHER_SCHEMA, agent_server, ids
from server_fixture import Server

KEY = "k-anthropic"
AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]
USER = {"role": "user", "content": "Weather in Paris?"}
THINK = {"type": "enabled", "budget_tokens": 1024}
M = "tiny-qwen3"


@pytest.fixture(scope="module")
def tiny():
    s = Server()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def agent(tiny, tmp_path_factory):
    s = agent_server(tiny, tmp_path_factory, api_key=KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(agent):
    return anthropic.Anthropic(base_url=agent.url, api_key=KEY, max_retries=0)


def chat_ids(agent, messages, tools=None, **kw):
    """The prompt /v1/chat/completions renders for these chat messages."""
    body = dict(messages=messages, **kw)
    if tools:
        body["tools"] = tools
    st, t = agent.post("/tokenize", body, headers=AUTH)
    assert st == 200, t
    return t["tokens"]


def call_turn(client, **kw):
    # temperature: sent as an extra field (the anthropic client of today has no parameter for it)
    args = dict(model=M, max_tokens=60, messages=[USER], tools=TOOLS, thinking=THINK,
                extra_body={"return_token_ids": True, "return_sampler_logprobs": True, "temperature": 0})
    extra = kw.pop("extra_body", {})
    args.update(kw)
    args["extra_body"] = dict(args["extra_body"], **extra)
    return client.messages.create(**args)


def test_tool_use_whole(client, agent):
    m = call_turn(client)
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == REASONING
    tu = m.content[1]
    assert tu.name == "get_weather" and tu.input == {"city": "Paris"} and tu.id.startswith("toolu_")
    assert m.stop_reason == "tool_use" and m.stop_sequence is None and m.role == "assistant"
    ex = m.model_extra
    assert ex["prompt_token_ids"] == chat_ids(agent, [USER], CHAT_TOOLS)  # thinking on: the template's default
    assert m.usage.input_tokens == len(ex["prompt_token_ids"])
    assert m.usage.output_tokens == len(ex["token_ids"]) == len(ex["sampler_logprobs"])
    assert ex["weight_versions"] == [0] and all(lp <= 0 for lp in ex["sampler_logprobs"])
    n = client.messages.count_tokens(model=M, messages=[USER], tools=TOOLS, thinking=THINK)
    assert n.input_tokens == m.usage.input_tokens


def test_tool_result_round_trip(client, agent):
    m1 = call_turn(client)
    tu = m1.content[1]
    msgs = [USER, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny, 21 C"}]}]
    m2 = call_turn(client, messages=msgs)
    chat = [USER, {"role": "assistant", "content": "", "reasoning_content": REASONING,
                   "tool_calls": [{"id": tu.id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": tu.id, "content": "sunny, 21 C"}]
    assert m2.model_extra["prompt_token_ids"] == chat_ids(agent, chat, CHAT_TOOLS)
    assert m2.stop_reason == "tool_use"
    n = client.messages.count_tokens(model=M, messages=msgs, tools=TOOLS, thinking=THINK)
    assert n.input_tokens == m2.usage.input_tokens


def test_thinking_off(client, agent):
    for thinking in (None, {"type": "disabled"}):  # Anthropic's default is no thinking
        kw = {"thinking": thinking} if thinking else {}
        m = client.messages.create(model=M, max_tokens=20, messages=[USER],
                                   extra_body={"return_token_ids": True, "temperature": 0}, **kw)
        assert [b.type for b in m.content] == ["text"] and m.content[0].text == PLAIN
        assert m.stop_reason == "end_turn"
        assert m.model_extra["prompt_token_ids"] == chat_ids(agent, [USER],
                                                             chat_template_kwargs={"enable_thinking": False})


def test_stop_reasons(client):
    m = call_turn(client, stop_sequences=["check"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "check"
    assert [(b.type, b.thinking) for b in m.content] == [("thinking", "Let me ")]
    m = call_turn(client, max_tokens=3)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    m = call_turn(client, tool_choice={"type": "none"})  # the call is not parsed: it stays text
    assert [b.type for b in m.content] == ["thinking", "text"] and m.content[1].text == CALL_TEXT
    assert m.stop_reason == "end_turn"
    m = call_turn(client, tool_choice={"type": "auto"})
    assert m.stop_reason == "tool_use"


def test_stream_matches_whole(client):
    whole = call_turn(client)
    raw = list(call_turn(client, stream=True))
    kinds = [e.type for e in raw]
    squeezed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert squeezed == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                        "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                        "message_stop"]
    assert raw[0].message.usage.input_tokens == whole.usage.input_tokens
    assert [e.index for e in raw if e.type == "content_block_start"] == [0, 1]
    md = raw[-2]
    assert md.delta.stop_reason == "tool_use" and md.usage.output_tokens == whole.usage.output_tokens
    assert md.model_extra["token_ids"] == whole.model_extra["token_ids"]
    assert md.model_extra["sampler_logprobs"] == pytest.approx(whole.model_extra["sampler_logprobs"], abs=1e-6)
    with client.messages.stream(model=M, max_tokens=60, messages=[USER], tools=TOOLS, thinking=THINK,
                                extra_body={"temperature": 0}) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
        final = s.get_final_message()
    assert thinking == REASONING
    dump = lambda m: [{k: v for k, v in b.model_dump().items() if k != "id"} for b in m.content]
    assert dump(final) == dump(whole) and final.stop_reason == whole.stop_reason


def test_stream_has_ping_and_named_events(agent):
    body = json.dumps({"model": M, "max_tokens": 4, "messages": [USER], "stream": True}).encode()
    req = urllib.request.Request(agent.url + "/v1/messages", data=body, method="POST",
                                 headers=dict(AUTH, **{"Content-Type": "application/json"}))
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    events = [l[len("event: "):] for l in text.splitlines() if l.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"] and events[-2:] == ["message_delta", "message_stop"]
    datas = [json.loads(l[len("data: "):]) for l in text.splitlines() if l.startswith("data: ")]
    assert [d["type"] for d in datas] == events


def test_token_in_path(client, agent):
    """The Qwen3 template rewrites the assistant turn it renders back (whitespace around <think> and the
    tool call, the call's JSON re-serialized), so the rendered next prompt does not start with the tokens
    the model saw and sampled; prompt_token_ids sends those tokens exactly."""
    m1 = call_turn(client)
    p1, o1 = m1.model_extra["prompt_token_ids"], m1.model_extra["token_ids"]
    tu = m1.content[1]
    msgs = [USER, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}]
    rendered = call_turn(client, messages=msgs, max_tokens=1).model_extra["prompt_token_ids"]
    assert rendered[:len(p1)] == p1 and rendered[:len(p1) + len(o1)] != p1 + o1
    sent = p1 + o1 + ids(agent_with_key(agent), "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
                                               "<|im_end|>\n<|im_start|>assistant\n")
    m2 = call_turn(client, messages=msgs, extra_body={"prompt_token_ids": sent, "return_token_ids": True})
    assert m2.model_extra["prompt_token_ids"] == sent and m2.usage.input_tokens == len(sent)
    assert [b.type for b in m2.content] == ["thinking", "tool_use"]
    n = client.messages.count_tokens(model=M, messages=msgs, extra_body={"prompt_token_ids": sent})
    assert n.input_tokens == len(sent)


class agent_with_key:
    """agent's post with the API key, for agent_model.ids."""
    def __init__(self, agent):
        self.agent = agent

    def post(self, path, body):
        return self.agent.post(path, body, headers=AUTH)


def anthropic_error(e):
    assert e.body["type"] == "error" and set(e.body["error"]) == {"type", "message"}, e.body
    return e.body["error"]


def test_errors_in_anthropic_shape(client, agent):
    bad = anthropic.Anthropic(base_url=agent.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=M, max_tokens=4, messages=[USER])
    assert anthropic_error(e.value)["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=4, messages=[USER])
    assert anthropic_error(e.value)["type"] == "not_found_error"
    cases = [
        (dict(tool_choice={"type": "tool", "name": "no_such_tool"}, tools=TOOLS), "tool_choice"),
        (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type":
                                                                                  "image/png", "data": "AA=="}}]}]),
         "messages[0].content[0].type"),
        (dict(messages=[USER, {"role": "assistant", "content": "The weather is"}]), "prefill"),
        (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (dict(thinking={"type": "sometimes"}), "thinking.type"),
        (dict(stop_sequences="x"), "stop_sequences"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=5000), "max_tokens"),  # prompt + max_tokens over the context
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    ]
    for kw, what in cases:
        args = dict(model=M, max_tokens=4, messages=[USER])
        args.update(kw)
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**args)
        err = anthropic_error(e.value)
        assert err["type"] == "invalid_request_error" and what in err["message"], (kw, err)
    st, r = agent.post("/v1/messages", {"messages": [USER]}, headers=AUTH)
    assert st == 400 and r["error"]["message"].startswith("max_tokens:") and r["type"] == "error"
    st, r = agent.post("/v1/messages", None, headers=AUTH, raw=b"{not json")
    assert st == 400 and r["type"] == "error" and r["error"]["type"] == "invalid_request_error"
    st, r = agent.post("/v1/messages/count_tokens", {"messages": []}, headers=AUTH)
    assert st == 400 and r["error"]["message"].startswith("messages:")
    st, r = agent.request("GET", "/v1/messages", headers=AUTH)
    assert st == 405 and r["type"] == "error"
    # the OpenAI routes keep OpenAI's shape, and take x-api-key too
    st, r = agent.post("/v1/chat/completions", {"messages": [USER], "tool_choice": "required"}, headers=AUTH)
    assert st == 400 and r["error"]["param"] == "tool_choice"


# an enum, so that the agent model (trained to write one call) ends the
# forced call's arguments within a few tokens whatever it would have written
ENUM_SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
               "additionalProperties": False}


def test_forced_tool_choice(client):
    """tool_choice any and a named tool: the answer is a tool_use of a listed
    tool with input of its schema, stop_reason tool_use (a grammar over the
    tool schemas, as on chat)."""
    enum_tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": ENUM_SCHEMA}]
    # "any" alone allows several calls (the agent model would write a second one to max_tokens)
    for tc in ({"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}):
        m = call_turn(client, tool_choice=tc, tools=enum_tools, max_tokens=120)
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses and all(u.name == "get_weather" for u in uses), (tc, m.content)
        for u in uses:
            assert u.input in ({"city": "Paris"}, {"city": "Rome"}), (tc, u.input)
        assert m.stop_reason == "tool_use", (tc, m.stop_reason, m.content)
