"""Export and import (`agent.operations.transfer`): whole threads as versioned JSON documents.

* A hypothesis round trip: random trees (turns, tool calls, branches from earlier checkpoints,
  `update_checkpoint_state` appends, removals and replacements (a removal and its replacement in one
  update too), edits whose input has an id, head switches; the refused ones, two items of one id and an
  edit taking the id of a message it keeps, write nothing) on one backend, exported, sent through
  `json.dumps`/`json.loads`, imported into the other (Postgres -> SQLite and SQLite -> Postgres), read back
  the same everywhere: history (ids, parents, order, every field), every checkpoint's state, branches,
  usage, and the re-exported checkpoints byte for byte. The imported thread is usable (a turn from the
  head, a branch from the root), and importing the document again writes nothing.
* Malformed documents are `InvalidRequest` and write nothing (row counts of every table).
* Conflicts (`ThreadExists`), ownership, a copy under another thread id, the actions and the CLI.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import InvalidRequest, ThreadExists, ThreadNotFound
from agent.models import CALCULATE_PREFIX
from agent.operations.transfer import parse_document
from tests.helpers.reliability import head_messages, user_texts
from tests.helpers.scenario import outputs, say, text_of

MAX_EXAMPLES = 6

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: not s.lower().startswith(CALCULATE_PREFIX)
)
picks = st.integers(min_value=0, max_value=10_000)
operation = st.one_of(
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("tool"), st.integers(1, 99)),
    st.tuples(st.just("branch"), picks, texts),
    st.tuples(st.just("update"), st.none() | picks, texts),
    st.tuples(st.just("remove"), picks, picks),
    st.tuples(st.just("replace"), picks, picks, texts, st.booleans()),
    st.tuples(st.just("edit"), picks, picks, texts, st.none() | picks),
    st.tuples(st.just("duplicate"), st.none() | picks, texts),
    st.tuples(st.just("switch"), picks),
)
operations = st.lists(operation, min_size=2, max_size=7)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'transfer.sqlite'}"


@pytest.fixture
def agents(pg_url, sqlite_url, make_agent) -> dict:
    """One offline agent per backend, at once: {"postgres": agent, "sqlite": agent}."""
    return {"postgres": make_agent(pg_url), "sqlite": make_agent(sqlite_url)}


def row_counts(agent) -> dict[str, int]:
    """Rows in every table of the agent's database (all the agent's, LangGraph's and the memory store's)."""
    url = agent.settings.database_url
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in names}
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in names}


def build_tree(agent, ops, *, user_id: str | None = None) -> str:
    """A thread made of `ops` (see the module docstring); its id."""
    thread_id = str(uuid.uuid4())
    say(agent, "first", thread_id=thread_id, user_id=user_id)
    for op in ops:
        ids = [e["checkpoint_id"] for e in agent.get_checkpoint_history(thread_id, 1000, user_id=user_id)][::-1]
        pick = lambda n: ids[n % len(ids)]  # noqa: E731
        kind = op[0]
        if kind == "turn":
            say(agent, op[1], thread_id=thread_id, user_id=user_id)
        elif kind == "tool":
            say(agent, f"calculate {op[1]}*2", thread_id=thread_id, user_id=user_id)
        elif kind == "branch":
            say(agent, op[2], thread_id=thread_id, checkpoint_id=pick(op[1]), user_id=user_id)
        elif kind == "update":
            at = None if op[1] is None else pick(op[1])
            agent.update_checkpoint_state(thread_id, at, [{"role": "user", "content": op[2]}], user_id=user_id)
        elif kind == "remove":
            state = agent.get_checkpoint_state(thread_id, pick(op[1]), user_id=user_id)
            if len(state["messages"]) >= 2:
                victim = state["messages"][op[2] % len(state["messages"])]["id"]
                try:
                    agent.update_checkpoint_state(
                        thread_id, state["checkpoint_id"], None, remove_message_ids=[victim], user_id=user_id
                    )
                except InvalidRequest:  # e.g. removing it would leave an unanswered tool call; nothing written
                    pass
        elif kind == "replace":  # an item with a message's id; with the removal of that message too, or not
            state = agent.get_checkpoint_state(thread_id, pick(op[1]), user_id=user_id)
            replaceable = [i for i in state["messages"] if i["type"] == "message"]
            if replaceable:
                old = replaceable[op[2] % len(replaceable)]
                item = {"role": old["role"], "content": op[3], "id": old["id"]}
                removed = [old["id"]] if op[4] else None
                agent.update_checkpoint_state(
                    thread_id, state["checkpoint_id"], [item], remove_message_ids=removed, user_id=user_id
                )
        elif kind == "edit":  # a user message, with an input id drawn from the checkpoint's messages (or none)
            state = agent.get_checkpoint_state(thread_id, pick(op[1]), user_id=user_id)
            items = state["messages"]
            users = [n for n, i in enumerate(items) if i.get("role") == "user"]
            if users:
                position = users[op[2] % len(users)]
                taken = None if op[4] is None else op[4] % len(items)
                item = {"role": "user", "content": op[3]} | ({} if taken is None else {"id": items[taken]["id"]})
                custom = {"thread_id": thread_id, "checkpoint_id": state["checkpoint_id"],
                          "edit_message_id": items[position]["id"], "user_id": user_id}  # fmt: skip
                body = {"input": [item], "custom_inputs": custom}
                before = agent.get_checkpoint_history(thread_id, 1000, user_id=user_id)
                # The ids of the messages before it (a function_call item's id is its call's, not a message's).
                kept = {i["id"] for i in items[:position] if i["type"] != "function_call"}
                if taken is not None and items[taken]["id"] in kept:  # it would replace a message the edit keeps
                    with pytest.raises(InvalidRequest, match="which comes before it"):
                        agent.predict(body)
                    assert agent.get_checkpoint_history(thread_id, 1000, user_id=user_id) == before
                else:
                    agent.predict(body)
        elif kind == "duplicate":  # two items of one id: refused, nothing written
            at = None if op[1] is None else pick(op[1])
            before = agent.get_checkpoint_history(thread_id, 1000, user_id=user_id)
            items = [{"role": role, "content": op[2], "id": "twice"} for role in ("user", "assistant")]
            with pytest.raises(InvalidRequest, match="duplicate id"):
                agent.update_checkpoint_state(thread_id, at, items, user_id=user_id)
            assert agent.get_checkpoint_history(thread_id, 1000, user_id=user_id) == before
        elif kind == "switch":
            agent.set_head(thread_id, pick(op[1]), user_id=user_id)
    return thread_id


def snapshot(agent, thread_id: str, user_id: str | None) -> dict:
    """Everything a client can read about a thread."""
    history = agent.get_checkpoint_history(thread_id, 1000, user_id=user_id)
    return {
        "history": history,
        "states": {e["checkpoint_id"]: agent.get_checkpoint_state(thread_id, e["checkpoint_id"], user_id=user_id) for e in history},
        "branches": agent.list_branches(thread_id, user_id=user_id),
        "usage": agent.get_usage(thread_id, user_id=user_id),
    }


@pytest.mark.parametrize("direction", [("postgres", "sqlite"), ("sqlite", "postgres")], ids="->".join)
@given(ops=operations)
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_random_tree_reads_back_the_same_in_the_other_backend(agents, direction, ops):
    source, target = agents[direction[0]], agents[direction[1]]
    thread_id = build_tree(source, ops, user_id="alice")
    document = json.loads(json.dumps(source.export_thread(thread_id, user_id="alice")))
    assert document["format"] == "timetravel-agent.thread" and document["version"] == 2
    assert "user_id" not in document["thread"]

    imported = target.import_thread(document, user_id="bob")  # the importer decides the owner

    assert imported["thread_id"] == thread_id and imported["user_id"] == "bob"
    before = snapshot(source, thread_id, "alice")
    assert snapshot(target, thread_id, "bob") == before
    assert target.export_thread(thread_id, user_id="bob")["checkpoints"] == document["checkpoints"]
    with pytest.raises(ThreadNotFound):
        target.export_thread(thread_id, user_id="alice")

    counts = row_counts(target)
    assert target.import_thread(document, user_id="bob") == imported  # again: a no-op
    assert row_counts(target) == counts

    # Usable: a turn from the head continues it; a turn from the root is a new branch.
    head = imported["checkpoint_id"]
    turn = outputs(say(target, "and now?", thread_id=thread_id, user_id="bob"))
    assert turn["parent_checkpoint_id"] == head
    root = before["history"][-1]["checkpoint_id"]
    branch = outputs(say(target, "again", thread_id=thread_id, checkpoint_id=root, user_id="bob"))
    assert branch["parent_checkpoint_id"] == root
    history = target.get_checkpoint_history(thread_id, 1000, user_id="bob")
    assert [e["checkpoint_id"] for e in history[:2]] == [branch["checkpoint_id"], turn["checkpoint_id"]]  # newest first
    assert history[2:] == [{**e, "is_head": False} for e in before["history"]]


def test_a_thread_with_a_context_summary_continues_alike_after_the_trip(pg_url, sqlite_url, make_agent):
    budget = {"max_context_tokens": 900, "context_strategy": "summarize"}  # small enough to need a summary
    source, target = make_agent(pg_url, **budget), make_agent(sqlite_url, **budget)
    thread_id = str(uuid.uuid4())
    for n in range(8):
        say(source, f"message number {n} " + "word " * 40, thread_id=thread_id)
    document = json.loads(json.dumps(source.export_thread(thread_id)))
    head = parse_document(document).values[document["thread"]["checkpoint_id"]]
    assert head["context_summary"]["text"]  # the summary travels with the state
    target.import_thread(document)
    replies = [text_of(say(agent, "what did I say?", thread_id=thread_id)) for agent in (source, target)]
    assert replies[0].endswith("with a summary]")
    assert replies[0] == replies[1]


@pytest.fixture
def exported(backend_url, make_agent):
    """(agent, its thread's document, the thread id): a thread with a tool call and a branch."""
    agent = make_agent(backend_url)
    thread_id = build_tree(agent, [("tool", 3), ("turn", "hello"), ("branch", 1, "other")])
    return agent, agent.export_thread(thread_id), thread_id


def _chain(doc):
    """Root, then its first child, then that one's first child (the first three checkpoints of a branch)."""
    by_parent = {}
    for c in doc["checkpoints"]:
        by_parent.setdefault(c["parent_checkpoint_id"], []).append(c)
    root = by_parent[None][0]
    a = by_parent[root["checkpoint_id"]][0]
    b = by_parent[a["checkpoint_id"]][0]
    return root, a, b


def _set(path, value):
    def mutate(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _cycle(doc):
    root, a, b = _chain(doc)
    a["parent_checkpoint_id"] = b["checkpoint_id"]


def _two_roots(doc):
    _chain(doc)[1]["parent_checkpoint_id"] = None


def _missing_parent(doc):
    _chain(doc)[2]["parent_checkpoint_id"] = str(uuid.uuid4())


def _duplicate(doc):
    doc["checkpoints"].append(copy.deepcopy(doc["checkpoints"][-1]))


def _message(mutation):
    def mutate(doc):
        changes = _chain(doc)[2]["channel_values"]["messages"]
        assert changes["type"] == "message_changes"  # a turn adds its messages to its parent's
        mutation(changes["value"]["add"])

    return mutate


def _changes(mutation):
    """Mutate the `message_changes` of the second turn's checkpoint: (its value, the parent's messages)."""

    def mutate(doc):
        root, first, second = _chain(doc)
        mutation(second["channel_values"]["messages"], copy.deepcopy(first["channel_values"]["messages"]["value"]))

    return mutate


MALFORMED = {
    "not an object": lambda doc: ["a", "list"],
    "wrong format": _set(["format"], "langgraph.thread"),
    "future version": _set(["version"], 3),
    "unknown field": _set(["thread", "owner"], "x"),
    "no checkpoints": _set(["checkpoints"], []),
    "thread id not a string": _set(["thread", "thread_id"], 7),
    "metadata value not a string": _set(["thread", "metadata"], {"k": 1}),
    "17 metadata pairs": _set(["thread", "metadata"], {f"k{i}": "v" for i in range(17)}),
    "metadata value too long": _set(["thread", "metadata"], {"k": "v" * 513}),
    "empty title": _set(["thread", "title"], ""),
    "title too long": _set(["thread", "title"], "t" * 257),
    "ttl not positive": _set(["thread", "ttl_seconds"], 0),
    "unknown head": _set(["thread", "checkpoint_id"], str(uuid.uuid4())),
    "timestamp not ISO": lambda doc: _chain(doc)[1].update(ts="yesterday"),
    "version as text": lambda doc: _chain(doc)[1].update(v="4"),
    "checkpoint id not a UUID": lambda doc: _chain(doc)[0].update(checkpoint_id="root"),
    "missing parent": _missing_parent,
    "two roots": _two_roots,
    "cycle": _cycle,
    "duplicate checkpoint": _duplicate,
    "NUL in metadata": lambda doc: _chain(doc)[1]["metadata"].update(note="a\x00b"),
    "NaN in metadata": lambda doc: _chain(doc)[1]["metadata"].update(score=float("nan")),
    "channel without a version": lambda doc: _chain(doc)[1]["channel_values"].update(extra={"type": "json", "value": 1}),
    "messages typed as json": lambda doc: _chain(doc)[1]["channel_values"]["messages"].update(type="json"),
    "unknown message type": _message(lambda ms: ms[0].update(type="remove")),
    "message content not text": _message(lambda ms: ms[0]["data"].update(content=5)),
    "message without id": _message(lambda ms: ms[0]["data"].update(id=None)),
    "lone surrogate": _message(lambda ms: ms[0]["data"].update(content="\ud800")),
    # Version 2's changes must apply to the parent.
    "changes in a version 1 document": _set(["version"], 1),
    "unchanged with a value": _changes(lambda value, parent: value.update(type="unchanged")),
    "unchanged without a parent value": lambda doc: _chain(doc)[1]["channel_values"].update(messages={"type": "unchanged"}),
    "changes without a parent value": lambda doc: _chain(doc)[1]["channel_values"]["messages"].update(
        type="message_changes", value={"add": []}),
    "removing a message the parent lacks": _changes(lambda value, parent: value["value"].update(remove=[str(uuid.uuid4())])),
    "removing a message twice": _changes(
        lambda value, parent: value["value"].update(remove=[parent[0]["data"]["id"]] * 2)),
    "removing and replacing a message": _changes(
        lambda value, parent: value["value"].update(remove=[parent[0]["data"]["id"]], add=[parent[0]])),
    "an added id twice": _changes(lambda value, parent: value["value"]["add"].append(copy.deepcopy(value["value"]["add"][0]))),
    "unknown field in the changes": _changes(lambda value, parent: value["value"].update(replace=[])),
    "changes not an object": _changes(lambda value, parent: value.update(value=[])),
    "a pending write typed unchanged": lambda doc: _chain(doc)[1].update(
        pending_writes=[{"task_id": "t", "channel": "messages", "value": {"type": "unchanged"}}]),
    "added messages not loadable": _changes(lambda value, parent: value["value"]["add"][0].update(type="remove")),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_document_is_invalid_request_and_writes_nothing(exported, name):
    agent, document, thread_id = exported
    agent.delete_thread(thread_id)  # so that only the document's validity decides
    broken = copy.deepcopy(document)
    broken = MALFORMED[name](broken) or broken
    counts = row_counts(agent)
    with pytest.raises(InvalidRequest, match="nothing was written|must|document"):
        agent.import_thread(broken)
    assert row_counts(agent) == counts
    agent.import_thread(document)  # the intact document still imports


@pytest.mark.parametrize("where", ["whole list", "added messages"])
def test_a_message_id_twice_in_a_checkpoints_messages_is_refused_as_a_duplicate_id(exported, where):
    # The refusal once read "every message needs its own id (a non-empty string)" for ids that were
    # non-empty strings, only twice.
    agent, document, thread_id = exported
    agent.delete_thread(thread_id)
    broken = copy.deepcopy(document)
    root, first, second = _chain(broken)
    messages = first["channel_values"]["messages"]["value"] if where == "whole list" else (
        second["channel_values"]["messages"]["value"]["add"])
    messages[1]["data"]["id"] = twice = messages[0]["data"]["id"]
    with pytest.raises(InvalidRequest) as err:
        agent.import_thread(broken)
    assert "duplicate id" in err.value.message and repr(twice) in err.value.message
    assert "non-empty" not in err.value.message


def _without_places(items: list[dict]) -> list[dict]:
    """State items without where they stand in the tree (a copy's checkpoint ids are new)."""
    places = ("checkpoint_id", "branch_checkpoint_id", "siblings", "alternatives")
    return [{k: v for k, v in item.items() if k not in places} for item in items]


def _write_of_update(document: dict) -> list[dict]:
    """The message list of the document's one pending write (a state update's, kept on its parent checkpoint)."""
    writes = [w for c in document["checkpoints"] for w in c.get("pending_writes", ())]
    assert len(writes) == 1 and writes[0]["value"]["type"] == "messages", writes
    return writes[0]["value"]["value"]


def test_removing_a_message_and_sending_its_replacement_replaces_it_in_place_and_the_thread_round_trips(agent):
    # Found by a new user: the update was accepted, and its write held the removal and the replacement (two
    # messages with one id), which the import refused: the thread's export could not be imported anywhere.
    first = outputs(say(agent, "one"))
    thread_id = first["thread_id"]
    say(agent, "two", thread_id=thread_id)
    before = agent.get_checkpoint_state(thread_id)["messages"]
    user = before[0]
    result = agent.update_checkpoint_state(
        thread_id, None, [{"role": "user", "content": "edited", "id": user["id"]}], remove_message_ids=[user["id"]]
    )
    after = agent.get_checkpoint_state(thread_id, result["checkpoint_id"])["messages"]
    # LangGraph's add_messages: a message with a removed message's id replaces it in place.
    assert [(m["id"], m["content"][0]["text"]) for m in after] == [
        (user["id"], "edited"), *[(m["id"], m["content"][0]["text"]) for m in before[1:]]
    ]
    document = agent.export_thread(thread_id)
    assert [m["data"]["id"] for m in _write_of_update(document)] == [user["id"]]  # the replacement alone
    copied = agent.import_thread(json.loads(json.dumps(document)), thread_id=f"{thread_id}-copy")
    assert _without_places(agent.get_checkpoint_state(copied["thread_id"])["messages"]) == _without_places(after)


def test_removing_a_tool_call_while_replacing_the_message_that_made_it_round_trips(agent):
    # Removing one of two tool calls keeps a copy of their message without it (same id); an item replacing
    # that message by id made the write hold both.
    thread_id = outputs(say(agent, "one"))["thread_id"]
    calls = [
        {"role": "assistant", "content": "looking both up", "id": "asker"},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "calculator", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
    ]
    agent.update_checkpoint_state(thread_id, None, calls)
    result = agent.update_checkpoint_state(
        thread_id, None, [{"role": "assistant", "content": "rewritten", "id": "asker"}], remove_message_ids=["c1"]
    )
    items = agent.get_checkpoint_state(thread_id, result["checkpoint_id"])["messages"]
    assert [(i["type"], i.get("call_id") or i["content"][0]["text"]) for i in items[2:]] == [
        ("message", "rewritten"), ("function_call_output", "c2")  # c1's result went with its call
    ]
    document = agent.export_thread(thread_id)
    copied = agent.import_thread(document, thread_id=f"{thread_id}-copy")
    assert len(agent.get_checkpoint_state(copied["thread_id"])["messages"]) == len(items)


def test_a_write_of_an_earlier_release_holding_a_removal_and_its_replacement_imports(agent):
    # Earlier releases wrote "remove X, add X's replacement" as one write holding both; a pending write is
    # applied by add_messages, where that is a replacement, so the exports of those threads import.
    thread_id = outputs(say(agent, "one"))["thread_id"]
    user = agent.get_checkpoint_state(thread_id)["messages"][0]
    agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "edited", "id": user["id"]}])
    document = agent.export_thread(thread_id)
    write = _write_of_update(document)
    removal = {"type": "remove", "data": {"content": "", "additional_kwargs": {}, "response_metadata": {},
                                          "type": "remove", "name": None, "id": user["id"]}}  # fmt: skip
    write.insert(0, removal)
    copied = agent.import_thread(document, thread_id=f"{thread_id}-copy")
    assert _write_of_update(agent.export_thread(copied["thread_id"])) == write
    assert agent.get_checkpoint_state(copied["thread_id"])["messages"][0]["content"][0]["text"] == "edited"


