"""Models from code: `scripts/log_model.py` logs the agent, and the model
loaded with `mlflow.pyfunc.load_model` behaves like the in-process agent, actions included."""

from __future__ import annotations

import uuid
from pathlib import Path

import mlflow
import pytest

from agent import CheckpointNotFound, InvalidRequest, ThreadNotFound
from tests.helpers.scenario import TRIP, outputs, request, run_trip, say, text_of
from tests.helpers.servers import free_port, log_model_with_script

pytestmark = pytest.mark.slow

REGISTERED_NAME = "timetravel-agent-test"


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict:
    """The script run once, as a new user would: no tracking URI set, and a database URL nobody answers at."""
    cwd = tmp_path_factory.mktemp("log_model")
    unreachable = f"postgresql://agent:secret@127.0.0.1:{free_port()}/nowhere"
    uri = log_model_with_script(
        cwd,
        {"MLFLOW_TRACKING_URI": None, "AGENT_DATABASE_URL": unreachable, "AGENT_MODEL": None},
        "--register-name",
        REGISTERED_NAME,
    )
    return {"cwd": cwd, "uri": uri, "tracking_uri": f"sqlite:///{cwd / '.agent' / 'mlflow.db'}"}


@pytest.fixture
def loaded(logged, backend_url, monkeypatch):
    """The logged model loaded in this process, configured (like any loader) by AGENT_* variables."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", logged["tracking_uri"])
    monkeypatch.setenv("AGENT_DATABASE_URL", backend_url)
    monkeypatch.setenv("AGENT_MODEL", "offline")
    monkeypatch.setenv("AGENT_TRACING", "false")
    model = mlflow.pyfunc.load_model(logged["uri"])
    yield model
    model.get_raw_model().close()


def test_log_model_script_logs_without_reaching_the_database_and_prints_the_registered_uri(logged):
    # The fixture's run had AGENT_DATABASE_URL pointing at a closed port: it still succeeded.
    assert logged["uri"] == f"models:/{REGISTERED_NAME}/1"
    cwd: Path = logged["cwd"]
    assert (cwd / ".agent" / "mlflow.db").is_file()
    assert not (cwd / "mlflow.db").exists() and not (cwd / "mlruns").exists()


def test_logged_model_carries_the_agent_package_and_runtime_requirements(logged, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", logged["tracking_uri"])
    local = Path(mlflow.artifacts.download_artifacts(logged["uri"], dst_path=str(logged["cwd"] / "download")))
    assert (local / "code" / "agent" / "responses.py").is_file()
    requirements = (local / "requirements.txt").read_text()
    assert "langgraph-checkpoint-postgres" in requirements and "mlflow" in requirements
    assert "pytest" not in requirements  # dev extras stay out


def test_loaded_model_runs_the_trip_like_the_in_process_agent(loaded, make_agent, backend_url):
    served, reference = run_trip(loaded), run_trip(make_agent(backend_url))
    assert served["answer"] == reference["answer"]
    assert "SF" in served["answer"]

    thread = served["thread_id"]
    branched = say(loaded, "I'm headed to Tokyo!", thread_id=thread, checkpoint_id=served["after_turn1"])
    assert outputs(branched)["parent_checkpoint_id"] == served["after_turn1"]
    answer = say(loaded, TRIP[2], thread_id=thread)
    assert "Tokyo" in text_of(answer) and "SF" not in text_of(answer)

    # The loaded model wrote to AGENT_DATABASE_URL: the in-process agent sees its thread.
    history = make_agent(backend_url).get_checkpoint_history(thread, limit=50)
    assert history[0]["checkpoint_id"] == outputs(answer)["checkpoint_id"]
    assert served["after_turn3"] in {entry["checkpoint_id"] for entry in history}


def test_loaded_model_streams_and_its_last_event_carries_the_new_checkpoint(loaded):
    first = say(loaded, TRIP[1])
    thread = outputs(first)["thread_id"]
    events = list(loaded.predict_stream(request(TRIP[2], thread_id=thread)))
    streamed_text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    last = events[-1]
    assert last["custom_outputs"]["thread_id"] == thread
    assert last["custom_outputs"]["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert last["type"] == "response.completed"  # OpenAI's last event, carrying the whole response again
    [done] = [e for e in events if e["type"] == "response.output_item.done"]
    assert streamed_text == done["item"]["content"][0]["text"] == last["response"]["output"][-1]["content"][0]["text"]
    assert "SF" in streamed_text
    follow_up = say(loaded, "And now?", thread_id=thread)
    assert outputs(follow_up)["parent_checkpoint_id"] == last["custom_outputs"]["checkpoint_id"]


def test_loaded_model_history_action_equals_the_python_method(loaded, make_agent, backend_url):
    ids = run_trip(loaded)
    agent = make_agent(backend_url)
    listed = loaded.predict(request(action="get_checkpoint_history", thread_id=ids["thread_id"], limit=2))
    assert outputs(listed)["history"] == agent.get_checkpoint_history(ids["thread_id"], limit=2)
    older = loaded.predict(
        request(action="get_checkpoint_history", thread_id=ids["thread_id"], before=ids["after_turn3"], limit=5)
    )
    assert outputs(older)["history"] == agent.get_checkpoint_history(ids["thread_id"], limit=5, before=ids["after_turn3"])
    assert [e["checkpoint_id"] for e in outputs(older)["history"]] == [ids["after_turn2"], ids["after_turn1"], ids["root"]]


def test_loaded_model_update_checkpoint_state_action_makes_the_new_head(loaded, make_agent, backend_url):
    ids = run_trip(loaded)
    updated = loaded.predict(
        request("I'm headed to Tokyo!", action="update_checkpoint_state", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    )
    assert outputs(updated)["thread_id"] == ids["thread_id"]
    assert outputs(updated)["parent_checkpoint_id"] == ids["after_turn1"]
    assert updated["output"] == []  # no model call, no reply
    head = make_agent(backend_url).get_checkpoint_history(ids["thread_id"], limit=1)[0]
    assert head["checkpoint_id"] == outputs(updated)["checkpoint_id"]
    assert head["source"] == "update"
    answer = say(loaded, "Where am I going?", thread_id=ids["thread_id"])
    assert "Tokyo" in text_of(answer) and "SF" not in text_of(answer)


def test_loaded_model_raises_the_agent_errors(loaded):
    ids = run_trip(loaded)
    with pytest.raises(ThreadNotFound):
        loaded.predict(request(action="get_checkpoint_history", thread_id=f"missing-{uuid.uuid4()}"))
    with pytest.raises(CheckpointNotFound):
        say(loaded, "hi", thread_id=ids["thread_id"], checkpoint_id=str(uuid.uuid4()))
    with pytest.raises(InvalidRequest):
        loaded.predict(request(action="rewind", thread_id=ids["thread_id"]))
    with pytest.raises(ThreadNotFound):
        list(loaded.predict_stream(request("hi", thread_id=f"missing-{uuid.uuid4()}", checkpoint_id=ids["after_turn1"])))


def test_loaded_model_refuses_a_string_input_that_the_in_process_agent_takes(loaded):
    # MLflow enforces the ResponsesAgent signature (`input`: an array) before the agent reads the request,
    # and sets that signature itself, so docs/python-api.md says where a string `input` works and where not.
    with pytest.raises(mlflow.exceptions.MlflowException, match="Failed to enforce schema"):
        loaded.predict({"input": "I'm headed to SF!"})
    assert "SF" in text_of(loaded.get_raw_model().predict({"input": "I'm headed to SF!"}))
