"""The API reference is made from the registry and the docstrings: every public member of the agent is on its page."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.agent import Agent
from agent.operations.registry import ACTIONS, OPERATIONS
from agent.responses import LangGraphResponsesAgent
from tests.helpers.servers import REPO_ROOT


@pytest.fixture(scope="module")
def agent_page(tmp_path_factory) -> str:
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return (site / "reference" / "agent" / "index.html").read_text(encoding="utf-8")


def test_every_public_member_of_the_agent_has_its_entry_in_the_reference(agent_page):
    members = {name for name in dir(Agent) if not name.startswith("_")}
    assert {operation.name for operation in OPERATIONS} | {"info", "close", "set_head"} <= members
    missing = sorted(name for name in members if f'id="agent.agent.Agent.{name}"' not in agent_page)
    assert not missing, f"not in the reference: {missing}"


def test_the_responses_api_of_the_mlflow_agent_is_in_the_reference(agent_page):
    own = {name for name in vars(LangGraphResponsesAgent) if not name.startswith("_")}
    assert {"predict", "predict_stream", "apredict", "apredict_stream"} <= own
    missing = sorted(name for name in own if f'id="agent.responses.LangGraphResponsesAgent.{name}"' not in agent_page)
    assert not missing, f"not in the reference: {missing}"


def test_the_reference_lists_every_action_with_its_method(agent_page):
    for name in ACTIONS:
        assert f"<code>{name}</code>" in agent_page
        assert f'href="#agent.agent.Agent.{name}"' in agent_page  # the method's entry, linked
