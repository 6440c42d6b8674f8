"""Hostile import documents, on Postgres and SQLite: refused at import, or safe in every later operation.

Each example starts from a valid exported thread (turns, a tool call, a branch,
state updates that leave pending writes) and mutates it: a value anywhere replaced by a hostile one
(huge, negative, float, NaN, infinite, boolean or text numbers, deep or huge
JSON, odd Unicode, wrong types), a key dropped or renamed, a list element
doubled (duplicate ids). The document is imported; then either the import
was `InvalidRequest` (a 400) and wrote nothing, or every operation on the
imported thread works: its state, history, branches, usage, export (and the
export imports again), a turn with the offline model, and a retention sweep
(`delete` or `keep_latest`) that removes it. Nothing else: no other
exception, now or later. A `set` value (a join edge's barrier, in a graph of one's own)
in the built-in graph's channels and writes imports and works everywhere after too.

One database per backend for the module (the examples share it; each imports
under a new thread id, so the copies get their own checkpoint ids).
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent import create_agent
from agent.errors import AgentError, InterruptPending, InvalidRequest
from agent.serving.errors import http_status
from tests.helpers.databases import fresh_database
from tests.helpers.scenario import outputs, say

MAX_EXAMPLES = 250  # a few seconds per backend; about a sixth of the examples get past the import

_FAR_FUTURE = datetime.now(UTC) + timedelta(days=365 * 200)


def _nested(depth: int):
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([10**30, -(10**30), 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, float("nan"), float("inf"), -float("inf")]),
    st.sampled_from([0, -1, 1.5, -0.0, 2**53 + 1, True, False, "1", "1e3", "NaN", ""]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)
ODD_TEXT = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=()), max_size=12),  # lone surrogates, controls, NUL
    st.sampled_from(["\x00", "\u202e", "\ufeff", "a\u0000b", "\\u0000", "日本語", "💥" * 50, " ", "..", "%s"]),
    st.integers(1, 4).map(lambda n: "x" * (10 ** (n + 1))),
)
HOSTILE = st.one_of(
    HOSTILE_NUMBERS,
    ODD_TEXT,
    st.none(),
    st.just([]),
    st.just({}),
    st.integers(1, 1500).map(_nested),
    st.dictionaries(ODD_TEXT, HOSTILE_NUMBERS | ODD_TEXT, max_size=20),
    st.lists(HOSTILE_NUMBERS | ODD_TEXT, max_size=5),
)


def _paths(value, prefix=()):
    """Every path (a tuple of keys and indexes) into `value`, the root excepted."""
    found = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return found
    for key, child in items:
        path = (*prefix, key)
        found.append(path)
        found.extend(_paths(child, path))
    return found


def _parent(document, path):
    node = document
    for key in path[:-1]:
        node = node[key]
    return node


def _mutate(document, mutation) -> None:
    kind, path, value = mutation
    parent, key = _parent(document, path), path[-1]
    if kind == "replace":
        parent[key] = value
    elif kind == "drop":
        del parent[key]
    elif kind == "double":
        if isinstance(parent, list):
            parent.insert(key, parent[key])  # the same object twice: a deep value may be too deep to copy
        else:
            parent[key] = [parent[key], parent[key]]
    elif kind == "rename" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else str(value)] = parent.pop(key)


@pytest.fixture(scope="module")
def agents(pg_server_url, tmp_path_factory):
    """Per backend: an agent that deletes expired threads, one (same database) that keeps their head,
    and a valid document to mutate."""
    sqlite_path = tmp_path_factory.mktemp("hostile") / "imports.sqlite"
    with fresh_database(pg_server_url, prefix="tt_hostile") as pg_url:
        made = {}
        for backend, url in (("postgres", pg_url), ("sqlite", f"sqlite:///{sqlite_path}")):
            delete = create_agent(url, model="offline", tracing=False, thread_ttl_strategy="delete")
            keep = create_agent(url, model="offline", tracing=False, thread_ttl_strategy="keep_latest")
            made[backend] = (delete, keep, _base_document(delete))
        yield made
        for delete, keep, _ in made.values():
            delete.close()
            keep.close()


def _base_document(agent) -> dict:
    first = outputs(say(agent, "I'm planning a trip", user_id="u"))
    thread_id = first["thread_id"]
    say(agent, "calculate 6*7", thread_id=thread_id, user_id="u")
    say(agent, "I'm headed to SF", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="u")
    # Pending writes: a state update appends a message, another removes one.
    agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "added"}], user_id="u")
    victim = agent.get_checkpoint_state(thread_id, user_id="u")["messages"][0]["id"]
    agent.update_checkpoint_state(thread_id, None, None, remove_message_ids=[victim], user_id="u")
    agent.update_thread(thread_id, title="Trip", metadata={"app": "web"}, user_id="u")
    document = json.loads(json.dumps(agent.export_thread(thread_id, user_id="u")))
    agent.delete_thread(thread_id, user_id="u")
    return document


def _every_operation(agent, keep, thread_id: str) -> None:
    """Every operation on the imported thread; any exception fails the example."""
    agent.get_checkpoint_state(thread_id, user_id="u")
    history = agent.get_checkpoint_history(thread_id, 1000, user_id="u")
    agent.list_branches(thread_id, user_id="u")
    agent.get_usage(thread_id, user_id="u")
    for entry in history[:3]:
        agent.get_checkpoint_state(thread_id, entry["checkpoint_id"], user_id="u")
        agent.get_usage(thread_id, entry["checkpoint_id"], user_id="u")
    exported = json.loads(json.dumps(agent.export_thread(thread_id, user_id="u"), allow_nan=False))
    copied = agent.import_thread(exported, user_id="u", thread_id=str(uuid.uuid4()))
    agent.delete_thread(copied["thread_id"], user_id="u")
    try:
        say(agent, "and now?", thread_id=thread_id, user_id="u")
    except InterruptPending:  # the document left the graph waiting for an answer: a correct 409
        pass
    # Retention: every imported thread expires (its own ttl); the sweep handles it and nothing else fails.
    agent.update_thread(thread_id, ttl_seconds=1, user_id="u")
    result = agent.sweep_expired_threads(now=_FAR_FUTURE)
    assert result["failed_thread_ids"] == [], result
    if agent is keep:
        say(agent, "after the sweep", thread_id=thread_id, user_id="u")
        agent.get_checkpoint_history(thread_id, 1000, user_id="u")
        agent.export_thread(thread_id, user_id="u")
        agent.delete_thread(thread_id, user_id="u")
    else:
        assert thread_id in result["deleted_thread_ids"]


#: Hostile values of the same JSON type as the value they replace (more of these get past the import).
LIKE = {
    int: st.one_of(HOSTILE_NUMBERS.filter(lambda v: isinstance(v, int)), st.integers(-(2**64), 2**64)),
    float: HOSTILE_NUMBERS,
    str: ODD_TEXT,
    bool: st.sampled_from([0, 1, "true", None]),
    dict: st.one_of(st.dictionaries(ODD_TEXT, HOSTILE, max_size=20), st.integers(1, 1500).map(lambda n: {"k": _nested(n)})),
    list: st.lists(HOSTILE, max_size=5),
}


def _draw_mutations(data, document) -> list:
    paths = _paths(document)
    mutations = []
    for _ in range(data.draw(st.integers(1, 3), label="how many")):
        kind = data.draw(st.sampled_from(["like", "like", "like", "replace", "drop", "double", "rename"]), label="kind")
        path = data.draw(st.sampled_from(paths), label="path")
        original = _parent(document, path)[path[-1]]
        values = LIKE.get(type(original), HOSTILE) if kind == "like" else HOSTILE
        mutations.append(("replace" if kind == "like" else kind, path, data.draw(values, label="value")))
    return mutations


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
@given(data=st.data())
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_a_hostile_document_is_refused_at_import_or_works_everywhere_after(agents, backend, data):
    delete, keep, base = agents[backend]
    agent = data.draw(st.sampled_from([delete, keep]), label="sweeper")
    document = copy.deepcopy(base)
    for mutation in _draw_mutations(data, base):
        try:
            _mutate(document, mutation)
        except (KeyError, IndexError, TypeError):  # an earlier mutation changed the path's shape
            pass
    thread_id = str(uuid.uuid4())
    try:
        agent.import_thread(document, user_id="u", thread_id=thread_id)
    except InvalidRequest as exc:
        event("refused at import")
        assert http_status(exc) == 400
        with pytest.raises(AgentError):
            agent.get_thread(thread_id, user_id="u")  # nothing was written
        return
    event("imported")
    _every_operation(agent, keep, thread_id)


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_pending_write_whose_task_id_holds_a_backslash_reads_back_and_runs(agents, backend):
    # Postgres read it with `text::bytea`, which takes a backslash for an escape: every read of the
    # checkpoint failed ("invalid input syntax for type bytea"); hypothesis found it in the test above.
    delete, keep, base = agents[backend]
    document = copy.deepcopy(base)
    written = [c for c in document["checkpoints"] if c.get("pending_writes")]
    assert written, "the base document has pending writes"
    written[0]["pending_writes"][0]["task_id"] = "\\"
    thread_id = str(uuid.uuid4())
    keep.import_thread(document, user_id="u", thread_id=thread_id)
    history = keep.get_checkpoint_history(thread_id, 1000, user_id="u")
    assert len(history) == len(document["checkpoints"])
    for entry in history:  # the import gives the copy new checkpoint ids: read every one
        assert keep.get_checkpoint_state(thread_id, entry["checkpoint_id"], user_id="u")["checkpoint_id"] == entry["checkpoint_id"]
    _every_operation(keep, keep, thread_id)


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
@pytest.mark.parametrize("sweeper", ["delete", "keep"])
def test_sets_in_the_built_in_graphs_channels_and_writes_import_and_work_everywhere_after(agents, backend, sweeper):
    # A `set` value (a join edge's barrier in a graph of one's own) may name any channel: the agent's
    # own state (`context_summary`, a trigger channel) then holds a set where it writes other values.
    delete, keep, base = agents[backend]
    agent = keep if sweeper == "keep" else delete
    document = copy.deepcopy(base)
    for checkpoint in document["checkpoints"]:
        for channel in ("context_summary", "branch:to:agent"):
            if "messages" in checkpoint["channel_versions"]:
                checkpoint["channel_versions"][channel] = checkpoint["channel_versions"]["messages"]
                checkpoint["channel_values"][channel] = {"type": "set", "value": [1, "a", None, False, 2.5]}
        for write in checkpoint.get("pending_writes", []):
            write["channel"] = "context_summary"
            write["value"] = {"type": "set", "value": ["x"]}
    thread_id = str(uuid.uuid4())
    agent.import_thread(document, user_id="u", thread_id=thread_id)
    _every_operation(agent, keep, thread_id)
