"""Wrong requests fail loudly with the documented error and write nothing, on Postgres and SQLite.

"Nothing written" is checked twice: the thread's whole history is unchanged, and so is the
number of rows in every table the agent writes (counted in the agent's own database).
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from mlflow.exceptions import MlflowException
from psycopg import sql

import agent as agent_package
from agent import (
    AgentError,
    CheckpointNotFound,
    ConfigurationError,
    InvalidRequest,
    ModelError,
    ServerBusy,
    ServerStopping,
    StorageUnavailable,
    ThreadBusy,
    ThreadNotFound,
)
from agent.mlflow_errors import as_mlflow_exception
from agent.serving.errors import http_status
from agent.storage.postgres import PostgresThreadStorage
from tests.helpers.scenario import request, run_trip, text_of

POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "agent_threads", "agent_claims", "agent_idempotency")
SQLITE_TABLES = ("checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency")

#: A well-formed checkpoint id that no thread has.
MISSING_CHECKPOINT = "1f000000-0000-6000-8000-000000000000"


def row_counts(agent) -> dict[str, int]:
    """Rows per table the agent writes, read from the agent's own database."""
    store = agent.storage
    if isinstance(store, PostgresThreadStorage):
        count = sql.SQL("SELECT count(*) AS n FROM {}")
        with store.pool.connection() as conn:
            return {
                table: conn.execute(count.format(sql.Identifier(table))).fetchone()["n"] for table in POSTGRES_TABLES
            }
    conn = store.saver.conn
    return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in SQLITE_TABLES}


@contextmanager
def writes_nothing(agent, *thread_ids: str):
    """Assert that the block changes neither the listed threads' histories nor any table's row count."""

    def snapshot():
        return row_counts(agent), {t: agent.get_checkpoint_history(t, limit=1000) for t in thread_ids}

    before = snapshot()
    assert sum(before[0].values()) > 0  # the check must look at a database that has rows
    yield
    assert snapshot() == before


@pytest.fixture
def trip(agent) -> dict:
    """Two finished trip threads: `mine` (the one requests go to) and `other`."""
    return {"mine": run_trip(agent), "other": run_trip(agent)}


def unused_thread_id() -> str:
    return f"never-used-{uuid.uuid4()}"


def run(agent, how: str, body: dict):
    """Send `body` with `predict`, or drain `predict_stream`."""
    if how == "predict":
        return agent.predict(body)
    return list(agent.predict_stream(body))


def turn(text: str | None = "Where am I going?", **custom_inputs) -> dict:
    return request(text, **custom_inputs)


# --- turns (predict and predict_stream) ------------------------------------------------------

HOW = pytest.mark.parametrize("how", ["predict", "predict_stream"])


@HOW
def test_unknown_checkpoint_id_is_checkpoint_not_found(agent, trip, how):
    mine = trip["mine"]
    with writes_nothing(agent, mine["thread_id"]), pytest.raises(CheckpointNotFound) as err:
        run(agent, how, turn(thread_id=mine["thread_id"], checkpoint_id=MISSING_CHECKPOINT))
    assert MISSING_CHECKPOINT in err.value.message
    assert err.value.ids == {"thread_id": mine["thread_id"], "checkpoint_id": MISSING_CHECKPOINT}


@HOW
def test_checkpoint_id_of_another_thread_is_checkpoint_not_found(agent, trip, how):
    mine, other = trip["mine"], trip["other"]
    with writes_nothing(agent, mine["thread_id"], other["thread_id"]), pytest.raises(CheckpointNotFound) as err:
        run(agent, how, turn(thread_id=mine["thread_id"], checkpoint_id=other["after_turn1"]))
    assert other["after_turn1"] in err.value.message
    assert mine["thread_id"] in err.value.message


@HOW
def test_checkpoint_id_on_a_thread_without_checkpoints_is_thread_not_found(agent, trip, how):
    fresh = unused_thread_id()
    with writes_nothing(agent, trip["mine"]["thread_id"]), pytest.raises(ThreadNotFound) as err:
        run(agent, how, turn(thread_id=fresh, checkpoint_id=trip["mine"]["after_turn1"]))
    assert fresh in err.value.message
    assert agent.storage.get_thread(fresh) is None


