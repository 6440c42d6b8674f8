"""Your agent file (`--agent FILE`, `agent.serving.agent_file`): loaded as MLflow loads models from code,
served by `tt-agent serve`, talked to by `tt-agent chat`, and refused clearly when it is broken.

The served agent is examples/my_agent.py with the OpenAI-compatible stub as its model (a real
process, over HTTP, so langchain-openai really runs): the stub records what the model was sent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from agent.errors import ConfigurationError
from agent.serving.agent_file import load_agent_file
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.servers import REPO_ROOT, free_port, server_process
from tests.cli.test_cli import assert_clean_success, replies, run_cli

MY_AGENT = REPO_ROOT / "examples" / "my_agent.py"
APPROVAL_AGENT = REPO_ROOT / "examples" / "approval_agent.py"
INSTRUCTIONS = "You are a travel assistant. Answer briefly, and use your tools for weather and money."

BROKEN_FILES = {
    "raises.py": ("def build():\n    raise ValueError('no API key for the weather service')\n\nbuild()\n",
                  "failed at line 2: ValueError: no API key for the weather service"),  # fmt: skip
    "sets_nothing.py": ("from agent import create_agent\n\nagent = create_agent(connect=False)\n", "set no model"),
    "sets_other.py": ("import mlflow\n\nmlflow.models.set_model(lambda model_input: model_input)\n",
                      "set a builtins.function"),  # fmt: skip
    "bad_setting.py": ("import mlflow\nfrom agent import create_agent\n\n"
                       "mlflow.models.set_model(create_agent('nosuchdb://x', connect=False))\n",
                       "Unknown database URL scheme 'nosuchdb'"),  # fmt: skip
}


def write_broken(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(BROKEN_FILES[name][0])
    return path


# -- the loader, in process ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BROKEN_FILES))
def test_a_broken_agent_file_is_a_configuration_error_naming_the_file_and_why(name, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_DATABASE_URL", "memory://")
    path = write_broken(tmp_path, name)
    with pytest.raises(ConfigurationError) as raised:
        load_agent_file(path)
    assert str(path) in raised.value.message
    assert BROKEN_FILES[name][1] in raised.value.message


def test_a_missing_or_non_python_agent_file_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_agent_file(tmp_path / "nowhere.py")
    (tmp_path / "agent.txt").write_text("print('never run')\n")
    with pytest.raises(ConfigurationError, match=r"must be a Python file \(\.py\)"):
        load_agent_file(tmp_path / "agent.txt")


def test_a_file_that_sets_nothing_is_refused_even_after_another_file_set_an_agent(tmp_path, monkeypatch):
    # MLflow keeps the last model set in a module global: without the reset, the second load would
    # quietly answer with the first file's agent.
    monkeypatch.setenv("AGENT_DATABASE_URL", "memory://")
    monkeypatch.setenv("AGENT_MODEL", "offline")
    monkeypatch.setenv("AGENT_TRACING", "false")
    with load_agent_file(MY_AGENT):
        pass
    with pytest.raises(ConfigurationError, match="set no model"):
        load_agent_file(write_broken(tmp_path, "sets_nothing.py"))


def test_the_loaded_file_reads_the_environment_and_is_connected(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'mine.sqlite'}"
    monkeypatch.setenv("AGENT_DATABASE_URL", url)
    monkeypatch.setenv("AGENT_MODEL", "offline")
    monkeypatch.setenv("AGENT_TRACING", "false")
    with load_agent_file(MY_AGENT) as agent:
        assert agent.info().store == str(tmp_path / "mine.sqlite")
        assert (tmp_path / "mine.sqlite").is_file()  # set up although the file said connect=False
        answer = agent.predict({"input": [{"role": "user", "content": 'use get_weather {"city": "Oslo"}'}]})
        assert "It is sunny and 21 °C in Oslo." in answer.output[-1].content[0]["text"]


# -- the command line: a broken file ------------------------------------------------------------------
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_broken_agent_file_stops_the_command_with_one_error_line_and_exit_1(command, tmp_path):
    path = write_broken(tmp_path, "raises.py")
    args = [command, "--agent", str(path)] + (["--port", str(free_port())] if command == "serve" else [])
    result = run_cli(*args, cwd=tmp_path, stdin="hello\n")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert f"Error: Agent file '{path}' failed at line 2: ValueError: no API key" in one_line(result.stderr)
    assert "agent ›" not in result.stdout  # the chat never started


def test_a_missing_agent_file_stops_serve_with_exit_1(tmp_path):
    result = run_cli("serve", "--agent", "nowhere.py", "--port", str(free_port()), cwd=tmp_path)
    assert result.returncode == 1
    assert "Agent file 'nowhere.py' does not exist" in one_line(result.stderr) and "Traceback" not in result.stderr


def one_line(text: str) -> str:
    """`text` with the console's line wrapping undone."""
    return " ".join(text.split())


