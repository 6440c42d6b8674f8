"""Property: any tree of turns, branches, edits, regenerations, replacements, removals, switches and forks on one
thread reads back exactly like a plain model of it.

Hypothesis draws a sequence of operations on one thread, each through the public API:

* `turn`: a turn from the head (`predict` with `thread_id`);
* `branch`: a turn from an earlier checkpoint (`predict` with `checkpoint_id`);
* `update`: `update_checkpoint_state` with a new user message, at a checkpoint or at the head;
* `replace`: `update_checkpoint_state` with an item whose `id` names a message of the checkpoint
  (any position: the middle of the list too), with that message in `remove_message_ids` too or not
  (either way a replacement in place, as LangGraph's `add_messages` applies it);
* `remove`: `update_checkpoint_state` with `remove_message_ids` (never the last message left);
* `edit`: a turn with `edit_message_id` naming any message of a checkpoint, the first one included
  (refused, with nothing written, for a message that is not a user message);
* `regenerate`: a turn with `regenerate: true` at a checkpoint (refused, writing nothing, where the
  checkpoint has no user message);
* `switch`: `set_head` to any checkpoint; the next `turn` must see exactly that branch;
* `fork`: `fork_thread` at any checkpoint, then one turn on the fork;
* `clear_cache`: the agent forgets every resolved message list, so the next operation
  rebuilds its start from the stored deltas.

The model keeps, for each checkpoint, its parent and its messages as (key, role, text), where the key
is the model's own identity of a message (a turn's new messages get new keys; a message carried
over, replaced or sent again by a regeneration keeps its key). From that alone it derives what the
agent must answer: where each message first appeared (the oldest checkpoint from which the messages
up to it never changed on the way to the checkpoint), the checkpoint to branch from, the siblings
(that checkpoint's children in creation order) with the newest leaf below each, the leaves and their
fork points, and where an edit or a regeneration starts. Real message ids must map one-to-one to keys.

After every operation each checkpoint's items (without their places) must be byte-identical to what
they were when it was written; after the run, every checkpoint's messages, places, history entry, the
branches and the head must match the model, also after the message cache is cleared (the cold path
that rebuilds messages from stored deltas), and (in the test of the built-in graph) each thread's
export must import (as a copy) with every checkpoint's items the same. Runs on Postgres and on a
SQLite file.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass, field

import pytest
from agent.operations.branches import get_checkpoint_state
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from agent import InvalidRequest
from agent.graph import call_model
from agent.memory.tools import memory_tools
from agent.models import CALCULATE_PREFIX, FORGET_PREFIX, RECALL_PREFIX, REMEMBER_PREFIX, USE_TOOL_PREFIX, OfflineChatModel
from agent.tools import TOOLS
from tests.helpers.offline import as_messages, offline_reply
from tests.helpers.scenario import outputs, request, say, text_of
from tests.storage.test_storage import stored_message_bytes

#: Examples per test and backend. Each is a thread of 5 to 14 operations checked against the model after every
#: one: on Postgres, 25 examples of the three tests took about a minute of the suite's time. 15 keep every
#: operation kind drawn many times per run (hypothesis also replays the failures it saved), at 60% of that.
MAX_EXAMPLES = 15
MIN_OPERATIONS, MAX_OPERATIONS = 5, 14
PLACE_KEYS = ("checkpoint_id", "branch_checkpoint_id", "siblings", "alternatives")

# Short texts from any alphabet (accents, CJK, emoji, control characters, NUL), except lone
# surrogates, which the request layer refuses on purpose. A message starting with "calculate ",
# "remember that ", "what do you remember" or "forget " would make the offline model call a tool
# instead of answering (hypothesis draws the string constants of the code it tests, these included).
# Both with and without the surrounding space: the model reads "calculate " from the unstripped text
# ("CALCULATE " is a tool call) and the memory prefixes from the stripped one.
TOOL_PREFIXES = (CALCULATE_PREFIX, REMEMBER_PREFIX, RECALL_PREFIX, FORGET_PREFIX, USE_TOOL_PREFIX)
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda s: not (s.lower().startswith(TOOL_PREFIXES) or s.strip().lower().startswith(TOOL_PREFIXES))
)
# Picks are reduced modulo the number of checkpoints (or messages) when the operation runs.
picks = st.integers(min_value=0, max_value=10_000)

operation = st.one_of(
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("branch"), picks, texts),
    st.tuples(st.just("update"), st.none() | picks, texts),
    st.tuples(st.just("replace"), picks, picks, texts, st.booleans()),
    st.tuples(st.just("remove"), picks, picks),
    st.tuples(st.just("edit"), picks, picks, texts),
    st.tuples(st.just("regenerate"), picks),
    st.tuples(st.just("switch"), picks),
    st.tuples(st.just("fork"), picks, texts),
    st.tuples(st.just("clear_cache")),
)
# The thread needs a checkpoint before anything can branch from it.
operations = st.builds(
    lambda first, rest: [first, *rest],
    st.tuples(st.just("turn"), texts),
    st.lists(operation, min_size=MIN_OPERATIONS - 1, max_size=MAX_OPERATIONS - 1),
)

Message = tuple[int, str, str]  # (key, role, text)


@dataclass
class TreeModel:
    """One thread as a plain tree: checkpoint id -> parent and messages, in write order, and its head."""

    thread_id: str
    messages: dict[str, list[Message]] = field(default_factory=dict)
    parents: dict[str, str | None] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    head: str | None = None
    #: Each checkpoint's items (without their places) as JSON, taken when it was written.
    snapshots: dict[str, str] = field(default_factory=dict)

    def add(self, checkpoint_id: str, parent_id: str | None, messages: list[Message]) -> None:
        assert checkpoint_id not in self.messages, "a write must create a new checkpoint"
        self.messages[checkpoint_id] = messages
        self.parents[checkpoint_id] = parent_id
        self.order.append(checkpoint_id)
        self.head = checkpoint_id

    def pick(self, n: int) -> str:
        return self.order[n % len(self.order)]

    def chain(self, checkpoint_id: str) -> list[str]:
        chain = [checkpoint_id]
        while self.parents[chain[-1]] is not None:
            chain.append(self.parents[chain[-1]])
        return chain[::-1]

    def children(self, checkpoint_id: str | None) -> list[str]:
        return [c for c in self.order if self.parents[c] == checkpoint_id]

    def first_seen(self, checkpoint_id: str, position: int) -> int:
        """The chain index of the oldest checkpoint from which the message at `position` stayed where it is:
        each step back, the parent holds the same messages up to it, or (a replacement in place: same length)
        the same messages from it to the end."""
        chain = self.chain(checkpoint_id)
        index = len(chain) - 1
        while index > 0:
            mine, theirs = self.messages[chain[index]], self.messages[chain[index - 1]]
            same_before = mine[: position + 1] == theirs[: position + 1]
            same_after = len(mine) == len(theirs) and mine[position:] == theirs[position:]
            if not (same_before or same_after):
                break
            index -= 1
        return index

    def leaves(self) -> list[str]:
        return sorted((c for c in self.order if not self.children(c)), key=self.order.index, reverse=True)

    def newest_leaf(self, checkpoint_id: str) -> str:
        """The most recently written checkpoint without children among `checkpoint_id` and its descendants."""
        below = [c for c in self.order if checkpoint_id in self.chain(c)]
        return max((c for c in below if not self.children(c)), key=self.order.index)

    def alternatives(self, checkpoint_id: str, position: int, first: str) -> dict:
        """A message's versions: a user message's distinct user messages at its place among the siblings
        (several siblings holding one are one version), an answer's siblings answering the same user message
        as the answer's place (`first`) holds it."""
        mine = self.messages[first]
        siblings = self.children(self.parents[first])
        if mine[position][1] == "user":
            versions: list[tuple[Message, list[str]]] = []
            for sibling in siblings:
                theirs = self.messages[sibling]
                if len(theirs) > position and theirs[position][1] == "user":
                    same = next((members for known, members in versions if known == theirs[position]), None)
                    versions.append((theirs[position], [sibling])) if same is None else same.append(sibling)
            options = [
                {"checkpoint_id": members[0], "latest_checkpoint_id": max((self.newest_leaf(m) for m in members),
                 key=self.order.index), "preview": message[2][:100]}
                for message, members in versions
            ]  # fmt: skip
            index = next(i for i, (_, members) in enumerate(versions) if first in members)
            return {"kind": "edits", "index": index, "count": len(options), "options": options}
        asked = next((i for i in range(position - 1, -1, -1) if mine[i][1] == "user"), None)
        start = 0 if asked is None else asked + 1
        options = []
        for sibling in siblings:
            theirs = self.messages[sibling]
            if len(theirs) <= start or theirs[start][1] == "user" or (asked is not None and theirs[asked] != mine[asked]):
                continue
            end = start
            while end + 1 < len(theirs) and theirs[end + 1][1] != "user":
                end += 1
            options.append({"checkpoint_id": sibling, "latest_checkpoint_id": self.newest_leaf(sibling),
                            "preview": theirs[end][2][:100]})  # fmt: skip
        index = [option["checkpoint_id"] for option in options].index(first)
        return {"kind": "regenerations", "index": index, "count": len(options), "options": options}

    def fork_point(self, checkpoint_id: str) -> str | None:
        current = checkpoint_id
        while (parent := self.parents[current]) is not None:
            if len(self.children(parent)) > 1:
                return parent
            current = parent
        return None