def test_text_holding_a_literal_backslash_u0000_round_trips(backend_url, make_agent):
    # The six characters \u0000 are text, not a NUL: the document check once took them for one.
    agent = make_agent(backend_url)
    text = "a literal \\u0000 and \\\\u0000 here"
    thread_id = outputs(say(agent, text))["thread_id"]
    copy_id = agent.import_thread(agent.export_thread(thread_id), thread_id=f"{thread_id}-copy")["thread_id"]
    assert user_texts(head_messages(agent, copy_id)) == [text]


def test_a_thread_id_in_use_with_other_content_is_thread_exists(exported):
    agent, document, thread_id = exported
    say(agent, "one more", thread_id=thread_id)
    counts = row_counts(agent)
    with pytest.raises(ThreadExists) as caught:
        agent.import_thread(document)
    assert caught.value.ids["thread_id"] == thread_id
    assert row_counts(agent) == counts


def test_another_users_thread_id_is_thread_exists_and_stays_theirs(exported):
    agent, document, thread_id = exported
    agent.delete_thread(thread_id)
    agent.import_thread(document, user_id="alice")
    counts = row_counts(agent)
    with pytest.raises(ThreadExists):
        agent.import_thread(document, user_id="mallory")
    assert row_counts(agent) == counts
    assert agent.export_thread(thread_id, user_id="alice")["checkpoints"] == document["checkpoints"]
    with pytest.raises(ThreadNotFound):
        agent.export_thread(thread_id, user_id="mallory")


