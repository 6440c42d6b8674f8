"""`scripts/log_model.py --agent FILE` and `mlflow models serve` of the logged file, on Postgres.

Two logged models, one server each (module scope): examples/my_agent.py with the
OpenAI-compatible stub as its chat model (a tool turn over /invocations, the
instructions sent and not stored), and examples/approval_agent.py with the offline
model (an interrupt and its resume over MLflow's scoring server). Logging runs with
`AGENT_DATABASE_URL` pointing at a closed port: MLflow runs the file at log time,
and nothing may reach the user's database then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.servers import LOG_MODEL_SCRIPT, REPO_ROOT, free_port, log_model_with_script, server_process

pytestmark = pytest.mark.slow

INSTRUCTIONS = "You are a travel assistant. Answer briefly, and use your tools for weather and money."


@contextmanager
def models_serve(cwd: Path, agent_file: str, env: dict[str, str]):
    tracking_uri = f"sqlite:///{cwd / 'mlflow.db'}"
    unreachable = f"postgresql://agent:secret@127.0.0.1:{free_port()}/nowhere"
    uri = log_model_with_script(
        cwd, {"MLFLOW_TRACKING_URI": tracking_uri, "AGENT_DATABASE_URL": unreachable}, "--agent", agent_file
    )
    port = free_port()
    env = {
        "MLFLOW_TRACKING_URI": tracking_uri,
        "AGENT_TRACING": "false",
        # `mlflow models serve` execs `uvicorn` from PATH, as in an activated virtualenv.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        **env,
    }
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local",
               "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with server_process(command, port=port, health_path="/ping", env=env, cwd=cwd) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            yield client


@pytest.fixture(scope="module")
def my_agent(tmp_path_factory, pg_url):
    with openai_stub_server() as model_url:
        env = {"AGENT_DATABASE_URL": pg_url, "AGENT_MODEL": "fake", "OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "test"}
        with models_serve(tmp_path_factory.mktemp("my_agent"), str(REPO_ROOT / "examples/my_agent.py"), env) as client:
            with httpx.Client(base_url=model_url.removesuffix("/v1")) as model:
                yield SimpleNamespace(client=client, model=model)


@pytest.fixture(scope="module")
def approval_agent(tmp_path_factory, pg_url):
    env = {"AGENT_DATABASE_URL": pg_url, "AGENT_MODEL": "offline"}
    with models_serve(tmp_path_factory.mktemp("approval_agent"), str(REPO_ROOT / "examples/approval_agent.py"), env) as client:
        yield client


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_the_logged_agent_file_runs_a_tool_over_invocations(my_agent):
    my_agent.model.post("/_reset")
    body = ok(my_agent.client.post("/invocations", json={"input": [{"role": "user", "content": 'use get_weather {"city": "Paris"}'}]}))
    assert [i["name"] for i in body["output"] if i["type"] == "function_call"] == ["get_weather"]
    assert "The get_weather says: It is sunny and 21 °C in Paris." in body["output"][-1]["content"][0]["text"]
    sent = my_agent.model.get("/_requests").json()
    assert sent and all(r["messages"][0] == {"role": "system", "content": INSTRUCTIONS} for r in sent)
    assert {t["function"]["name"] for t in sent[0]["tools"]} >= {"get_weather", "convert_currency"}

    state = ok(my_agent.client.post("/invocations", json={
        "input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": body["custom_outputs"]["thread_id"]},
    }))  # fmt: skip
    assert "travel assistant" not in json.dumps(state)
    assert len(state["custom_outputs"]["messages"]) == 4


def test_log_model_script_with_a_broken_agent_file_prints_one_error_line_and_logs_nothing(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('cannot build')\n")
    done = subprocess.run([sys.executable, str(LOG_MODEL_SCRIPT), "--agent", str(broken)], cwd=tmp_path,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == f"Error: Agent file '{broken}' failed at line 1: RuntimeError: cannot build"
    assert not (tmp_path / "mlflow.db").exists()  # refused before MLflow's store was touched


def test_an_interrupt_and_its_resume_over_the_scoring_server(approval_agent):
    asked = ok(approval_agent.post("/invocations", json={
        "input": [{"role": "user", "content": 'use book_trip {"destination": "Tokyo"}'}], "custom_inputs": {"user_id": "alice"},
    }))  # fmt: skip
    [interrupt] = asked["custom_outputs"]["interrupts"]
    assert asked["output"][-1]["type"] == "mcp_approval_request" and asked["output"][-1]["id"] == interrupt["id"]
    thread_id = asked["custom_outputs"]["thread_id"]

    wrong = approval_agent.post("/invocations", json={"input": [], "custom_inputs": {
        "thread_id": thread_id, "resume": {"0" * 32: "yes"}, "user_id": "alice"}})  # fmt: skip
    assert wrong.status_code == 400 and "not pending" in wrong.json()["message"]
    foreign = approval_agent.post("/invocations", json={"input": [], "custom_inputs": {
        "thread_id": thread_id, "resume": "yes", "user_id": "mallory"}})  # fmt: skip
    assert foreign.status_code == 404 and foreign.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"

    booked = ok(approval_agent.post("/invocations", json={"input": [], "custom_inputs": {
        "thread_id": thread_id, "resume": "yes", "user_id": "alice"}}))  # fmt: skip
    assert booked["custom_outputs"]["parent_checkpoint_id"] == asked["custom_outputs"]["checkpoint_id"]
    assert "Booked: a trip to Tokyo" in booked["output"][-1]["content"][0]["text"]