def test_unknown_checkpoint_id_does_not_become_the_head(agent, trip):
    # LangGraph alone would start an empty conversation there and make it the head.
    mine = trip["mine"]
    with pytest.raises(CheckpointNotFound):
        agent.predict(turn(thread_id=mine["thread_id"], checkpoint_id=MISSING_CHECKPOINT))
    answer = agent.predict(turn("Where did I say I'm going?", thread_id=mine["thread_id"]))
    assert answer.custom_outputs["parent_checkpoint_id"] == mine["after_turn3"]
    assert "SF" in text_of(answer)


MALFORMED_INPUTS = {
    "empty input": [],
    "missing role": [{"content": "hi"}],
    "unknown role": [{"role": "wizard", "content": "hi"}],
    "content a number": [{"role": "user", "content": 42}],
    "content a dict": [{"role": "user", "content": {"text": "hi"}}],
    "unknown item type": [{"type": "image", "url": "http://example.invalid/x.png"}],
    "function_call without name": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}],
}


@HOW
@pytest.mark.parametrize("items", list(MALFORMED_INPUTS.values()), ids=list(MALFORMED_INPUTS))
def test_malformed_input_is_invalid_request(agent, trip, how, items):
    thread_id = trip["mine"]["thread_id"]
    body = {"input": items, "custom_inputs": {"thread_id": thread_id}}
    with writes_nothing(agent, thread_id), pytest.raises(InvalidRequest) as caught:
        run(agent, how, body)
    # One line naming where the problem is, without pydantic's validator names or documentation links.
    message = caught.value.message
    assert "\n" not in message and "pydantic.dev" not in message and "function-after" not in message
    assert "input" in message


BAD_CUSTOM_INPUTS = {
    "thread_id an int": ({"thread_id": 123}, "thread_id"),
    "checkpoint_id a list": ({"checkpoint_id": ["a"]}, "checkpoint_id"),
    "user_id an int": ({"user_id": 7}, "user_id"),
    "thread_id empty": ({"thread_id": ""}, "thread_id"),
    "unknown key": ({"thread": "x"}, "thread"),
    "unknown action": ({"action": "rewind"}, "rewind"),
    "unknown strategy": ({"multitask_strategy": "yolo"}, "multitask_strategy"),
    "custom_inputs not an object": (["thread_id"], "custom_inputs"),
}


@HOW
@pytest.mark.parametrize("custom, named", list(BAD_CUSTOM_INPUTS.values()), ids=list(BAD_CUSTOM_INPUTS))
def test_bad_custom_inputs_are_invalid_request_naming_the_field(agent, trip, how, custom, named):
    thread_id = trip["mine"]["thread_id"]
    body = {"input": [{"role": "user", "content": "hi"}], "custom_inputs": custom}
    with writes_nothing(agent, thread_id), pytest.raises(InvalidRequest) as err:
        run(agent, how, body)
    assert named in err.value.message


@HOW
def test_context_conversation_id_that_is_not_a_string_is_invalid_request(agent, trip, how):
    body = {"input": [{"role": "user", "content": "hi"}], "context": {"conversation_id": 5}}
    with writes_nothing(agent, trip["mine"]["thread_id"]), pytest.raises(InvalidRequest):
        run(agent, how, body)


# --- history --------------------------------------------------------------------------------


def test_history_of_unknown_thread_is_thread_not_found(agent, trip):
    fresh = unused_thread_id()
    with writes_nothing(agent, trip["mine"]["thread_id"]):
        with pytest.raises(ThreadNotFound) as err:
            agent.get_checkpoint_history(fresh)
        assert fresh in err.value.message
        with pytest.raises(ThreadNotFound):
            agent.predict(request(action="get_checkpoint_history", thread_id=fresh))


