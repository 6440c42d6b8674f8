"""`get_head`: the thread's head checkpoint, the same from Python, a request and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent import InvalidRequest, ThreadNotFound
from tests.helpers.scenario import outputs, request, say


@pytest.fixture
def agent(backend_url, make_agent):
    """An offline agent on each backend."""
    return make_agent(backend_url)


def test_the_head_follows_turns_and_head_switches(agent):
    first = outputs(say(agent, "I'm planning a trip", user_id="ann"))
    thread_id = first["thread_id"]
    second = outputs(say(agent, "to SF", thread_id=thread_id, user_id="ann"))

    assert agent.get_head(thread_id, user_id="ann") == {"thread_id": thread_id, "checkpoint_id": second["checkpoint_id"]}
    agent.set_head(thread_id, first["checkpoint_id"], user_id="ann")
    assert agent.get_head(thread_id, user_id="ann")["checkpoint_id"] == first["checkpoint_id"]
    # The same answer as the history's head entry, and as the action.
    [head_entry] = [e for e in agent.get_checkpoint_history(thread_id, user_id="ann") if e["is_head"]]
    assert head_entry["checkpoint_id"] == first["checkpoint_id"]
    action = agent.predict(request(action="get_head", thread_id=thread_id, user_id="ann")).custom_outputs
    assert action == {"thread_id": thread_id, "checkpoint_id": first["checkpoint_id"]}


def test_another_users_or_an_unknown_thread_is_not_found_and_bad_ids_are_invalid(agent):
    thread_id = outputs(say(agent, "hello", user_id="ann"))["thread_id"]
    with pytest.raises(ThreadNotFound):
        agent.get_head(thread_id, user_id="bob")
    with pytest.raises(ThreadNotFound):
        agent.get_head("no-such-thread")
    with pytest.raises(InvalidRequest, match="thread_id"):
        agent.get_head("")
    with pytest.raises(InvalidRequest, match="needs custom_inputs.thread_id"):
        agent.predict(request(action="get_head"))


def test_tt_agent_head_prints_the_head_as_json(tmp_path, make_agent):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    made = outputs(say(make_agent(url), "hello"))
    shown = subprocess.run(
        [sys.executable, "-m", "agent", "head", made["thread_id"], "--database-url", url, "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert json.loads(shown.stdout) == {"thread_id": made["thread_id"], "checkpoint_id": made["checkpoint_id"]}