@dataclass
class Run:
    """The thread being tested, its forks, and the mapping of model message keys to real message ids."""

    agent: object
    model: TreeModel
    forks: list[TreeModel] = field(default_factory=list)
    ids: dict[int, str] = field(default_factory=dict)
    keys: itertools.count = field(default_factory=lambda: itertools.count(1))
    builtin_graph: bool = True

    def new_key(self) -> int:
        return next(self.keys)


def _role(item: dict) -> str:
    return item.get("role", item["type"])


def _text(item: dict) -> str:
    return item["content"][0]["text"]


def _expected_reply(context: list[tuple[str, str]]) -> str:
    # The offline model quotes every user message it was given, in order, and says what it received.
    return offline_reply(as_messages(context))


def _pairs(messages: list[Message]) -> list[tuple[str, str]]:
    return [(role, text) for _, role, text in messages]


def _snapshot(state: dict) -> str:
    return json.dumps([{k: v for k, v in item.items() if k not in PLACE_KEYS} for item in state["messages"]], sort_keys=True)


def _learn(run: Run, model: TreeModel, checkpoint_id: str) -> None:
    """Read the new checkpoint back: its messages match the model, its ids match the keys; keep its snapshot."""
    state = run.agent.get_checkpoint_state(model.thread_id, checkpoint_id)
    expected = model.messages[checkpoint_id]
    assert [(_role(i), _text(i)) for i in state["messages"]] == _pairs(expected), checkpoint_id
    for item, (key, _, _) in zip(state["messages"], expected, strict=True):
        known = run.ids.setdefault(key, item["id"])
        assert known == item["id"], "a message kept from another checkpoint must keep its id"
    assert len(set(run.ids.values())) == len(run.ids), "different messages must have different ids"
    model.snapshots[checkpoint_id] = _snapshot(state)


