"""Property: any tree of turns, branches and state edits on one thread reads back exactly like a plain model of it.

Hypothesis draws a sequence of operations on one thread:

* `turn`: a turn from the head (`predict` with `thread_id`);
* `branch`: a turn from an earlier checkpoint (`predict` with `checkpoint_id`);
* `update`: `update_checkpoint_state` with a new user message, at a checkpoint or at the head;
* `replace`: a message of a checkpoint replaced by id (`add_messages` semantics), through
  `Threads.update_state` with a LangChain message carrying the existing id: an edit in the
  middle of the list, which the Responses input cannot express;
* `remove`: a message of a checkpoint removed with `RemoveMessage` (never the last one left);
* `clear_cache`: the agent forgets every resolved message list, so the next operation
  rebuilds its start from the stored deltas.

A plain-Python model keeps, for each checkpoint id, its parent and its messages as
(role, text). After the run, every checkpoint's state, its history entry and the thread
head must match the model, and still match after the message cache is cleared (the cold
path that rebuilds messages from stored deltas). Runs on Postgres and on a SQLite file.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage

from agent.models import CALCULATE_PREFIX
from tests.helpers.offline import as_messages, offline_reply
from tests.helpers.scenario import outputs, say, text_of

MAX_EXAMPLES = 25
MIN_OPERATIONS, MAX_OPERATIONS = 5, 12

# Short texts from any alphabet (accents, CJK, emoji, control characters, NUL), except lone
# surrogates, which the request layer refuses on purpose. A message starting with
# "calculate " would make the offline model call a tool instead of answering.
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda s: not s.lower().startswith(CALCULATE_PREFIX)
)
# Picks are reduced modulo the number of checkpoints (or messages) when the operation runs.
picks = st.integers(min_value=0, max_value=10_000)

operation = st.one_of(
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("branch"), picks, texts),
    st.tuples(st.just("update"), st.none() | picks, texts),
    st.tuples(st.just("replace"), picks, picks, texts),
    st.tuples(st.just("remove"), picks, picks),
    st.tuples(st.just("clear_cache")),
)
# The thread needs a checkpoint before anything can branch from it.
operations = st.builds(
    lambda first, rest: [first, *rest],
    st.tuples(st.just("turn"), texts),
    st.lists(operation, min_size=MIN_OPERATIONS - 1, max_size=MAX_OPERATIONS - 1),
)


@dataclass
class TreeModel:
    """The thread as a plain tree: checkpoint id -> parent id and messages [(role, text)], in write order."""

    messages: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    parents: dict[str, str | None] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    @property
    def head(self) -> str | None:
        return self.order[-1] if self.order else None

    def add(self, checkpoint_id: str, parent_id: str | None, messages: list[tuple[str, str]]) -> None:
        assert checkpoint_id not in self.messages, "a write must create a new checkpoint"
        self.messages[checkpoint_id] = messages
        self.parents[checkpoint_id] = parent_id
        self.order.append(checkpoint_id)

    def pick(self, n: int) -> str:
        return self.order[n % len(self.order)]


def _config(thread_id: str, checkpoint_id: str) -> dict:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


def _role(message) -> str:
    return {"human": "user", "ai": "assistant"}.get(message.type, message.type)


def _stored(agent, thread_id: str, checkpoint_id: str) -> list:
    return agent.graph.get_state(_config(thread_id, checkpoint_id)).values.get("messages", [])


def _as_pairs(messages) -> list[tuple[str, str]]:
    return [(_role(m), m.text) for m in messages]


def _expected_reply(context: list[tuple[str, str]]) -> str:
    # The offline model quotes every user message it was given, in order, and says what it received.
    return offline_reply(as_messages(context))


def _run_turn(agent, model: TreeModel, thread_id: str, text: str, start: str | None, *, branch: bool) -> None:
    base = model.messages[start] if start else []
    response = say(agent, text, thread_id=thread_id, checkpoint_id=start if branch else None)
    ids = outputs(response)
    assert ids["thread_id"] == thread_id
    if start is None:  # a new thread: its first turn starts from the thread's empty root checkpoint
        start = ids["parent_checkpoint_id"]
        model.add(start, None, [])
    assert ids["parent_checkpoint_id"] == start
    context = [*base, ("user", text)]
    reply = text_of(response)
    assert reply == _expected_reply(context), "the model must see exactly the messages of its starting checkpoint"
    model.add(ids["checkpoint_id"], start, [*context, ("assistant", reply)])


def _run_edit(agent, model: TreeModel, thread_id: str, start: str, new_message, messages: list) -> None:
    ids = agent.threads.update_state(thread_id, start, [new_message], user_id=None)
    assert ids.parent_checkpoint_id == start
    model.add(ids.checkpoint_id, start, messages)


def apply(agent, model: TreeModel, thread_id: str, op: tuple) -> None:
    """Run one operation on the agent and mirror it in the model."""
    kind = op[0]
    if kind == "turn":
        _run_turn(agent, model, thread_id, op[1], model.head, branch=False)
    elif kind == "branch":
        _run_turn(agent, model, thread_id, op[2], model.pick(op[1]), branch=True)
    elif kind == "update":
        start = model.head if op[1] is None else model.pick(op[1])
        result = agent.update_checkpoint_state(
            thread_id, None if op[1] is None else start, [{"role": "user", "content": op[2]}]
        )
        assert result["parent_checkpoint_id"] == start and result["thread_id"] == thread_id
        model.add(result["checkpoint_id"], start, [*model.messages[start], ("user", op[2])])
    elif kind in ("replace", "remove"):
        start = model.pick(op[1])
        current = model.messages[start]
        if len(current) < 2:
            # Keep at least one message: the update runs as the agent node, and
            # tools_condition refuses a state without messages (only reachable
            # through RemoveMessage, which the Responses input cannot express).
            return
        position = op[2] % len(current)
        target = _stored(agent, thread_id, start)[position]
        edited = list(current)
        if kind == "replace":
            cls = HumanMessage if isinstance(target, HumanMessage) else AIMessage
            new_message = cls(content=op[3], id=target.id)
            edited[position] = (current[position][0], op[3])
        else:
            new_message = RemoveMessage(id=target.id)
            del edited[position]
        _run_edit(agent, model, thread_id, start, new_message, edited)
    elif kind == "clear_cache":
        agent.storage.saver.message_cache.clear()
    else:  # pragma: no cover - the strategy draws only the kinds above
        raise AssertionError(kind)


def check_against_model(agent, model: TreeModel, thread_id: str) -> None:
    """Every checkpoint's messages, every history entry and the head match the model."""
    for checkpoint_id in model.order:
        assert _as_pairs(_stored(agent, thread_id, checkpoint_id)) == model.messages[checkpoint_id], checkpoint_id
    history = agent.get_checkpoint_history(thread_id, limit=1000)
    assert [entry["checkpoint_id"] for entry in history] == sorted(model.order, reverse=True)
    for entry in history:
        expected = model.messages[entry["checkpoint_id"]]
        assert entry["parent_checkpoint_id"] == model.parents[entry["checkpoint_id"]]
        assert entry["message_count"] == len(expected)
        # Summaries drop NUL (Postgres jsonb refuses it).
        assert entry["last_message"] == (expected[-1][1][:100].replace("\x00", "") if expected else "")
        assert entry["next_nodes"] == []
    assert history[0]["checkpoint_id"] == model.head
    assert agent.storage.get_thread(thread_id).head_checkpoint_id == model.head