def test_history_before_a_checkpoint_of_another_thread_is_checkpoint_not_found(agent, trip):
    mine, other = trip["mine"], trip["other"]
    with writes_nothing(agent, mine["thread_id"]):
        for before in (other["after_turn2"], MISSING_CHECKPOINT):
            with pytest.raises(CheckpointNotFound) as err:
                agent.get_checkpoint_history(mine["thread_id"], before=before)
            assert before in err.value.message


def test_a_very_long_unknown_id_is_clipped_in_the_message_and_kept_whole_in_ids(agent, trip):
    long_thread, long_checkpoint = "t" * 200 + "-thread-end", "c" * 250 + "-end"
    with pytest.raises(ThreadNotFound) as err:
        agent.get_checkpoint_state(long_thread)
    assert err.value.message == f"Thread {'t' * 40 + '…'!r} ({len(long_thread)} characters) was not found."
    assert err.value.ids == {"thread_id": long_thread}
    mine = trip["mine"]["thread_id"]
    with pytest.raises(CheckpointNotFound) as err:
        agent.get_checkpoint_state(mine, long_checkpoint)
    assert err.value.message == (
        f"Checkpoint {'c' * 40 + '…'!r} ({len(long_checkpoint)} characters) was not found in thread {mine!r}."
    )
    assert err.value.ids == {"thread_id": mine, "checkpoint_id": long_checkpoint}
    assert len(err.value.message) < 200
    # The ids the agent makes (UUIDs, `resp_<uuid>`) are quoted whole.
    with pytest.raises(CheckpointNotFound) as err:
        agent.get_checkpoint_state(mine, MISSING_CHECKPOINT)
    assert repr(MISSING_CHECKPOINT) in err.value.message


@pytest.mark.parametrize("limit", [0, -1, 1001, "5", 2.5, True, None])
def test_bad_history_limit_is_invalid_request(agent, trip, limit):
    thread_id = trip["mine"]["thread_id"]
    with writes_nothing(agent, thread_id):
        with pytest.raises(InvalidRequest) as err:
            agent.get_checkpoint_history(thread_id, limit=limit)
        assert "limit" in err.value.message
        with pytest.raises(InvalidRequest):
            custom = {"action": "get_checkpoint_history", "thread_id": thread_id, "limit": limit}
            agent.predict({"input": [], "custom_inputs": custom})


@pytest.mark.parametrize("thread_id", [123, None, "", ["t"]])
def test_history_thread_id_that_is_not_a_string_is_invalid_request(agent, trip, thread_id):
    with writes_nothing(agent, trip["mine"]["thread_id"]), pytest.raises(InvalidRequest) as err:
        agent.get_checkpoint_history(thread_id)
    assert "thread_id" in err.value.message


def test_history_action_refuses_input_items_and_a_missing_thread_id(agent, trip):
    thread_id = trip["mine"]["thread_id"]
    with writes_nothing(agent, thread_id):
        with pytest.raises(InvalidRequest):
            agent.predict(request("hello", action="get_checkpoint_history", thread_id=thread_id))
        with pytest.raises(InvalidRequest) as err:
            agent.predict(request(action="get_checkpoint_history"))
        assert "thread_id" in err.value.message


# --- update_checkpoint_state ----------------------------------------------------------------

TOKYO = [{"role": "user", "content": "I'm headed to Tokyo!"}]


def test_update_on_unknown_thread_is_thread_not_found(agent, trip):
    fresh = unused_thread_id()
    with writes_nothing(agent, trip["mine"]["thread_id"]):
        for checkpoint_id in (None, trip["mine"]["after_turn1"]):
            with pytest.raises(ThreadNotFound) as err:
                agent.update_checkpoint_state(fresh, checkpoint_id, TOKYO)
            assert fresh in err.value.message
        with pytest.raises(ThreadNotFound):
            agent.predict({"input": TOKYO, "custom_inputs": {"action": "update_checkpoint_state", "thread_id": fresh}})
    assert agent.storage.get_thread(fresh) is None


