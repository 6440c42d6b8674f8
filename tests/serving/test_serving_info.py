"""`tt-agent serve` says what it runs: its first line names the store and the model, and GET /agent/info
returns the agent's name, version, store kind (never its URL) and model name."""

from __future__ import annotations

import os
import time
import urllib.request
import json

import pytest

import agent
from tests.helpers.preloaded import start_agent
from tests.helpers.servers import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path):
    """`python -m agent serve` on a free port with the default store in `tmp_path`; (base URL, log file)."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    with open(log, "wb") as out:
        # Forked from the worker's preloaded server (`tests.helpers.preloaded`): as `python -m agent serve` started
        # with `env` as its whole environment, without importing MLflow and LangChain again.
        process = start_agent(["serve", "--port", str(port)], cwd=tmp_path, env=env, output=out.fileno())
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_names_the_store_and_the_model_before_uvicorn_starts(served, tmp_path):
    base_url, log = served
    first = log.read_text().splitlines()[0]
    assert first.startswith(f"timetravel-agent {agent.__version__} serving on {base_url}")
    assert f"store {tmp_path / '.agent' / 'checkpoints.sqlite'}, model offline" in first
    # Traces go into the process's own store, which keeps 1 turn in 5 by default: the line says so.
    assert first.endswith("tracing on (20% of turns; AGENT_TRACE_SAMPLE_RATIO=1 traces every turn)"), first
    assert "INFO mlflow" not in log.read_text()  # MLflow's INFO lines are silenced on the command line


def test_agent_info_says_which_agent_store_kind_and_model_run(served, tmp_path):
    base_url, _ = served
    with urllib.request.urlopen(f"{base_url}/agent/info", timeout=10) as response:
        info = json.load(response)
    assert info["name"] == "timetravel-agent" and info["version"] == agent.__version__
    assert info["store"] == "sqlite" and info["model"] == "offline"
    assert str(tmp_path) not in json.dumps(info)  # the store's kind, not its path
    assert info["agent_api"] == "responses"  # MLflow's keys are kept
