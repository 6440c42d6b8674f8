"""The thread document's format (`agent.operations.transfer`): version 2 holds what each checkpoint adds.

* The message-list rule (`transfer.changes`) against LangGraph's own `add_messages`: any change a
  turn, an edit or a removal makes is expressed, and applying it gives the list back exactly.
* A copy round trip on each backend: a tree with branches, an edit, an answer edited in place, a
  removal and a context summary, exported and imported under a new thread id, reads back the same
  (every checkpoint's state, the history and the branches, ids mapped).
* Size: every message is in the document once per change, and the issue's thread (61 turns of 2 kB
  messages, 6.3 MB in version 1) fits the `import_thread` action's request limit.
* A join edge's barrier channel holds a Python set: a thread of such a graph exports it as a `set`
  value, and imports it (under its own id and as a copy) as a set LangGraph adds to on the next step:
  the copy reads the same and takes a turn, a join waiting on a question resumes. Malformed sets are
  refused; other values that are not JSON still fail the export, naming the channel.
* Version 1 still imports: `fixtures/thread-v1.json` was written by the exporter before version 2
  (commit e25bb0b; a summary, a tool call, two branches, an answer edited in place, a removal), and
  reads back as it says, and its version 2 export is the same content (importing it is a no-op).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, messages_from_dict, messages_to_dict
from langgraph.graph.message import add_messages

from typing import Any

from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt

from agent import InvalidRequest
from agent.errors import AgentError
from agent.operations.transfer import parse_document
from agent.operations.transfer.changes import apply_changes, changes_between
from tests.helpers.scenario import outputs, request, say
from tests.operations.test_transfer import row_counts

FIXTURE = Path(__file__).parent / "fixtures" / "thread-v1.json"


# -- the rule ---------------------------------------------------------------------------------------
def _message(n: int, text: str = "") -> HumanMessage | AIMessage:
    kind = HumanMessage if n % 2 else AIMessage
    return kind(content=text or f"message {n}", id=f"m{n}")


edits = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3)),
        st.tuples(st.just("replace"), st.integers(0, 1000), st.text(max_size=5)),
        st.tuples(st.just("remove"), st.integers(0, 1000)),
    ),
    max_size=6,
)


@given(size=st.integers(0, 8), changes=edits)
@settings(max_examples=200, deadline=None)
def test_every_add_messages_change_is_expressed_and_applies_back_exactly(size, changes):
    before = [_message(n) for n in range(size)]
    update, fresh = [], 100
    for change in changes:
        if change[0] == "append":
            for _ in range(change[1]):
                update.append(_message(fresh := fresh + 1))
        elif before and change[0] == "replace":
            old = before[change[1] % len(before)]
            update.append(old.model_copy(update={"content": f"edited {change[2]}"}))
        elif before and change[0] == "remove":
            victim = before[change[1] % len(before)].id
            if all(getattr(m, "id", None) != victim for m in update):
                update.append(RemoveMessage(id=victim))
    after = add_messages(before, update)
    found = changes_between(before, after)
    assert found is not None
    remove, add = found
    assert apply_changes(before, remove, add) == after
    # Only what changed is listed: no kept message is in `add`.
    assert all(m not in before for m in add)


def test_a_list_the_rule_cannot_express_is_none_and_bad_changes_are_refused():
    a, b, c = (_message(n) for n in range(3))
    assert changes_between([a, b, c], [b, a, c]) is None  # kept messages in another order
    assert changes_between([a], [a, a]) is None  # an id twice
    assert changes_between([a], [a, HumanMessage("no id")]) is None
    for remove, add, reason in [
        (["m9"], [], "does not hold"),
        (["m0", "m0"], [], "twice"),
        (["m0"], [a], "both removed and added"),
        ([], [c, c], "twice"),
    ]:
        with pytest.raises(ValueError, match=reason):
            apply_changes([a, b], remove, add)


# -- a copy reads the same ----------------------------------------------------------------------------
def build_thread(agent) -> str:
    """A tree with every kind of change: turns, a tool call, a branch, an edit, an answer edited in
    place, a removal, and a context summary (the agent's budget is small)."""
    first = outputs(say(agent, "I'm planning a trip " + "word " * 30, user_id="ada"))
    thread_id = first["thread_id"]
    for n in range(4):
        say(agent, f"message number {n} " + "word " * 30, thread_id=thread_id, user_id="ada")
    say(agent, "calculate 6*7", thread_id=thread_id, user_id="ada")
    say(agent, "I'm headed to New York!", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada")
    state = agent.get_checkpoint_state(thread_id, user_id="ada")
    user = [m for m in state["messages"] if m["role"] == "user"][-1]
    say(agent, "I'm headed to Lisbon!", thread_id=thread_id, edit_message_id=user["id"], user_id="ada")
    answer = [m for m in agent.get_checkpoint_state(thread_id, user_id="ada")["messages"] if m["role"] == "assistant"][-1]
    agent.update_checkpoint_state(thread_id, None, [{"role": "assistant", "content": "Lisbon it is.", "id": answer["id"]}],
                                  user_id="ada")  # fmt: skip
    say(agent, "and then?", thread_id=thread_id, user_id="ada")
    first_message = agent.get_checkpoint_state(thread_id, user_id="ada")["messages"][0]["id"]
    agent.update_checkpoint_state(thread_id, None, None, remove_message_ids=[first_message], user_id="ada")
    return thread_id


def everything(agent, thread_id: str) -> dict:
    """What a client reads about a thread: history, every checkpoint's state, branches, usage."""
    history = agent.get_checkpoint_history(thread_id, 1000, user_id="ada")
    return {
        "history": history,
        "states": [agent.get_checkpoint_state(thread_id, e["checkpoint_id"], user_id="ada") for e in history],
        "branches": agent.list_branches(thread_id, user_id="ada"),
        "usage": agent.get_usage(thread_id, user_id="ada"),
    }


def test_a_copy_through_a_version_2_document_reads_the_same_on_each_backend(backend_url, make_agent):
    # A budget where a summary is made and the next turn fits beside it (so it is carried unchanged); the
    # tools' schemas count against it.
    agent = make_agent(backend_url, max_context_tokens=800, context_strategy="summarize")
    thread_id = build_thread(agent)
    document = json.loads(json.dumps(agent.export_thread(thread_id, user_id="ada")))
    kinds = {v["type"] for c in document["checkpoints"] for v in c["channel_values"].values()}
    assert {"messages", "message_changes", "unchanged", "json"} <= kinds  # the summary is carried unchanged
    assert any("remove" in c["channel_values"].get("messages", {}).get("value", {}) for c in document["checkpoints"]
               if c["channel_values"].get("messages", {}).get("type") == "message_changes")  # fmt: skip

    copy_id = agent.import_thread(document, user_id="ada", thread_id=f"copy-{uuid.uuid4()}")["thread_id"]
    assert_reads_the_same_but_ids(agent, thread_id, copy_id)


def assert_reads_the_same_but_ids(agent, thread_id: str, copy_id: str) -> None:
    """`everything` about the copy is the original's, its thread and checkpoint ids mapped."""
    original, copied = everything(agent, thread_id), everything(agent, copy_id)
    mapping = {a["checkpoint_id"]: b["checkpoint_id"] for a, b in zip(original["history"], copied["history"], strict=True)}
    text = json.dumps(original, sort_keys=True).replace(thread_id, copy_id)
    for old, new in mapping.items():
        text = text.replace(old, new)
    assert json.loads(text) == copied


# -- sets: a join edge's barrier -----------------------------------------------------------------------
def join_graph(*, ask: bool = False, defer: bool = False) -> StateGraph:
    """START -> `pa` and `pb`, then `gate` once both are done, then END; each node answers its name. The
    join edge (`add_edge(["pa", "pb"], "gate")`) is LangGraph's barrier channel `join:pa+pb:gate`, whose
    value is the set of the nodes done. With `ask`, a third branch joins: `pc_first`, then `pc`, which asks
    a question (`interrupt`) and answers with the reply, so the turn stops with the barrier
    `join:pa+pb+pc:gate` holding {"pa", "pb"}. With `defer`, `gate` is a deferred node."""

    def node(name: str):
        def run(state: MessagesState) -> dict:
            return {"messages": [AIMessage(content=str(interrupt(f"{name}?")) if name == "pc" else name)]}

        return run

    joined = ["pa", "pb", "pc"] if ask else ["pa", "pb"]
    builder = StateGraph(MessagesState)
    for name in [*joined, "pc_first"] if ask else joined:
        builder.add_node(name, node(name))
    builder.add_node("gate", node("gate"), defer=defer)
    builder.add_edge(START, "pa")
    builder.add_edge(START, "pb")
    if ask:
        builder.add_edge(START, "pc_first")
        builder.add_edge("pc_first", "pc")
    builder.add_edge(joined, "gate")
    builder.add_edge("gate", END)
    return builder


def stored_value(agent, thread_id: str, channel: str) -> Any:
    """The channel's value in the thread's head as the saver gives it to LangGraph."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    return agent.graph.checkpointer.get_tuple(config).checkpoint["channel_values"][channel]


def assert_next_nodes_are_langgraphs(agent, thread_id: str) -> None:
    """Every checkpoint's `next_nodes` in the history is what LangGraph's `get_state(...).next` says."""
    for entry in agent.get_checkpoint_history(thread_id, 1000, user_id="ada"):
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": entry["checkpoint_id"]}}
        assert entry["next_nodes"] == list(agent.graph.get_state(config).next)


def texts(agent, thread_id: str) -> list[str]:
    return [m["content"][0]["text"] for m in agent.get_checkpoint_state(thread_id, user_id="ada")["messages"]]


def _head(document: dict) -> dict:
    return next(c for c in document["checkpoints"] if c["checkpoint_id"] == document["thread"]["checkpoint_id"])


def _head_barrier(document: dict) -> dict:
    """The head's barrier of a `join_graph(ask=True)` thread's document."""
    return _head(document)["channel_values"]["join:pa+pb+pc:gate"]


def test_a_thread_with_a_join_edge_exports_imports_under_either_id_and_takes_a_turn(backend_url, make_agent):
    # The barrier's set made the export fail ("Object of type set is not JSON serializable").
    agent = make_agent(backend_url, graph=join_graph())
    thread_id = outputs(say(agent, "hello", user_id="ada"))["thread_id"]
    say(agent, "again", thread_id=thread_id, user_id="ada")
    document = json.loads(json.dumps(agent.export_thread(thread_id, user_id="ada")))
    barrier = [c["channel_values"].get("join:pa+pb:gate") for c in document["checkpoints"]]
    barrier = [value for value in barrier if value is not None]
    assert barrier[0] == {"type": "set", "value": []}  # gate consumed it: empty, and a set
    assert stored_value(agent, thread_id, "join:pa+pb:gate") == set()

    copy_id = agent.import_thread(document, user_id="ada", thread_id=f"copy-{uuid.uuid4()}")["thread_id"]
    assert_reads_the_same_but_ids(agent, thread_id, copy_id)
    assert type(stored_value(agent, copy_id, "join:pa+pb:gate")) is set

    before = everything(agent, thread_id)
    agent.delete_thread(thread_id, user_id="ada")
    agent.import_thread(document, user_id="ada")
    assert everything(agent, thread_id) == before
    counts = row_counts(agent)
    agent.import_thread(document, user_id="ada")  # again: the same set, sorted the same, so nothing to write
    agent.import_thread(document, user_id="ada", thread_id=copy_id)
    assert row_counts(agent) == counts

    for thread in (thread_id, copy_id):
        say(agent, "once more", thread_id=thread, user_id="ada")
        assert texts(agent, thread)[-4:] == ["once more", "pa", "pb", "gate"]
        assert agent.get_checkpoint_state(thread, user_id="ada")["next_nodes"] == []
        assert_next_nodes_are_langgraphs(agent, thread)
        assert type(stored_value(agent, thread, "join:pa+pb:gate")) is set


def test_a_join_waiting_on_a_question_resumes_after_import_and_after_a_fork(backend_url, make_agent):
    agent = make_agent(backend_url, graph=join_graph(ask=True))
    thread_id = outputs(say(agent, "hello", user_id="ada"))["thread_id"]
    document = json.loads(json.dumps(agent.export_thread(thread_id, user_id="ada")))
    assert _head_barrier(document) == {"type": "set", "value": ["pa", "pb"]}

    copy_id = agent.import_thread(document, user_id="ada", thread_id=f"copy-{uuid.uuid4()}")["thread_id"]
    fork_id = agent.fork_thread(thread_id, new_thread_id=f"fork-{uuid.uuid4()}", user_id="ada")["thread_id"]
    for thread in (thread_id, copy_id, fork_id):
        assert stored_value(agent, thread, "join:pa+pb+pc:gate") == {"pa", "pb"}
        state = agent.get_checkpoint_state(thread, user_id="ada")
        assert state["next_nodes"] == ["pc"]
        [question] = state["interrupts"]
        # LangGraph adds "pc" to the set it stored: a list in its place has no `add`.
        agent.predict(request(None, thread_id=thread, user_id="ada", resume={question["id"]: f"answer in {thread}"}))
        assert texts(agent, thread)[-2:] == [f"answer in {thread}", "gate"]
        assert agent.get_checkpoint_state(thread, user_id="ada")["next_nodes"] == []
        assert_next_nodes_are_langgraphs(agent, thread)


def test_a_fork_of_a_thread_with_a_join_edge_takes_a_turn(backend_url, make_agent):
    agent = make_agent(backend_url, graph=join_graph())
    thread_id = outputs(say(agent, "hello", user_id="ada"))["thread_id"]
    fork_id = agent.fork_thread(thread_id, new_thread_id=f"fork-{uuid.uuid4()}", user_id="ada")["thread_id"]
    say(agent, "again", thread_id=fork_id, user_id="ada")
    assert texts(agent, fork_id) == ["hello", "pa", "pb", "gate", "again", "pa", "pb", "gate"]
    assert_next_nodes_are_langgraphs(agent, fork_id)
    assert agent.export_thread(fork_id, user_id="ada")["thread"]["thread_id"] == fork_id


@pytest.fixture
def waiting_join_document(make_agent, tmp_path) -> dict:
    """The document of a thread whose head's barrier holds {"pa", "pb"} (`join_graph(ask=True)`)."""
    agent = make_agent(f"sqlite:///{tmp_path / 'join.sqlite'}", graph=join_graph(ask=True))
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    return json.loads(json.dumps(agent.export_thread(thread_id)))


def test_a_set_value_is_read_back_as_a_set_in_any_order(waiting_join_document):
    _head_barrier(waiting_join_document)["value"] = ["pb", "pa"]
    restored = parse_document(waiting_join_document)
    assert restored.values[waiting_join_document["thread"]["checkpoint_id"]]["join:pa+pb+pc:gate"] == {"pa", "pb"}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("pa", "must be a list of strings"),
        ({"pa": True}, "must be a list of strings"),
        (["pa", ["pb"]], "must be a list of strings"),
        (["pa", {"k": 1}], "must be a list of strings"),
        (["pa", "pa"], "an item twice"),
        ([1, True], "an item twice"),  # one item to Python: 1 == True
        ([1, 1.0], "an item twice"),
    ],
)
def test_a_malformed_set_is_refused_naming_the_channel(waiting_join_document, value, reason):
    _head_barrier(waiting_join_document)["value"] = value
    with pytest.raises(InvalidRequest, match=rf"join:pa\+pb\+pc:gate.*{reason}.*nothing was written"):
        parse_document(waiting_join_document)