def test_update_at_unknown_or_foreign_checkpoint_is_checkpoint_not_found(agent, trip):
    mine, other = trip["mine"], trip["other"]
    with writes_nothing(agent, mine["thread_id"], other["thread_id"]):
        for checkpoint_id in (MISSING_CHECKPOINT, other["after_turn1"]):
            with pytest.raises(CheckpointNotFound) as err:
                agent.update_checkpoint_state(mine["thread_id"], checkpoint_id, TOKYO)
            assert checkpoint_id in err.value.message
            with pytest.raises(CheckpointNotFound):
                agent.predict(
                    {
                        "input": TOKYO,
                        "custom_inputs": {
                            "action": "update_checkpoint_state",
                            "thread_id": mine["thread_id"],
                            "checkpoint_id": checkpoint_id,
                        },
                    }
                )


@pytest.mark.parametrize(
    "new_messages",
    [
        [{"content": "no role"}],
        [{"role": "wizard", "content": "hi"}],
        [{"role": "user", "content": 42}],
        [{"type": "image", "url": "x"}],
        [{"type": "function_call_output", "output": "14"}],
        {"role": "user", "content": "a dict, not a list"},
        "I'm headed to Tokyo!",
    ],
    ids=["missing role", "unknown role", "content a number", "unknown type", "output without call_id", "dict", "str"],
)
def test_update_with_malformed_messages_is_invalid_request(agent, trip, new_messages):
    mine = trip["mine"]
    with writes_nothing(agent, mine["thread_id"]), pytest.raises(InvalidRequest):
        agent.update_checkpoint_state(mine["thread_id"], mine["after_turn1"], new_messages)


@pytest.mark.parametrize(
    "thread_id, checkpoint_id, named",
    [(123, None, "thread_id"), (None, None, "thread_id"), ("ok", ["a"], "checkpoint_id"), ("ok", 5, "checkpoint_id")],
)
def test_update_with_ids_that_are_not_strings_is_invalid_request(agent, trip, thread_id, checkpoint_id, named):
    thread_id = trip["mine"]["thread_id"] if thread_id == "ok" else thread_id
    with writes_nothing(agent, trip["mine"]["thread_id"]), pytest.raises(InvalidRequest) as err:
        agent.update_checkpoint_state(thread_id, checkpoint_id, TOKYO)
    assert named in err.value.message


# --- the error types ------------------------------------------------------------------------

STATUSES = {
    InvalidRequest: 400,
    ConfigurationError: 400,
    ThreadNotFound: 404,
    CheckpointNotFound: 404,
    ThreadBusy: 409,
    ModelError: 503,
    StorageUnavailable: 503,
    ServerBusy: 429,
    ServerStopping: 503,
}


@pytest.mark.parametrize("error_type", list(STATUSES), ids=lambda t: t.__name__)
def test_errors_are_importable_from_agent_and_map_to_http_statuses(error_type):
    assert getattr(agent_package, error_type.__name__) is error_type
    assert error_type.__name__ in agent_package.__all__
    assert issubclass(error_type, AgentError) and not issubclass(error_type, MlflowException)
    error = error_type("something went wrong", thread_id="t1")
    assert http_status(error) == STATUSES[error_type]
    # What MLflow's scoring server sees: the same error, also an MlflowException with the same status.
    served = as_mlflow_exception(error)
    assert isinstance(served, error_type) and isinstance(served, MlflowException)
    assert served.get_http_status_code() == STATUSES[error_type] and served.ids == {"thread_id": "t1"}
    assert error.ids == {"thread_id": "t1"}
    assert error.message == "something went wrong"


def test_raised_errors_carry_their_http_status(agent, trip):
    mine = trip["mine"]
    with pytest.raises(CheckpointNotFound) as missing:
        agent.predict(turn(thread_id=mine["thread_id"], checkpoint_id=MISSING_CHECKPOINT))
    with pytest.raises(ThreadNotFound) as unknown:
        agent.get_checkpoint_history(unused_thread_id())
    with pytest.raises(InvalidRequest) as invalid:
        agent.predict({"input": []})
    assert [http_status(e.value) for e in (missing, unknown, invalid)] == [404, 404, 400]
