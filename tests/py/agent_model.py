"""The model the agent-dialect tests (test_responses_api.py, test_messages_api.py,
test_agent_harness.py) generate real tool calls and reasoning with: a successor
model (successor_model.py) holding two chains. After a generation prompt with
thinking on (it ends in "\\n") greedy decoding yields REASONING in <think>, one
get_weather call for Paris and <|im_end|>; after one with thinking off (it ends
in "<think>\\n\\n</think>\\n\\n") it yields PLAIN and <|endoftext|>."""
import os

from conftest import ROOT
from server_fixture import Server
from successor_model import write_successor_model

REASONING = "Let me check."
PLAIN = "Sure thing"
CALL_TEXT = '<tool_call>{"arguments":{"city":"Paris"},"name": "get_weather"}</tool_call>'
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": WEATHER_SCHEMA}}]


def ids(srv, text):
    st, t = srv.post("/tokenize", {"prompt": text})
    assert st == 200, t
    return t["tokens"]


def write_agent_model(srv, path):
    """srv: any server with the tiny-qwen3 tokenizer (to tokenize the chains)."""
    on = ids(srv, "\n")
    off = ids(srv, "\n\n")
    assert len(on) == 1 and len(off) == 1
    a = on + ids(srv, "<think>" + REASONING + "</think>" + CALL_TEXT) + ids(srv, "<|im_end|>")
    b = off + ids(srv, PLAIN) + ids(srv, "<|endoftext|>")
    return write_successor_model(path, a + b)


def agent_server(tiny, tmp_path_factory, api_key=None):
    """A server of the agent model; tiny: a running server of the bundled model (no API key)."""
    d = write_agent_model(tiny, str(tmp_path_factory.mktemp("agent")))
    return Server("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3"), "--served-model-name", "tiny-qwen3", model=d,
                  api_key=api_key)
