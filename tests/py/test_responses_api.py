"""POST /v1/responses (the OpenAI Responses API) with the official openai
client: a function-tool round trip whose prompts equal what
/v1/chat/completions renders for the same conversation (chat's prompts are
checked against transformers' template by test_server_chat.py), reasoning
items, the stream's event sequence agreeing with the whole answer, statuses,
the RL fields, statelessness and OpenAI's error shape. The agent model
(agent_model.py) really emits reasoning and tool calls."""
import json

import openai
import pytest

from agent_model import CALL_TEXT, CHAT_TOOLS, PLAIN, REASONING, WEATHER_SCHEMA, agent_server
from server_fixture import Server

M = "tiny-qwen3"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_SCHEMA}]
Q = "Weather in Paris?"
USER = {"role": "user", "content": Q}


@pytest.fixture(scope="module")
def tiny():
    s = Server()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def agent(tiny, tmp_path_factory):
    s = agent_server(tiny, tmp_path_factory)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(agent):
    return openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0)


def chat_ids(agent, messages, tools=None, **kw):
    """The prompt /v1/chat/completions renders for these chat messages."""
    body = dict(messages=messages, **kw)
    if tools:
        body["tools"] = tools
    st, t = agent.post("/tokenize", body)
    assert st == 200, t
    return t["tokens"]


def call_turn(client, **kw):
    args = dict(model=M, input=Q, tools=TOOLS, temperature=0, max_output_tokens=60,
                extra_body={"return_token_ids": True, "return_sampler_logprobs": True})
    args.update(kw)
    return client.responses.create(**args)


def test_function_call_whole(client, agent):
    r = call_turn(client, instructions="Be brief.")
    assert r.object == "response" and r.status == "completed" and r.store is False
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    rs, fc = r.output
    assert [c.text for c in rs.content] == [REASONING] and rs.id.startswith("rs_")
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    assert fc.call_id.startswith("call_") and fc.status == "completed"
    ex = r.model_extra
    assert ex["prompt_token_ids"] == chat_ids(agent, [{"role": "system", "content": "Be brief."}, USER], CHAT_TOOLS)
    assert r.usage.input_tokens == len(ex["prompt_token_ids"])
    assert r.usage.output_tokens == len(ex["token_ids"]) == len(ex["sampler_logprobs"])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # <think> + "Let me check." + </think>: the reasoning tokens, counted from the sampled ids
    assert r.usage.output_tokens_details.reasoning_tokens == ex["token_ids"].index(ex["token_ids"][0] + 1) + 1
    assert r.output_text == "" and r.tools[0].name == "get_weather" and r.instructions == "Be brief."


def test_function_call_output_round_trip(client, agent):
    r1 = call_turn(client)
    fc = r1.output[1]
    items = [USER] + [o.model_dump(exclude_none=True) for o in r1.output] + [
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}]
    r2 = call_turn(client, input=items)
    chat = [USER, {"role": "assistant", "content": "", "reasoning_content": REASONING,
                   "tool_calls": [{"id": fc.call_id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": fc.arguments}}]},
            {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny, 21 C"}]
    assert r2.model_extra["prompt_token_ids"] == chat_ids(agent, chat, CHAT_TOOLS)
    assert [o.type for o in r2.output] == ["reasoning", "function_call"]
    # an assistant message item and developer role render as chat's assistant / system
    items = [{"role": "developer", "content": "Be brief."}, USER,
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris?"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Yes."}]}]
    r3 = call_turn(client, input=items, max_output_tokens=1)
    assert r3.model_extra["prompt_token_ids"] == chat_ids(agent, [
        {"role": "system", "content": "Be brief."}, USER, {"role": "assistant", "content": "Paris?"},
        {"role": "user", "content": "Yes."}], CHAT_TOOLS)


def test_statuses_and_text(client):
    r = call_turn(client, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"
    r = call_turn(client, tool_choice="none")  # the call is not parsed: it stays text
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == CALL_TEXT
    assert r.status == "completed" and r.output[1].content[0].type == "output_text"
    r = call_turn(client, reasoning={"effort": "none"}, tools=None)  # no thinking: plain text
    assert [o.type for o in r.output] == ["message"] and r.output_text == PLAIN
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_stream_matches_whole(client):
    whole = call_turn(client)
    events = list(call_turn(client, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    squeezed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert squeezed == ["response.created", "response.in_progress",
                        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                        "response.output_item.added", "response.function_call_arguments.delta",
                        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == REASONING
    final = events[-1].response
    dump = lambda r: [{k: v for k, v in o.model_dump().items() if k not in ("id", "call_id", "parsed_arguments")}
                      for o in r.output]
    assert dump(final) == dump(whole) and final.usage == whole.usage
    assert final.model_extra["token_ids"] == whole.model_extra["token_ids"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    # the client's own accumulator
    with client.responses.stream(model=M, input=Q, tools=TOOLS, temperature=0, max_output_tokens=60) as s:
        got = s.get_final_response()
    assert dump(got) == dump(whole)


def test_stream_text(client):
    events = list(call_turn(client, stream=True, reasoning={"effort": "none"}, tools=None))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == PLAIN and events[-1].type == "response.completed"
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == PLAIN


def test_errors_in_openai_shape(client, agent):
    cases = [
        (dict(previous_response_id="resp_123"), "previous_response_id"),
        (dict(tool_choice={"type": "function", "name": "no_such_tool"}), "tool_choice"),
        (dict(tools=[{"type": "web_search"}]), "tools[0]"),
        (dict(input=[{"type": "image_generation_call", "id": "x"}]), "input[0].type"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]),
         "input[0].content[0]"),
        (dict(input=[]), "input"),
        (dict(max_output_tokens=0), "max_output_tokens"),
        (dict(max_output_tokens=5000), "max_output_tokens"),
        (dict(temperature=-1), "temperature"),
        (dict(text={"format": {"type": "json_object"}}), "text.format"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(extra_body={"prompt_logprobs": 1}), "prompt_logprobs"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            call_turn(client, **kw)
        err = e.value.body
        assert err["message"].startswith(param), (kw, err)
        assert e.value.status_code == 400 and err["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_123")  # stateless: nothing to get
    assert e.value.body["code"] == "response_not_found" and "stores no responses" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        call_turn(client, model="no-such-model")
    st, r = agent.post("/v1/responses", None, raw=b"[1]")
    assert st == 400 and set(r["error"]) == {"message", "type", "param", "code"}


# an enum, so that the agent model (trained to write one call) ends the
# forced call's arguments within a few tokens whatever it would have written
ENUM_SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
               "additionalProperties": False}


def test_forced_tool_choice(client):
    """tool_choice "required" and a named function: the output is a call of a
    listed tool whose arguments are JSON of its schema (a grammar over the tool
    schemas, as on chat: README "Structured outputs")."""
    enum_tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
                   "parameters": ENUM_SCHEMA}]
    for tc in ("required", {"type": "function", "name": "get_weather"}):
        r = call_turn(client, tool_choice=tc, tools=enum_tools, parallel_tool_calls=False, max_output_tokens=120)
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and r.status == "completed", (tc, r.output)
        for c in calls:
            args = json.loads(c.arguments)
            assert args in ({"city": "Paris"}, {"city": "Rome"}), (tc, args)
