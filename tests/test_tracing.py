"""Tracing (issue 3, item 5): each turn's MLflow trace carries its thread as the session and its checkpoints,
read back from a real local tracking store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import mlflow
import pytest

from agent import InvalidRequest
from agent.tracing import disable_tracing
from tests.helpers.scenario import TRIP, outputs, request, say
from tests.helpers.servers import REPO_ROOT

SESSION = "mlflow.trace.session"


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    """One SQLite tracking store for the module (MLflow sets its trace exporter up once per URI)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('tracking') / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri
    disable_tracing()


@pytest.fixture
def traced_agent(tracking_uri, make_agent):
    agent = make_agent("memory://", tracing=True)
    yield agent
    disable_tracing()


def traces_of(thread_id: str) -> list:
    """The stored traces of `thread_id`'s session, oldest first."""
    mlflow.flush_trace_async_logging()
    found = mlflow.search_traces(
        locations=["0"], filter_string=f"metadata.`{SESSION}` = '{thread_id}'", return_type="list", order_by=["timestamp_ms ASC"]
    )
    return list(found)


def test_each_turn_trace_has_the_thread_as_session_and_its_checkpoints(traced_agent):
    first = say(traced_agent, TRIP[1], user_id="alice")
    thread = outputs(first)["thread_id"]
    second = say(traced_agent, TRIP[2], thread_id=thread, user_id="alice")
    traces = traces_of(thread)
    assert len(traces) == 2
    first_meta, second_meta = (t.info.trace_metadata for t in traces)
    assert first_meta["checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert first_meta["parent_checkpoint_id"] == outputs(first)["parent_checkpoint_id"]  # the new thread's root
    assert second_meta["checkpoint_id"] == outputs(second)["checkpoint_id"]
    assert second_meta["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert second_meta["mlflow.trace.user"] == "alice"
    # LangChain autolog: the chat model call is a span of the same trace.
    assert "CHAT_MODEL" in {span.span_type for span in traces[1].data.spans}


def test_streamed_turn_trace_has_the_new_checkpoint(traced_agent):
    first = say(traced_agent, TRIP[1])
    thread = outputs(first)["thread_id"]
    last = list(traced_agent.predict_stream(request(TRIP[2], thread_id=thread)))[-1]
    traces = traces_of(thread)
    assert [t.info.trace_metadata["checkpoint_id"] for t in traces] == [
        outputs(first)["checkpoint_id"],
        last.custom_outputs["checkpoint_id"],
    ]
    assert traces[1].info.trace_metadata["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]


def test_time_travel_actions_are_traced_in_the_thread_session(traced_agent):
    first = say(traced_agent, TRIP[1])
    thread = outputs(first)["thread_id"]
    traced_agent.predict(request(action="get_checkpoint_history", thread_id=thread))
    updated = traced_agent.predict(
        request("I'm headed to Tokyo!", action="update_checkpoint_state", thread_id=thread, checkpoint_id=outputs(first)["checkpoint_id"])
    )
    history_trace, update_trace = traces_of(thread)[1:]
    assert "checkpoint_id" not in history_trace.info.trace_metadata
    assert update_trace.info.trace_metadata["checkpoint_id"] == outputs(updated)["checkpoint_id"]
    assert update_trace.info.trace_metadata["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]


def test_lone_surrogate_is_refused_and_later_turns_are_still_traced(traced_agent):
    first = say(traced_agent, TRIP[1])
    thread = outputs(first)["thread_id"]
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        say(traced_agent, "broken \ud800 text", thread_id=thread)
    second = say(traced_agent, TRIP[2], thread_id=thread)
    assert [t.info.trace_metadata["checkpoint_id"] for t in traces_of(thread)] == [
        outputs(first)["checkpoint_id"],
        outputs(second)["checkpoint_id"],
    ]


def test_tracing_off_stores_no_trace(tracking_uri, make_agent):
    agent = make_agent("memory://", tracing=False)
    thread = outputs(say(agent, TRIP[1]))["thread_id"]
    assert traces_of(thread) == []


def test_default_tracking_store_is_under_dot_agent_not_the_current_directory(tmp_path):
    program = textwrap.dedent(
        """
        import json, mlflow
        from agent import create_agent
        with create_agent("memory://", model="offline", tracing=True) as agent:
            thread = agent.predict({"input": [{"role": "user", "content": "hi"}]}).custom_outputs["thread_id"]
        mlflow.flush_trace_async_logging()
        found = mlflow.search_traces(locations=["0"], filter_string=f"metadata.`mlflow.trace.session` = '{thread}'",
                                     return_type="list")
        print(json.dumps({"uri": mlflow.get_tracking_uri(), "traces": len(found)}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AGENT_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"uri": f"sqlite:///{tmp_path / '.agent' / 'mlflow.db'}", "traces": 1}
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_a_refused_oversized_request_is_traced_as_a_short_preview(tracking_uri, make_agent):
    # Found by trying it: MLflow records a request before the agent refuses it, so
    # a 300 MB body was stored whole in the tracking store.
    agent = make_agent("memory://", tracing=True, max_request_bytes=1000)
    marker = f"oversized-{os.getpid()}"
    with pytest.raises(InvalidRequest, match="limit"):
        say(agent, marker + "x" * 200_000)
    mlflow.flush_trace_async_logging()
    latest = mlflow.search_traces(locations=["0"], return_type="list", order_by=["timestamp_ms DESC"], max_results=1)[0]
    recorded = json.dumps([span.inputs for span in latest.data.spans])
    assert marker in recorded  # it is the refused request's trace
    assert len(recorded) < 5_000
    disable_tracing()