def test_a_set_in_a_pending_write_is_refused_as_malformed_like_any_value(waiting_join_document):
    head = _head(waiting_join_document)
    write = {"task_id": "t", "channel": "join:pa+pb+pc:gate", "value": {"type": "set", "value": [[]]}}
    head.setdefault("pending_writes", []).append(write)
    with pytest.raises(InvalidRequest, match="a pending write.*must be a list of strings"):
        parse_document(waiting_join_document)


class TaggedState(MessagesState):
    tags: Any


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (frozenset({"a"}), "frozenset is not JSON serializable"),
        ({b"a", "b"}, "a set is exported when its items are strings, numbers, booleans or null, and it holds bytes"),
        ([{"a"}], "set is not JSON serializable"),  # a set inside JSON: only a whole value may be a set
    ],
)
def test_a_value_that_is_not_json_still_fails_the_export_naming_the_channel(make_agent, tmp_path, value, reason):
    builder = StateGraph(TaggedState)
    builder.add_node("tag", lambda state: {"messages": [AIMessage(content="tagged")], "tags": value})
    builder.add_edge(START, "tag")
    builder.add_edge("tag", END)
    agent = make_agent(f"sqlite:///{tmp_path / 'tags.sqlite'}", graph=builder)
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    with pytest.raises(AgentError, match=rf"Cannot export channel 'tags' of checkpoint '[0-9a-f-]+'.*{reason}"):
        agent.export_thread(thread_id)