def test_checkpoint_ids_another_thread_holds_are_refused(exported):
    agent, document, thread_id = exported
    renamed = copy.deepcopy(document)
    renamed["thread"]["thread_id"] = "same-checkpoints-other-thread"
    counts = row_counts(agent)
    with pytest.raises(ThreadExists, match="checkpoints"):
        agent.import_thread(renamed)
    assert row_counts(agent) == counts


def test_under_another_thread_id_it_is_a_copy_with_new_checkpoint_ids_in_the_same_order(exported):
    agent, document, thread_id = exported
    copied = agent.import_thread(document, thread_id="the-copy")
    original = agent.get_checkpoint_history(thread_id, 1000)
    copy_history = agent.get_checkpoint_history("the-copy", 1000)
    assert not {e["checkpoint_id"] for e in original} & {e["checkpoint_id"] for e in copy_history}
    mapping = {a["checkpoint_id"]: b["checkpoint_id"] for a, b in zip(original, copy_history, strict=True)}
    mapping[None] = None
    assert [mapping[e["parent_checkpoint_id"]] for e in original] == [e["parent_checkpoint_id"] for e in copy_history]
    assert [e["timestamp"] for e in original] == [e["timestamp"] for e in copy_history]
    assert copied["checkpoint_id"] == mapping[agent.get_checkpoint_state(thread_id)["checkpoint_id"]]
    for old, new in mapping.items():
        if old is not None:
            strip = lambda s: [(m["id"], m.get("content"), m.get("type")) for m in s["messages"]]  # noqa: E731
            assert strip(agent.get_checkpoint_state(thread_id, old)) == strip(agent.get_checkpoint_state("the-copy", new))
    counts = row_counts(agent)
    assert agent.import_thread(document, thread_id="the-copy") == copied  # deterministic ids: again a no-op
    assert row_counts(agent) == counts
    turn = outputs(say(agent, "go on", thread_id="the-copy"))
    assert agent.get_checkpoint_history("the-copy", 1)[0]["checkpoint_id"] == turn["checkpoint_id"]