def run_property(agent) -> None:
    @settings(max_examples=MAX_EXAMPLES, deadline=None)
    @given(ops=operations)
    def property_holds(ops):
        thread_id = f"prop-{uuid.uuid4().hex}"
        model = TreeModel()
        for op in ops:
            apply(agent, model, thread_id, op)
        check_against_model(agent, model, thread_id)
        agent.storage.saver.message_cache.clear()
        check_against_model(agent, model, thread_id)

    property_holds()


def test_random_trees_of_turns_branches_and_edits_read_back_like_the_model(backend_url, make_agent):
    # One agent per backend, a fresh thread per example: hypothesis cannot re-run function-scoped fixtures.
    run_property(make_agent(backend_url))


def test_random_trees_read_back_with_the_message_cache_off(backend_url, make_agent):
    # message_cache_size=0: every read and every turn rebuilds messages from the stored deltas.
    run_property(make_agent(backend_url, message_cache_size=0))


def test_replacing_a_message_in_the_middle_keeps_both_branches(agent):
    first = say(agent, "one")
    thread_id = outputs(first)["thread_id"]
    second = say(agent, "two", thread_id=thread_id)
    head = outputs(second)["checkpoint_id"]
    original = _stored(agent, thread_id, head)
    ids = agent.threads.update_state(
        thread_id, head, [HumanMessage(content="ONE", id=original[0].id)], user_id=None
    )
    agent.storage.saver.message_cache.clear()
    edited = _as_pairs(_stored(agent, thread_id, ids.checkpoint_id))
    assert edited == [("user", "ONE"), *_as_pairs(original)[1:]]
    assert _as_pairs(_stored(agent, thread_id, head)) == _as_pairs(original)
    assert [m.id for m in _stored(agent, thread_id, ids.checkpoint_id)] == [m.id for m in original]