def _turn(run: Run, model: TreeModel, text: str, start: str | None, *, checkpoint_id: str | None = None, **custom) -> None:
    """A turn whose model input is `start`'s messages then `text`; checks the parent and the reply."""
    base = model.messages[start] if start else []
    response = say(run.agent, text, thread_id=model.thread_id, checkpoint_id=checkpoint_id, **custom)
    ids = outputs(response)
    assert ids["thread_id"] == model.thread_id
    if start is None:  # a new thread: its first turn starts from the thread's empty root checkpoint
        start = ids["parent_checkpoint_id"]
        model.add(start, None, [])
        _learn(run, model, start)
    assert ids["parent_checkpoint_id"] == start
    user = (run.new_key(), "user", text)
    reply = text_of(response)
    assert reply == _expected_reply(_pairs([*base, user])), "the model must see exactly the messages of its start"
    model.add(ids["checkpoint_id"], start, [*base, user, (run.new_key(), "assistant", reply)])
    _learn(run, model, ids["checkpoint_id"])


def _update(run: Run, model: TreeModel, at: str, messages: list[Message], **arguments) -> None:
    result = run.agent.update_checkpoint_state(model.thread_id, at, **arguments)
    assert result["parent_checkpoint_id"] == at and result["thread_id"] == model.thread_id
    model.add(result["checkpoint_id"], at, messages)
    _learn(run, model, result["checkpoint_id"])


