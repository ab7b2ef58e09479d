"""Structured outputs (README "Structured outputs"): every constrained output of
the tiny model at temperature 1 parses and validates (jsonschema, re, a
parser) against what was asked; the RL fields are those of the constrained
distribution; bad schemas and grammars are 400s naming what is unsupported."""
import json
import math
import os
import re

import jsonschema
import pytest

from conftest import ROOT
from sampling_mask import decode_sampling_mask
from server_fixture import Server, metrics, wait_until

N = 12  # samples per request


@pytest.fixture(scope="module")
def srv():
    s = Server()
    yield s
    assert s.stop() == 0


def complete(srv, **kw):
    body = dict(prompt="Answer in JSON:", max_tokens=200, temperature=1.0, n=N, seed=7)
    body.update(kw)
    st, r = srv.post("/v1/completions", body)
    assert st == 200, r
    return r["choices"]


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer"},
    "skills": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
    "work": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "company": {"type": "string", "maxLength": 8}, "duration": {"type": "number"},
        "position": {"enum": ["eng", "pm", None]}}, "required": ["company", "position"]}}},
    "required": ["name", "age", "skills"], "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}, {"const": "x"}]},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
CODE = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                         "ok": {"type": ["boolean", "null"]}}, "required": ["id", "ok"]}


@pytest.mark.parametrize("field", ["response_format", "guided_json", "structured_outputs"])
@pytest.mark.parametrize("schema", [PERSON, TREE, CODE], ids=["person", "tree", "pattern"])
def test_json_schema_outputs_validate(srv, schema, field):
    if field == "response_format":
        kw = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}}
    elif field == "guided_json":
        kw = {"guided_json": schema}
    else:
        kw = {"structured_outputs": {"json": schema}}
    for c in complete(srv, n=N if field == "response_format" else 4, **kw):
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["text"]), schema)


def test_json_object_mode(srv):
    stops = 0
    for c in complete(srv, response_format={"type": "json_object"}, max_tokens=100, n=8):
        assert c["text"].startswith("{"), c
        if c["finish_reason"] == "stop":
            stops += 1
            assert isinstance(json.loads(c["text"]), dict)
    assert stops > 0


@pytest.mark.parametrize("rx", [r"[a-c]{2,5}x", r"(\d{1,3}\.){3}\d{1,3}", r"(yes|no)( maybe)?!?", r"[A-Z][a-z]{0,4}\s\w{2}"])
def test_guided_regex(srv, rx):
    for c in complete(srv, guided_regex=rx, max_tokens=40):
        assert c["finish_reason"] == "stop" and re.fullmatch(rx, c["text"]), c


def test_guided_choice(srv):
    opts = ["positive", "negative", "neutral"]
    for c in complete(srv, guided_choice=opts, max_tokens=10):
        assert c["finish_reason"] == "stop" and c["text"] in opts, c


# nesting bounded by the rules themselves: the tiny model at T = 1 likes "((((" tokens
ARITH = """
root ::= e2
e2 ::= t2 (op t2){0,3}
t2 ::= num | "(" e1 ")"
e1 ::= t1 (op t1){0,2}
t1 ::= num | "(" num ")"
op ::= "+" | "-"
num ::= [1-9] [0-9]?
"""


def test_guided_grammar(srv):
    for c in complete(srv, guided_grammar=ARITH, max_tokens=60):
        t = c["text"]
        assert c["finish_reason"] == "stop" and re.fullmatch(r"[0-9+\-()]+", t), c
        eval(compile(t, "<grammar>", "eval"), {"__builtins__": {}})  # parses as an expression


def test_chat_response_format(srv):
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 8, "seed": 3,
                                              "temperature": 1.0, "max_tokens": 200,
                                              "response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "c", "schema": CODE}}})
    assert st == 200, r
    for c in r["choices"]:
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["message"]["content"]), CODE)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False),
                                             ({"type": "function", "function": {"name": "add"}}, True)],
                         ids=["required", "required-one", "named"])
def test_forced_tool_calls(srv, choice, parallel, stream):
    from openai import OpenAI
    client = OpenAI(base_url=srv.url + "/v1", api_key="x")
    kw = dict(model="tiny-qwen3", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              tool_choice=choice, temperature=1.0, max_tokens=240, seed=5, parallel_tool_calls=parallel)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    outs = []  # (finish, [(name, arguments)])
    if stream:
        for i in range(2):
            calls, finish = {}, None
            for ch in client.chat.completions.create(stream=True, **dict(kw, seed=5 + i)):
                for tc in ch.choices[0].delta.tool_calls or []:
                    e = calls.setdefault(tc.index, ["", ""])
                    e[0] += tc.function.name or ""
                    e[1] += tc.function.arguments or ""
                finish = ch.choices[0].finish_reason or finish
            outs.append((finish, [tuple(calls[k]) for k in sorted(calls)]))
    else:
        r = client.chat.completions.create(n=5, **kw)
        outs = [(c.finish_reason, [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []])
                for c in r.choices]
    for finish, calls in outs:
        # one call, or (parallel) calls until EOS; the tiny model at T = 1 may
        # keep calling until max_tokens: then every complete call still counts
        assert calls and (finish == "tool_calls" or (parallel and choice == "required" and finish == "length"
                                                     and len(calls) >= 3)), (finish, calls)
        assert parallel or len(calls) == 1, calls
        for name, args in calls:
            assert choice == "required" or name == "add"
            jsonschema.validate(json.loads(args), schemas[name])


