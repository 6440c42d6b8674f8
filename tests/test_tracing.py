"""Tracing: each turn's MLflow trace carries its thread as the session and
its checkpoints, holds the turn's span and one span per model call with a summary that does not grow with
the thread, and `trace_sample_ratio` keeps that share of the traces; read back from a real local tracking store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import mlflow
import pytest

from agent import InvalidRequest
from agent.tracing import LOCAL_TRACE_SAMPLE_RATIO, SAMPLING_RATIO_ENV, default_sample_ratio, disable_tracing, enable_tracing
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
    # Every turn: into a local store the default keeps only a share (`LOCAL_TRACE_SAMPLE_RATIO`).
    agent = make_agent("memory://", tracing=True, trace_sample_ratio=1.0)
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
    # The chat model call is a span of the same trace.
    assert "CHAT_MODEL" in {span.span_type for span in traces[1].data.spans}


def test_a_turn_trace_is_the_turn_span_and_one_span_per_model_call(traced_agent):
    # "calculate" makes the offline model call the calculator tool, then answer: two model calls.
    turn = say(traced_agent, "calculate 6*7", user_id="alice")
    (trace,) = traces_of(outputs(turn)["thread_id"])
    root, *children = trace.data.spans
    assert root.parent_id is None and root.span_type == "AGENT"
    assert [span.span_type for span in children] == ["CHAT_MODEL", "CHAT_MODEL"]
    assert {span.parent_id for span in children} == {root.span_id}
    first, second = children
    assert first.inputs == {"message_count": 1, "last_user_message": "calculate 6*7", "input_tokens": first.inputs["input_tokens"]}
    assert first.outputs["tool_calls"][0]["name"] == "calculator"
    assert second.inputs["message_count"] == 3 and "42" in second.outputs["content"]
    assert trace.info.trace_metadata["checkpoint_id"] == outputs(turn)["checkpoint_id"]
    assert trace.info.trace_metadata["mlflow.trace.user"] == "alice"


def test_recorded_inputs_stay_the_same_size_as_the_thread_grows(traced_agent):
    thread = outputs(say(traced_agent, "Day 1 of my trip: a museum."))["thread_id"]
    for day in range(2, 31):
        say(traced_agent, f"Day {day} of my trip: a museum.", thread_id=thread)
    traces = traces_of(thread)
    assert len(traces) == 30

    def inputs_size(trace) -> int:
        return sum(len(json.dumps(span.inputs)) for span in trace.data.spans)

    # The thread holds 60 messages at the end; only counts (a digit or two) may grow.
    assert inputs_size(traces[-1]) <= inputs_size(traces[1]) + 10
    last_model_span = next(s for s in traces[-1].data.spans if s.span_type == "CHAT_MODEL")
    assert last_model_span.inputs["message_count"] == 59
    assert last_model_span.inputs["last_user_message"] == "Day 30 of my trip: a museum."


@pytest.mark.parametrize(("ratio", "stored"), [(0.0, 0), (1.0, 5)])
def test_trace_sample_ratio_zero_stores_no_trace_and_one_stores_every_trace(tracking_uri, make_agent, ratio, stored):
    agent = make_agent("memory://", tracing=True, trace_sample_ratio=ratio)
    try:
        thread = outputs(say(agent, TRIP[1]))["thread_id"]
        for text in (TRIP[2], "one more", "and another", "the last one"):
            say(agent, text, thread_id=thread)
        assert len(traces_of(thread)) == stored
    finally:
        enable_tracing(1.0)  # the ratio is the process's: give the next test MLflow's default back
        disable_tracing()


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


def test_reads_and_other_actions_are_not_traced_by_default(traced_agent):
    first = say(traced_agent, TRIP[1])
    thread = outputs(first)["thread_id"]
    traced_agent.predict(request(action="get_checkpoint_state", thread_id=thread))
    list(traced_agent.predict_stream(request(action="get_checkpoint_history", thread_id=thread)))
    traced_agent.predict(
        request("I'm headed to Tokyo!", action="update_checkpoint_state", thread_id=thread, checkpoint_id=outputs(first)["checkpoint_id"])
    )
    second = say(traced_agent, TRIP[2], thread_id=thread)
    assert [t.info.trace_metadata["checkpoint_id"] for t in traces_of(thread)] == [
        outputs(first)["checkpoint_id"],
        outputs(second)["checkpoint_id"],
    ]


def test_trace_actions_traces_time_travel_actions_in_the_thread_session(tracking_uri, make_agent):
    agent = make_agent("memory://", tracing=True, trace_sample_ratio=1.0, trace_actions=True)
    try:
        first = say(agent, TRIP[1])
        thread = outputs(first)["thread_id"]
        agent.predict(request(action="get_checkpoint_history", thread_id=thread))
        updated = agent.predict(
            request("I'm headed to Tokyo!", action="update_checkpoint_state", thread_id=thread, checkpoint_id=outputs(first)["checkpoint_id"])
        )
        history_trace, update_trace = traces_of(thread)[1:]
        assert "checkpoint_id" not in history_trace.info.trace_metadata
        assert update_trace.info.trace_metadata["checkpoint_id"] == outputs(updated)["checkpoint_id"]
        assert update_trace.info.trace_metadata["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    finally:
        disable_tracing()


def test_a_turn_trace_has_the_same_bounded_size_on_a_long_thread_as_on_a_short_one(traced_agent):
    day = "a long day at the museum. " * 40

    def last_trace(turns: int) -> tuple[int, int]:
        """(bytes the last turn's trace records beyond the model's reply, the trace's stored size)."""
        answer = say(traced_agent, "Day 1: " + day)
        thread = outputs(answer)["thread_id"]
        for number in range(2, turns + 1):
            answer = say(traced_agent, f"Day {number}: " + day, thread_id=thread)
        last = traces_of(thread)[-1]
        reply = json.dumps(answer.output[0].content[0]["text"])[1:-1]  # the offline model quotes the thread
        recorded = sum(len(json.dumps(s.inputs)) + len(json.dumps(s.outputs).replace(reply, "")) for s in last.data.spans)
        return recorded, int(last.info.trace_metadata["mlflow.trace.sizeBytes"])

    (short, _), (long, stored) = last_trace(2), last_trace(12)  # the long thread's state: 24 messages, ~26 kB
    assert long <= short + 50  # ids and counts may take a digit more
    assert stored < 15_000


def test_the_default_sample_ratio_keeps_every_trace_for_a_tracking_server_and_a_share_for_a_local_store(
    tracking_uri, make_agent
):
    assert default_sample_ratio("http://127.0.0.1:5000") == default_sample_ratio("databricks") == 1.0
    assert default_sample_ratio("sqlite:///x/mlflow.db") == default_sample_ratio("postgresql://h/db") == LOCAL_TRACE_SAMPLE_RATIO
    assert 0 < LOCAL_TRACE_SAMPLE_RATIO < 1
    make_agent("memory://", tracing=True)  # this module's store is a local SQLite file
    try:
        assert float(os.environ[SAMPLING_RATIO_ENV]) == LOCAL_TRACE_SAMPLE_RATIO
    finally:
        enable_tracing(1.0)
        disable_tracing()


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
        with create_agent("memory://", model="offline", tracing=True, trace_sample_ratio=1.0) as agent:
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
    agent = make_agent("memory://", tracing=True, trace_sample_ratio=1.0, max_request_bytes=1000)
    marker = f"oversized-{os.getpid()}"
    with pytest.raises(InvalidRequest, match="limit"):
        say(agent, marker + "x" * 200_000)
    mlflow.flush_trace_async_logging()
    latest = mlflow.search_traces(locations=["0"], return_type="list", order_by=["timestamp_ms DESC"], max_results=1)[0]
    recorded = json.dumps([span.inputs for span in latest.data.spans])
    assert marker in recorded  # it is the refused request's trace
    assert len(recorded) < 5_000
    disable_tracing()