def _edit_start(model: TreeModel, at: str, position: int) -> str:
    """Where an edit of message `position` of `at` starts: the checkpoint before it first appeared."""
    return model.chain(at)[model.first_seen(at, position) - 1]


def _regenerate_start(model: TreeModel, at: str, last_user: int) -> str:
    """Where a regeneration at `at` starts: the newest checkpoint of its branch holding exactly the messages
    up to the last user message, else the checkpoint before that message first appeared."""
    chain = model.chain(at)
    first = model.first_seen(at, last_user)
    for checkpoint_id in reversed(chain[first:]):
        if model.messages[checkpoint_id] == model.messages[at][: last_user + 1]:
            return checkpoint_id
    return chain[first - 1]


def apply(run: Run, op: tuple) -> None:
    """Run one operation on the agent and mirror it in the model."""
    agent, model = run.agent, run.model
    kind = op[0]
    if kind == "turn":
        _turn(run, model, op[1], model.head)
    elif kind == "branch":
        start = model.pick(op[1])
        _turn(run, model, op[2], start, checkpoint_id=start)
    elif kind == "update":
        start = model.head if op[1] is None else model.pick(op[1])
        user = (run.new_key(), "user", op[2])
        at = None if op[1] is None else start
        result = agent.update_checkpoint_state(model.thread_id, at, [{"role": "user", "content": op[2]}])
        assert result["parent_checkpoint_id"] == start
        model.add(result["checkpoint_id"], start, [*model.messages[start], user])
        _learn(run, model, result["checkpoint_id"])
    elif kind == "replace":
        start = model.pick(op[1])
        current = model.messages[start]
        if not current:
            return
        position = op[2] % len(current)
        key, role, old = current[position]
        text = op[3] if op[3] != old else op[3] + "!"  # a replacement always changes the message
        item = {"role": role, "content": text, "id": run.ids[key]}
        edited = [*current[:position], (key, role, text), *current[position + 1 :]]
        removed = [run.ids[key]] if op[4] else None
        _update(run, model, start, edited, new_messages=[item], remove_message_ids=removed)
    elif kind == "remove":
        start = model.pick(op[1])
        current = model.messages[start]
        if len(current) < 2:
            return  # removing the last message is refused (tested in test_branch_errors)
        position = op[2] % len(current)
        edited = [*current[:position], *current[position + 1 :]]
        _update(run, model, start, edited, remove_message_ids=[run.ids[current[position][0]]])
    elif kind == "edit":
        at = model.pick(op[1])
        current = model.messages[at]
        if not current:
            return
        position = op[2] % len(current)
        if current[position][1] != "user":  # a turn edits user messages only; answers change in place
            head = model.head
            with pytest.raises(InvalidRequest, match="not a user message"):
                say(agent, op[3], thread_id=model.thread_id, checkpoint_id=at, edit_message_id=run.ids[current[position][0]])
            assert agent.storage.get_thread(model.thread_id).head_checkpoint_id == head
            return
        start = _edit_start(model, at, position)
        response = say(agent, op[3], thread_id=model.thread_id, checkpoint_id=at, edit_message_id=run.ids[current[position][0]])
        ids = outputs(response)
        assert ids["parent_checkpoint_id"] == start
        context = [*current[:position], (run.new_key(), "user", op[3])]
        assert text_of(response) == _expected_reply(_pairs(context))
        model.add(ids["checkpoint_id"], start, [*context, (run.new_key(), "assistant", text_of(response))])
        _learn(run, model, ids["checkpoint_id"])
    elif kind == "regenerate":
        at = model.pick(op[1])
        current = model.messages[at]
        users = [i for i, (_, role, _) in enumerate(current) if role == "user"]
        body = request(None, thread_id=model.thread_id, checkpoint_id=at, regenerate=True)
        if not users:
            head = model.head
            with pytest.raises(InvalidRequest):
                agent.predict(body)
            assert agent.storage.get_thread(model.thread_id).head_checkpoint_id == head
            return
        start = _regenerate_start(model, at, users[-1])
        response = agent.predict(body)
        ids = outputs(response)
        assert ids["parent_checkpoint_id"] == start
        context = current[: users[-1] + 1]
        assert text_of(response) == _expected_reply(_pairs(context))
        model.add(ids["checkpoint_id"], start, [*context, (run.new_key(), "assistant", text_of(response))])
        _learn(run, model, ids["checkpoint_id"])
    elif kind == "switch":
        target = model.pick(op[1])
        moved = agent.set_head(model.thread_id, target)
        assert moved["previous_checkpoint_id"] == model.head and moved["checkpoint_id"] == target
        model.head = target
    elif kind == "fork":
        source = model.pick(op[1])
        result = agent.fork_thread(model.thread_id, source)
        assert result["forked_from"] == {"thread_id": model.thread_id, "checkpoint_id": source}
        fork = TreeModel(result["thread_id"])
        copies = [e["checkpoint_id"] for e in reversed(agent.get_checkpoint_history(fork.thread_id, limit=1000))]
        chain = model.chain(source)
        assert len(copies) == len(chain) and copies[-1] == result["checkpoint_id"]
        for parent, (copy, original) in zip([None, *copies], zip(copies, chain, strict=True)):
            fork.add(copy, parent, list(model.messages[original]))
            _learn(run, fork, copy)
        _turn(run, fork, op[2], fork.head)
        run.forks.append(fork)
    elif kind == "clear_cache":
        agent.storage.saver.message_cache.clear()
    else:  # pragma: no cover - the strategy draws only the kinds above
        raise AssertionError(kind)