# -- tt-agent chat --agent: an approval, answered ------------------------------------------------------
def test_chat_shows_the_approval_question_and_resumes_with_the_answer(tmp_path):
    url = f"sqlite:///{tmp_path / 'chat.sqlite'}"
    script = "\n".join([
        'use book_trip {"destination": "Tokyo"}',
        "Where am I going?",  # refused: the question waits
        "/resume yes",
        'use book_trip {"destination": "Oslo"}',
        "/cancel no, stay home",
        "/resume yes",  # nothing waits any more
        "/quit",
    ]) + "\n"  # fmt: skip
    result = run_cli("chat", "--agent", str(APPROVAL_AGENT), "--database-url", url, cwd=tmp_path, stdin=script)
    assert_clean_success(result)
    out = one_line(result.stdout)
    assert f"Store: {tmp_path / 'chat.sqlite'}" in out
    assert "tool call book_trip" in out
    assert "? Book a trip to Tokyo?" in out and "/resume <value>" in out
    assert "The agent waits for your answer first" in out
    tokyo, oslo_cancelled = replies(result.stdout)
    assert "Booked: a trip to Tokyo, confirmation TT-" in tokyo
    assert "? Book a trip to Oslo?" in out
    assert "no, stay home" in oslo_cancelled and "Booked: a trip to Oslo" not in out
    assert "resume answers a pending interrupt" in out and "has none" in out
    assert out.count("saved as checkpoint") == 4  # question, booking, question, the message past it


# -- tt-agent serve --agent examples/my_agent.py, the stub as its model ---------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("serve_agent_file")
    with openai_stub_server() as model_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": f"sqlite:///{cwd / 'checkpoints.sqlite'}",
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "test",
            "AGENT_TRACING": "false",
        }
        command = [sys.executable, "-m", "agent", "serve", "--port", str(port), "--agent", str(MY_AGENT)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
            with httpx.Client(base_url=base_url, timeout=60) as client, httpx.Client(base_url=model_url.removesuffix("/v1")) as model:
                yield client, model


@pytest.mark.slow
def test_served_agent_file_sends_its_instructions_and_tools_and_runs_a_tool(served):
    client, model = served
    model.post("/_reset")
    answer = client.post("/invocations", json={"input": [{"role": "user", "content": 'use get_weather {"city": "Paris"}'}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    assert "The get_weather says: It is sunny and 21 °C in Paris." in body["output"][-1]["content"][0]["text"]

    sent = model.get("/_requests").json()
    assert len(sent) == 2  # the tool call, then the answer after the tool's result
    for request in sent:
        assert request["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
        offered = {tool["function"]["name"] for tool in request["tools"]}
        assert {"get_weather", "convert_currency"} <= offered and "calculator" not in offered
    weather = next(t["function"] for t in sent[0]["tools"] if t["function"]["name"] == "get_weather")
    assert weather["description"] == "The weather forecast for a city, in one sentence."
    assert weather["parameters"]["properties"] == {"city": {"type": "string"}}

    # The instructions are sent on every call and stored nowhere.
    thread_id = body["custom_outputs"]["thread_id"]
    state = client.post(
        "/invocations", json={"input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": thread_id}}
    )
    assert state.status_code == 200, state.text
    stored = state.json()["custom_outputs"]
    assert "travel assistant" not in state.text
    kinds = [(m["type"], m.get("role")) for m in stored["messages"]]
    assert kinds == [("message", "user"), ("function_call", None), ("function_call_output", None), ("message", "assistant")]


@pytest.mark.slow
def test_served_agent_file_streams_a_tool_turn_over_responses(served):
    client, _ = served
    with client.stream(
        "POST", "/responses", json={"input": [{"role": "user", "content": 'use convert_currency {"amount": 10, '
                                                 '"from_currency": "USD", "to_currency": "EUR"}'}], "stream": True}
    ) as streamed:  # fmt: skip
        assert streamed.status_code == 200
        text = "".join(streamed.iter_text())
    assert "9.20 EUR" in text


@pytest.mark.slow
def test_every_worker_serves_the_agent_file(tmp_path):
    # The file reaches the workers as AGENT_FILE: were a worker to build the built-in agent instead,
    # its model calls would offer the calculator and carry no instructions.
    with openai_stub_server() as model_url:
        port = free_port()
        env = {"AGENT_MODEL": "fake", "OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "test", "AGENT_TRACING": "false"}
        command = [sys.executable, "-m", "agent", "serve", "--port", str(port), "--workers", "2", "--agent",
                   str(MY_AGENT), "--database-url", f"sqlite:///{tmp_path / 'checkpoints.sqlite'}"]  # fmt: skip
        with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path, startup_timeout=180) as base:
            for n in range(8):  # a new connection each: SO_REUSEPORT spreads them over the workers
                answer = httpx.post(f"{base}/invocations", timeout=60,
                                    json={"input": [{"role": "user", "content": f"hello {n}"}]})  # fmt: skip
                assert answer.status_code == 200, answer.text
            with httpx.Client(base_url=model_url.removesuffix("/v1")) as model:
                sent = model.get("/_requests").json()
    assert len(sent) == 8
    for request in sent:
        assert request["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
        assert "calculator" not in {tool["function"]["name"] for tool in request["tools"]}


def test_an_agent_file_that_exits_is_an_error_naming_it(tmp_path):
    from agent.serving.agent_file import load_agent_file

    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ConfigurationError, match=r"exits.py' called sys.exit\(3\)"):
        load_agent_file(exits)