def test_a_join_into_a_deferred_node_still_fails_the_export_naming_the_channel(make_agent, tmp_path):
    # LangGraph keeps a `(set, finished)` pair for it (`NamedBarrierValueAfterFinish`), which the format
    # has no type for: refused as before, not exported as a list LangGraph could not unpack into a set.
    agent = make_agent(f"sqlite:///{tmp_path / 'deferred.sqlite'}", graph=join_graph(defer=True))
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    with pytest.raises(AgentError, match=r"Cannot export channel 'join:pa\+pb:gate'.*set is not JSON serializable"):
        agent.export_thread(thread_id)


# -- size ----------------------------------------------------------------------------------------------
def own_bytes(restored) -> int:
    """The JSON of each distinct message of the thread once (distinct: the same id and the same content)."""
    distinct = {json.dumps(d, sort_keys=True) for ms in restored.messages.values() for d in messages_to_dict(ms)}
    return sum(len(text) for text in distinct)


def test_each_message_is_in_the_document_once_per_change(backend_url, make_agent):
    agent = make_agent(backend_url)
    thread_id = build_thread(agent)
    for n in range(8):
        say(agent, f"more {n}", thread_id=thread_id, user_id="ada")
    document = agent.export_thread(thread_id, user_id="ada")
    written = [
        json.dumps(d, sort_keys=True)
        for c in document["checkpoints"]
        for v in c["channel_values"].values()
        for d in (v["value"] if v["type"] == "messages" else v["value"]["add"] if v["type"] == "message_changes" else [])
    ]
    distinct = {json.dumps(d, sort_keys=True) for ms in parse_document(document).messages.values() for d in messages_to_dict(ms)}
    assert sorted(written) == sorted(distinct)  # each distinct message once, none twice