def test_title_metadata_and_forked_from_travel(exported):
    agent, document, thread_id = exported
    fork = agent.fork_thread(thread_id, new_thread_id="a-fork")
    doc = agent.export_thread("a-fork")
    doc["thread"].update(title="Trip", metadata={"topic": "travel"})
    agent.delete_thread("a-fork")
    restored = agent.import_thread(doc)
    assert (restored["title"], restored["metadata"]) == ("Trip", {"topic": "travel"})
    assert restored["forked_from"] == fork["forked_from"]


def test_export_and_import_as_actions(exported):
    agent, document, thread_id = exported
    out = agent.predict({"input": [], "custom_inputs": {"action": "export_thread", "thread_id": thread_id}}).custom_outputs
    assert out["document"]["checkpoints"] == json.loads(json.dumps(document))["checkpoints"]
    request = {"input": [], "custom_inputs": {"action": "import_thread", "document": out["document"], "user_id": "u2",
                                              "thread_id": "imported-by-action"}}
    thread = agent.predict(request).custom_outputs["thread"]
    assert thread["thread_id"] == "imported-by-action" and thread["user_id"] == "u2"
    with pytest.raises(InvalidRequest):
        agent.predict({"input": [], "custom_inputs": {"action": "import_thread", "document": "nope"}})