def byte_decoder():
    """GPT-2's byte-level alphabet, reversed: the bytes each vocab character stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes():
    tj = json.load(open(os.path.join(ROOT, "models/tiny-qwen3/tokenizer.json")))
    dec = byte_decoder()
    out = {i: bytes(dec[ch] for ch in tok) for tok, i in tj["model"]["vocab"].items()}
    for a in tj["added_tokens"]:
        out[a["id"]] = None if a["special"] else a["content"].encode()
    return out


def test_constrained_rl_fields(srv):
    """The mask of the first token is every id whose bytes start one of the
    choices (computed here from tokenizer.json); the constrained log-probs
    renormalise over it (top_logprobs of the mask sum to 1). raw_logprobs too
    are over the grammar's allowed set, as vLLM's (it applies the bitmask to
    the logits before its sampler), so at temperature 1 with nothing truncated
    sampler_logprob == raw_logprob for every token."""
    opts = ["yes", "no", "maybe"]
    tb = token_bytes()
    want0 = sorted(i for i, b in tb.items() if b and any(o.encode().startswith(b) for o in opts))
    assert 3 <= len(want0) <= 20
    st, r = srv.post("/v1/completions", {"prompt": "Is it?", "max_tokens": 8, "temperature": 1.0, "n": 8, "seed": 11,
                                         "guided_choice": opts, "logprobs": 20, "return_token_ids": True,
                                         "return_sampler_logprobs": True, "return_raw_logprobs": True,
                                         "return_sampling_mask": True})
    assert st == 200, r
    shifts = []
    for c in r["choices"]:
        assert c["text"] in opts and c["grammar_mask_applied"] is True
        masks = decode_sampling_mask(c["sampling_mask"])
        assert masks[0].tolist() == want0
        for k, (tok, m, lp, raw) in enumerate(zip(c["token_ids"], masks, c["sampler_logprobs"], c["raw_logprobs"])):
            assert tok in m
            top = c["logprobs"]["top_logprobs"][k]
            if len(m) <= 20:
                s = sum(math.exp(v) for v in top.values() if v > -1000)
                assert abs(s - 1) < 1e-3, (k, s, top)
            shifts.append(lp - raw)
    assert max(abs(x) for x in shifts) < 1e-4, shifts


def test_unconstrained_flag_is_false(srv):
    st, r = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "return_sampler_logprobs": True})
    assert st == 200 and r["choices"][0]["grammar_mask_applied"] is False, r


@pytest.mark.parametrize("body,param,needle", [
    ({"guided_json": {"type": "object", "oneOf": []}}, "guided_json", "oneOf"),
    ({"guided_json": {"type": "integer", "minimum": 0}}, "guided_json", "minimum"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}}}},
     "response_format", "format"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"guided_regex": "(?=x)y"}, "guided_regex", "lookaround"),
    ({"guided_grammar": "root ::= root \"a\" | \"b\""}, "guided_grammar", "left-recursive"),
    ({"guided_grammar": "root ::= item"}, "guided_grammar", "not defined"),
    ({"guided_choice": "yes"}, "guided_choice", "list"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs", "only one"),
])
def test_bad_constraints_are_400(srv, body, param, needle):
    b = dict(prompt="x", max_tokens=4)
    b.update(body)
    st, r = srv.post("/v1/completions", b)
    assert st == 400 and r["error"]["param"] == param and needle in r["error"]["message"], r


def test_bad_tool_choice_is_400(srv):
    base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    st, r = srv.post("/v1/chat/completions", dict(base, tool_choice="required"))
    assert st == 400 and r["error"]["param"] == "tool_choice", r
    st, r = srv.post("/v1/chat/completions", dict(base, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}))
    assert st == 400 and "nope" in r["error"]["message"], r


def test_dead_end_finish_reason(srv):
    st, r = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 4, "guided_regex": "zq", "min_tokens": 3})
    assert st == 200, r
    c = r["choices"][0]
    # "zq" is complete after at most 2 tokens; min_tokens bans EOS, the only id left: a dead end
    assert c["finish_reason"] == "grammar_dead_end" and c["text"] == "zq", c
    # the counter moves when the engine retires the sequence, which may come after the response
    key = 'sampler_sequences_finished_total{finish_reason="grammar_dead_end"}'
    wait_until(lambda: metrics(srv).get(key, 0) >= 1, "the grammar_dead_end counter")