def test_the_issues_thread_fits_the_import_action(make_agent, tmp_path):
    # 61 turns of 2 kB messages exported to 6.3 MB in version 1, which the action refused (max_request_bytes).
    agent = make_agent(f"sqlite:///{tmp_path / 'long.sqlite'}")
    thread_id = str(uuid.uuid4())
    for n in range(61):
        say(agent, f"turn {n} " + "x" * 2000, thread_id=thread_id)
    document = agent.export_thread(thread_id)
    size = len(json.dumps(document))
    assert size <= 1.5 * own_bytes(parse_document(document))
    assert size < agent.settings.max_request_bytes
    request = {"input": [], "custom_inputs": {"action": "import_thread", "document": document, "thread_id": "by-action"}}
    thread = agent.predict(request).custom_outputs["thread"]
    assert thread["message_count"] == 122
    # A document over the limit is refused with the way to import it.
    small = make_agent(f"sqlite:///{tmp_path / 'small.sqlite'}", max_request_bytes=size // 2)
    with pytest.raises(InvalidRequest, match="tt-agent import"):
        small.predict({**request, "custom_inputs": {**request["custom_inputs"], "thread_id": "too-big"}})


# -- version 1 ----------------------------------------------------------------------------------------
def test_a_version_1_document_still_imports_and_reads_as_it_says(backend_url, make_agent):
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert document["version"] == 1
    agent = make_agent(backend_url)
    thread = agent.import_thread(document, user_id="ada")
    thread_id = thread["thread_id"]
    assert (thread["checkpoint_id"], thread["title"], thread["metadata"]) == (
        document["thread"]["checkpoint_id"], "A trip", {"app": "fixture"})  # fmt: skip

    history = {e["checkpoint_id"]: e for e in agent.get_checkpoint_history(thread_id, 1000, user_id="ada")}
    assert len(history) == len(document["checkpoints"]) == 13
    for checkpoint in document["checkpoints"]:
        entry = history[checkpoint["checkpoint_id"]]
        assert entry["parent_checkpoint_id"] == checkpoint["parent_checkpoint_id"]
        for key in ("message_count", "last_message", "last_user_message", "branch_usage", "usage"):
            assert entry.get(key) == checkpoint["metadata"].get(key), key
        expected = messages_from_dict(checkpoint["channel_values"].get("messages", {}).get("value", []))
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint["checkpoint_id"]}}
        assert agent.graph.get_state(config).values.get("messages", []) == expected

    # Its version 2 export is the same content: the same resolved values, and importing it writes nothing.
    again = agent.export_thread(thread_id, user_id="ada")
    assert again["version"] == 2
    old, new = parse_document(document), parse_document(again)
    assert {k: messages_to_dict(v) for k, v in old.messages.items()} == {k: messages_to_dict(v) for k, v in new.messages.items()}
    assert {k: v.get("context_summary") for k, v in old.values.items()} == {
        k: v.get("context_summary") for k, v in new.values.items()}  # fmt: skip
    counts = row_counts(agent)
    assert agent.import_thread(again, user_id="ada") == thread
    assert row_counts(agent) == counts
    assert len(json.dumps(again)) < len(json.dumps(document)) / 2