def test_cli_exports_a_user_as_json_lines_and_imports_both_forms(tmp_path, monkeypatch):
    # In process (typer's runner): each subprocess would pay seconds of imports; tests/cli/test_cli.py runs
    # the command line as a user does, and tests/cli/test_startup.py holds its lazy imports.
    from typer.testing import CliRunner

    from agent import create_agent
    from agent.cli import app

    monkeypatch.chdir(tmp_path)
    source, target = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    with create_agent(source, model="offline", tracing=False) as agent:
        ids = sorted(outputs(say(agent, f"hi {n}", user_id="u"))["thread_id"] for n in range(2))
        say(agent, "not u's", user_id="v")
    run = lambda *args: CliRunner().invoke(app, list(args))  # noqa: E731

    exported = run("export", "--user-id", "u", "--database-url", source, "-o", "all.jsonl")
    assert exported.exit_code == 0, exported.output
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    assert [json.loads(line)["thread"]["thread_id"] for line in lines] == ids  # one thread per line, by id
    one = run("export", ids[0], "--user-id", "u", "--database-url", source)
    assert one.exit_code == 0, one.output
    (tmp_path / "one.json").write_text(one.stdout)
    assert json.loads(one.stdout)["thread"]["thread_id"] == ids[0]

    assert run("import", "all.jsonl", "--user-id", "w", "--database-url", target).exit_code == 0
    again = run("import", "one.json", "--user-id", "w", "--database-url", target)  # a no-op
    assert again.exit_code == 0 and f"Thread {ids[0]} is already there with this content; nothing was written" in again.stdout
    refused = run("import", "one.json", "--user-id", "x", "--database-url", target)
    assert refused.exit_code == 1 and "already exists" in refused.output and "Traceback" not in refused.output
    with create_agent(target, model="offline", tracing=False) as agent:
        assert agent.storage.threads_of_user("w") == ids