def check_unchanged(run: Run) -> None:
    """Every checkpoint written so far still reads back byte for byte as when it was written."""
    for model in (run.model, *run.forks):
        for checkpoint_id, snapshot in model.snapshots.items():
            assert _snapshot(run.agent.get_checkpoint_state(model.thread_id, checkpoint_id)) == snapshot, checkpoint_id


def check_against_model(run: Run, model: TreeModel) -> None:
    """Every checkpoint's messages and places, every history entry, the branches and the head match the model."""
    agent = run.agent
    for checkpoint_id in model.order:
        state = agent.get_checkpoint_state(model.thread_id, checkpoint_id)
        assert _snapshot(state) == model.snapshots[checkpoint_id], checkpoint_id
        chain = model.chain(checkpoint_id)
        for position, item in enumerate(state["messages"]):
            first = chain[model.first_seen(checkpoint_id, position)]
            siblings = model.children(model.parents[first])
            assert item["checkpoint_id"] == first, (checkpoint_id, position)
            assert item["branch_checkpoint_id"] == model.parents[first]
            assert item["siblings"] == {
                "index": siblings.index(first),
                "count": len(siblings),
                "checkpoint_ids": siblings,
                "latest_checkpoint_ids": [model.newest_leaf(sibling) for sibling in siblings],
            }
            assert item["alternatives"] == model.alternatives(checkpoint_id, position, first), (checkpoint_id, position)
    history = agent.get_checkpoint_history(model.thread_id, limit=1000)
    assert [entry["checkpoint_id"] for entry in history] == sorted(model.order, reverse=True)
    for entry in history:
        expected = model.messages[entry["checkpoint_id"]]
        assert entry["parent_checkpoint_id"] == model.parents[entry["checkpoint_id"]]
        assert entry["message_count"] == len(expected)
        # Summaries drop NUL (Postgres jsonb refuses it).
        assert entry["last_message"] == (expected[-1][2][:100].replace("\x00", "") if expected else "")
        if run.builtin_graph:
            # A user's graph: a state update at the root is written as START, so it waits for the graph's
            # first node (LangGraph's inference, `TurnRunner._update`); the built-in graph writes as its agent node.
            assert entry["next_nodes"] == []
        assert entry["is_head"] == (entry["checkpoint_id"] == model.head)
    branches = agent.list_branches(model.thread_id)
    assert [b["checkpoint_id"] for b in branches] == model.leaves()
    assert [b["fork_checkpoint_id"] for b in branches] == [model.fork_point(leaf) for leaf in model.leaves()]
    assert agent.storage.get_thread(model.thread_id).head_checkpoint_id == model.head


def run_property(agent, *, builtin_graph: bool = True, round_trip: bool = False) -> None:
    @settings(max_examples=MAX_EXAMPLES, deadline=None)
    @given(ops=operations)
    def property_holds(ops):
        run = Run(agent, TreeModel(f"prop-{uuid.uuid4().hex}"), builtin_graph=builtin_graph)
        for op in ops:
            apply(run, op)
            check_unchanged(run)
        for model in (run.model, *run.forks):
            check_against_model(run, model)
            check_storage_bound(run, model)
        agent.storage.saver.message_cache.clear()
        for model in (run.model, *run.forks):
            check_against_model(run, model)
            if round_trip:  # one of the property tests: the export of every tree it draws must import
                check_round_trip(run, model)

    property_holds()


