"""A real agent harness from PyPI (the OpenAI Agents SDK, openai-agents) run
offline against the server's base URL over the Responses API: its function
tool is called with the arguments the model emitted, the tool's output goes
back as a function_call_output item, and the SDK's next request is served
(the agent model, agent_model.py, calls the tool again on every turn, so the
run ends at max_turns with one tool execution per served turn). Whole and
streamed runs."""
import asyncio

import pytest

agents = pytest.importorskip("agents")  # tests/requirements.txt installs it; skipped where it is not installed
from openai import AsyncOpenAI  # noqa: E402

from agent_model import agent_server  # noqa: E402
from server_fixture import Server  # noqa: E402


@pytest.fixture(scope="module")
def agent_srv(tmp_path_factory):
    tiny = Server()
    try:
        s = agent_server(tiny, tmp_path_factory)
    finally:
        assert tiny.stop() == 0
    yield s
    assert s.stop() == 0


def make_agent(url, calls):
    agents.set_tracing_disabled(True)  # offline: no trace export

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                        model=agents.OpenAIResponsesModel(model="tiny-qwen3", openai_client=client),
                        model_settings=agents.ModelSettings(temperature=0, max_tokens=60))


def test_agents_sdk_function_tool(agent_srv):
    calls = []
    agent = make_agent(agent_srv.url, calls)
    with pytest.raises(agents.MaxTurnsExceeded):
        agents.Runner.run_sync(agent, "Weather in Paris?", max_turns=2)
    assert calls == ["Paris", "Paris"]  # turn 2 was served from turn 1's items plus the tool output


def test_agents_sdk_stop_on_first_tool_streamed(agent_srv):
    calls = []
    agent = make_agent(agent_srv.url, calls).clone(tool_use_behavior="stop_on_first_tool")

    async def run():
        r = agents.Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        kinds = [e.type async for e in r.stream_events()]
        return r, kinds

    r, kinds = asyncio.run(run())
    assert calls == ["Paris"] and r.final_output == "sunny in Paris"
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