def _cli():
    from typer.testing import CliRunner

    from agent.cli import app

    return lambda *args, input=None: CliRunner().invoke(app, list(args), input=input)  # noqa: E731


@pytest.fixture
def jsonl_export(tmp_path, monkeypatch):
    """(the CLI runner, JSON Lines of a user's three threads, one of whose messages holds U+2028)."""
    from agent import create_agent

    monkeypatch.chdir(tmp_path)
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    with create_agent(source, model="offline", tracing=False) as agent:
        for text in ("one\u2028two", "three", "four"):  # str.splitlines() would cut the first line at U+2028
            say(agent, text, user_id="u")
    run = _cli()
    exported = run("export", "--user-id", "u", "--database-url", source)
    assert exported.exit_code == 0, exported.output
    lines = exported.stdout.split("\n")[:-1]  # not splitlines(), which cuts at U+2028 too
    assert len(lines) == 3
    return run, lines


def test_cli_import_checks_every_line_first_and_names_the_bad_one(jsonl_export, tmp_path):
    run, lines = jsonl_export
    broken = json.loads(lines[2])
    broken["checkpoints"][0]["parent_checkpoint_id"] = "not-a-uuid"
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], "", lines[1], json.dumps(broken)]) + "\n", encoding="utf-8")
    (tmp_path / "garbled.jsonl").write_text("\n".join([lines[0], "{garbled"]) + "\n", encoding="utf-8")
    target = f"sqlite:///{tmp_path / 'target.sqlite'}"
    say_ok = run("import", "bad.jsonl", "--database-url", target)
    assert say_ok.exit_code == 1 and "Traceback" not in say_ok.output
    assert "bad.jsonl, line 4: Invalid thread document" in " ".join(say_ok.output.split())  # 1-based, blanks counted
    garbled = run("import", "-", "--database-url", target, input=(tmp_path / "garbled.jsonl").read_text(encoding="utf-8"))
    assert garbled.exit_code == 1 and "standard input, line 2: not a JSON document" in " ".join(garbled.output.split())
    # Every line is checked before any is imported: nothing was imported, and no store was created.
    assert not (tmp_path / "target.sqlite").exists()
    (tmp_path / "good.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = run("import", "good.jsonl", "--user-id", "w", "--database-url", target)
    assert done.exit_code == 0 and done.output.count("Imported thread") == 3, done.output
    from agent import create_agent

    with create_agent(target, model="offline", tracing=False) as agent:
        texts = sorted(user_texts(head_messages(agent, t)) for t in agent.storage.threads_of_user("w"))
    assert texts == [["four"], ["one\u2028two"], ["three"]]


def test_cli_import_into_a_new_sqlite_file_that_fails_leaves_no_file(tmp_path, monkeypatch, jsonl_export):
    run, lines = jsonl_export
    (tmp_path / "one.jsonl").write_text(lines[0] + "\n", encoding="utf-8")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "timetravel-agent.thread", "version": 2}, indent=2))
    store = tmp_path / "new" / "dir" / "store.sqlite"
    url = f"sqlite:///{store}"

    refused = run("import", "bad.json", "--database-url", url)  # a bad document: refused before any store is opened
    assert refused.exit_code == 1 and "Not a timetravel-agent.thread" in refused.output, refused.output
    assert not (tmp_path / "new").exists()

    # A failure after the check (the write fails): the store it created is removed, with its directories.
    from agent.errors import StorageUnavailable
    from agent.operations import transfer

    def fail(*args, **kwargs):
        raise StorageUnavailable("The database failed; nothing was written.")

    monkeypatch.setattr(transfer, "import_thread", fail)
    failed = run("import", "one.jsonl", "--database-url", url)
    assert failed.exit_code == 1 and "one.jsonl, line 1: The database failed" in failed.output, failed.output
    assert not (tmp_path / "new").exists()
    # An existing store is never removed, even an empty one that nothing was imported into.
    store.parent.mkdir(parents=True)
    sqlite3.connect(store).close()
    assert run("import", "one.jsonl", "--database-url", url).exit_code == 1
    assert store.exists()