def check_round_trip(run: Run, model: TreeModel) -> None:
    """The thread's export imports (a copy under another thread id: new checkpoint ids, in the same order),
    and every checkpoint of the copy holds the same items (without their places) as its original."""
    agent = run.agent
    copy_id = f"{model.thread_id}-copy"
    agent.import_thread(json.loads(json.dumps(agent.export_thread(model.thread_id))), thread_id=copy_id)
    copies = [e["checkpoint_id"] for e in reversed(agent.get_checkpoint_history(copy_id, limit=1000))]
    assert len(copies) == len(model.order)
    for original, copied in zip(sorted(model.order), copies, strict=True):
        assert _snapshot(agent.get_checkpoint_state(copy_id, copied)) == model.snapshots[original], original


def check_storage_bound(run: Run, model: TreeModel) -> None:
    """The thread's stored `messages` bytes stay within a constant of what its checkpoints add (linear in the
    tree, whatever the graph): each checkpoint stores only the messages after what it shares with its parent,
    where LangGraph's own encoding would store every checkpoint's whole list."""
    added = 0
    for checkpoint_id in model.order:
        parent = model.parents[checkpoint_id]
        mine, theirs = model.messages[checkpoint_id], model.messages.get(parent, []) if parent else []
        shared = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        added += sum(len(text.encode()) + 200 for _key, _role, text in mine[shared:])  # text plus message envelope
    stored = stored_message_bytes(run.agent, model.thread_id)
    assert stored <= 2 * added + 600 * len(model.order), (stored, added, len(model.order))


def foreign_graph() -> StateGraph:
    """Not the agent's graph: LangGraph's `MessagesState` (plain `add_messages`, no context summary) and a node
    of its own name that calls the same offline model, with the same tools bound, through `call_model`."""
    model = OfflineChatModel().bind_tools([*TOOLS, *memory_tools(None)])

    def chatbot(state: MessagesState, config: RunnableConfig) -> dict:
        return call_model(model, state, config)

    builder = StateGraph(MessagesState)
    builder.add_node("chatbot", chatbot)
    builder.add_edge(START, "chatbot")
    builder.add_edge("chatbot", END)
    return builder


def test_random_trees_on_a_graph_of_your_own_read_back_like_the_model(backend_url, make_agent):
    run_property(make_agent(backend_url, graph=foreign_graph()), builtin_graph=False)


def test_random_trees_of_turns_branches_and_edits_read_back_like_the_model(backend_url, make_agent):
    # One agent per backend, a fresh thread per example: hypothesis cannot re-run function-scoped fixtures.
    run_property(make_agent(backend_url), round_trip=True)


def test_random_trees_read_back_with_the_message_cache_off(backend_url, make_agent):
    # message_cache_size=0: every read and every turn rebuilds messages from the stored deltas.
    run_property(make_agent(backend_url, message_cache_size=0))


def _stored(agent, thread_id: str, checkpoint_id: str) -> list:
    return get_checkpoint_state(agent.storage, thread_id, checkpoint_id, user_id=None).messages


def test_replacing_a_message_in_the_middle_keeps_both_branches(agent):
    first = say(agent, "one")
    thread_id = outputs(first)["thread_id"]
    second = say(agent, "two", thread_id=thread_id)
    head = outputs(second)["checkpoint_id"]
    original = _stored(agent, thread_id, head)
    ids = agent.operation_context.turns.update_state(thread_id, head, [HumanMessage(content="ONE", id=original[0].id)], user_id=None)
    agent.storage.saver.message_cache.clear()
    edited = [(m.type, m.text) for m in _stored(agent, thread_id, ids.checkpoint_id)]
    assert edited == [("human", "ONE"), *[(m.type, m.text) for m in original][1:]]
    assert [(m.type, m.text) for m in _stored(agent, thread_id, head)] == [(m.type, m.text) for m in original]
    assert [m.id for m in _stored(agent, thread_id, ids.checkpoint_id)] == [m.id for m in original]
