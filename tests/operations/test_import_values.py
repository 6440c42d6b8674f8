"""The domain of every value of an import document (`agent.operations.transfer.values`), on Postgres and SQLite.

A value outside its domain is `InvalidRequest` naming the field, and nothing is written (every
table's rows counted); a value at the edge of its domain imports and works in every later
operation: state, history, usage, export (which imports again), a turn, a sweep. The documents
are what `export_thread` writes now (version 2); the same checks hold for version 1 documents.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.errors import InvalidRequest
from agent.operations.transfer.values import MAX_DEPTH, MAX_INTEGER, MAX_TOKENS
from tests.helpers.reliability import all_rows
from tests.helpers.scenario import outputs, say


@pytest.fixture
def exported(agent) -> dict:
    """A thread of three turns (one with a tool call) and a state update, exported, then deleted."""
    thread_id = outputs(say(agent, "I'm planning a trip"))["thread_id"]
    say(agent, "calculate 6*7", thread_id=thread_id)
    say(agent, "I'm headed to SF", thread_id=thread_id)
    agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "added"}])
    document = json.loads(json.dumps(agent.export_thread(thread_id)))
    agent.delete_thread(thread_id)
    return document


def last(document: dict) -> dict:
    """The newest checkpoint with model usage (a turn's)."""
    return [c for c in document["checkpoints"] if "usage" in c["metadata"]][-1]


def first_write(document: dict) -> dict:
    return next(c for c in document["checkpoints"] if c.get("pending_writes"))["pending_writes"][0]


def written_messages(document: dict) -> list:
    """The messages the newest turn's checkpoint holds (version 1) or adds (version 2)."""
    value = last(document)["channel_values"]["messages"]
    return value["value"]["add"] if value["type"] == "message_changes" else value["value"]


def set_in(path: tuple, value):
    def mutate(document: dict) -> None:
        node = last(document) if path[0] == "last" else document
        for key in path[1:-1] if path[0] == "last" else path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _nested(depth: int):
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def _message_data(document: dict) -> dict:
    return written_messages(document)[-1]["data"]


REFUSED = {
    # channel versions: LangGraph's savers write strings; a float or NaN gave a 503 (a plpgsql signature
    # mismatch), a number of another kind a 500 on the next turn
    "version float": (set_in(("last", "channel_versions", "messages"), 1.5), "channel_versions['messages']"),
    "version nan": (set_in(("last", "channel_versions", "messages"), float("nan")), "channel_versions.messages is nan"),
    "version int": (set_in(("last", "channel_versions", "messages"), 7), "channel_versions['messages']"),
    "version negative": (set_in(("last", "channel_versions", "messages"), -5), "channel_versions['messages']"),
    "version text": (set_in(("last", "channel_versions", "messages"), "abc"), "channel_versions['messages']"),
    "seen version infinite": (set_in(("last", "versions_seen", "agent", "branch:to:agent"), float("inf")), "is inf"),
    # usage and the turn report
    "usage huge": (set_in(("last", "metadata", "usage"), {"input_tokens": 10**30, "output_tokens": 1}), "usage.input_tokens"),
    "usage over the bound": (set_in(("last", "metadata", "usage"), {"input_tokens": MAX_TOKENS + 1, "output_tokens": 1}),
                             "usage.input_tokens"),  # fmt: skip
    "usage negative": (set_in(("last", "metadata", "usage"), {"input_tokens": -5, "output_tokens": 1}), "usage.input_tokens"),
    "usage float": (set_in(("last", "metadata", "usage"), {"input_tokens": 1.5, "output_tokens": 1}), "usage.input_tokens"),
    "usage text": (set_in(("last", "metadata", "usage"), {"input_tokens": "9", "output_tokens": 1}), "usage.input_tokens"),
    "usage bool": (set_in(("last", "metadata", "usage"), {"input_tokens": True, "output_tokens": 1}), "usage.input_tokens"),
    "usage a list": (set_in(("last", "metadata", "usage"), [1, 2]), "metadata.usage"),
    "model input tokens text": (set_in(("last", "metadata", "model_input_tokens"), "x"), "model_input_tokens"),
    "summary used text": (set_in(("last", "metadata", "summary_used"), "yes"), "summary_used"),
    # LangGraph's own metadata
    "step text": (set_in(("last", "metadata", "step"), "2"), "metadata.step"),
    "step missing": (lambda d: last(d)["metadata"].pop("step"), "metadata.step is missing"),
    "source a number": (set_in(("last", "metadata", "source"), 5), "metadata.source"),
    "checkpoint format": (set_in(("last", "v"), 99), ".v must be"),
    # timestamps Python reads and others do not
    "ts a week date": (set_in(("last", "ts"), "2024-W01-1"), ".ts must be"),
    "ts without offset": (set_in(("last", "ts"), "2024-01-01T00:00:00"), ".ts must be"),
    "created_at garbage": (set_in(("thread", "created_at"), "yesterday"), "thread.created_at"),
    # numbers and nesting anywhere
    "metadata integer beyond 64 bits": (set_in(("last", "metadata", "x"), 2**64), "metadata.x is an integer beyond 64 bits"),
    "message NaN": (lambda d: _message_data(d).__setitem__("response_metadata", {"x": float("nan")}), "is nan"),
    "message usage huge": (lambda d: _message_data(d).__setitem__(
        "usage_metadata", {"input_tokens": 10**30, "output_tokens": 1, "total_tokens": 1}), "beyond 64 bits"),  # fmt: skip
    "nested too deep": (set_in(("last", "metadata", "x"), _nested(MAX_DEPTH)), "nested deeper than"),
    # names and the thread record
    "task id with a NUL": (lambda d: first_write(d).__setitem__("task_id", "a\x00b"), "task_id"),
    "channel name empty": (lambda d: first_write(d).__setitem__("channel", ""), "pending_writes[0].channel"),
    "ttl 1e308": (set_in(("thread", "ttl_seconds"), 1e308), "ttl_seconds"),
    "message_count negative": (set_in(("thread", "message_count"), -1), "thread.message_count"),
    "forked_from other keys": (set_in(("thread", "forked_from"), {"a": "b"}), "thread.forked_from"),
    "a message type that is a list": (lambda d: written_messages(d)[0].__setitem__("type", []),
                                      "must be {'type'"),  # fmt: skip
    "a tool call that is a list": (lambda d: _message_data(d).__setitem__("tool_calls", [[1]]), "cannot load"),
}


@pytest.mark.parametrize(("mutate", "named"), list(REFUSED.values()), ids=list(REFUSED))
def test_a_value_outside_its_domain_is_refused_naming_it(agent, exported, mutate, named):
    document = copy.deepcopy(exported)
    mutate(document)
    before = all_rows(agent.settings.database_url)
    with pytest.raises(InvalidRequest) as refused:
        agent.import_thread(document)
    assert named in refused.value.message and "nothing was written" in refused.value.message
    assert all_rows(agent.settings.database_url) == before


EDGES = {
    "usage at the bound": set_in(("last", "metadata", "usage"), {"input_tokens": MAX_TOKENS, "output_tokens": MAX_TOKENS}),
    "step at the bound": set_in(("last", "metadata", "step"), MAX_TOKENS),
    "64-bit integers in metadata": set_in(("last", "metadata", "x"), [MAX_INTEGER, -MAX_INTEGER, 0.5, -0.0]),
    "nested to the bound": set_in(("last", "metadata", "x"), _nested(MAX_DEPTH - 5)),
    "ts in UTC with Z": set_in(("last", "ts"), "2024-05-01T12:00:00Z"),
    "ts with another offset": set_in(("last", "ts"), "2024-05-01T12:00:00.123+05:30"),
    "odd unicode in a message": lambda d: _message_data(d).__setitem__("content", "\u202e\ufeff 日本語 💥 \x00"),
}


@pytest.mark.parametrize("mutate", list(EDGES.values()), ids=list(EDGES))
def test_a_value_at_the_edge_of_its_domain_works_everywhere_after(agent, exported, mutate):
    document = copy.deepcopy(exported)
    mutate(document)
    thread_id = agent.import_thread(document, thread_id=str(uuid.uuid4()))["thread_id"]

    agent.get_checkpoint_state(thread_id)
    history = agent.get_checkpoint_history(thread_id, 100)
    agent.list_branches(thread_id)
    usage = agent.get_usage(thread_id)
    for entry in history:
        agent.get_usage(thread_id, entry["checkpoint_id"])
    again = json.loads(json.dumps(agent.export_thread(thread_id), allow_nan=False))
    agent.delete_thread(agent.import_thread(again, thread_id=str(uuid.uuid4()))["thread_id"])
    assert usage["thread_usage"]["input_tokens"] >= 0
    say(agent, "and now?", thread_id=thread_id)
    agent.update_thread(thread_id, ttl_seconds=1)
    swept = agent.sweep_expired_threads(now=datetime.now(UTC) + timedelta(days=1))
    # The session's database holds other tests' threads too, which this sweep may remove as well.
    assert thread_id in swept["deleted_thread_ids"] and thread_id not in swept["failed_thread_ids"]


VERSION_1 = Path(__file__).parent / "fixtures" / "thread-v1.json"


@pytest.mark.parametrize(
    ("version", "named"), [(1.5, "channel_versions['messages']"), (float("nan"), "is nan")], ids=["float", "nan"]
)
def test_a_version_1_document_goes_through_the_same_checks(agent, version, named):
    document = json.loads(VERSION_1.read_text(encoding="utf-8"))
    assert document["version"] == 1
    last(document)["channel_versions"]["messages"] = version
    before = all_rows(agent.settings.database_url)
    with pytest.raises(InvalidRequest, match=re.escape(named)):
        agent.import_thread(document)
    assert all_rows(agent.settings.database_url) == before
