"""Branch records (label, pin, archive, delete) and merges on random trees, against a plain-Python model.

Hypothesis draws operations on one thread, each through the public API: turns from the head or from any
checkpoint, `label_branch`, `pin_branch`, `archive_branch`, `unarchive_branch`, `delete_branch`,
`merge_branch` (both modes, from any checkpoint into the head) and `set_head`. The model keeps the tree
(parents), the archive marks, the labels, the pin and the head, and from those alone derives what the
agent must answer: where a branch starts (`delete_branch` and `archive_branch` refuse the root and the
head's path, writing nothing), which checkpoints an archive hides, each listed branch with its label
and pin, and every sibling count of the head's messages. After every operation: every remaining
checkpoint's messages are byte-identical to what they were when written, deleted ones are gone, the
branches, labels, pin and sibling counts match the model, and the stored messages stay within the
storage bound of `test_properties`. Runs on Postgres and on a SQLite file.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import CheckpointNotFound, InvalidRequest
from tests.helpers.scenario import outputs, say
from tests.storage.test_storage import stored_message_bytes

MAX_EXAMPLES = 6
PLACE_KEYS = ("checkpoint_id", "branch_checkpoint_id", "siblings", "alternatives")

words = st.sampled_from(["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"])
picks = st.integers(min_value=0, max_value=10_000)
operation = st.one_of(
    st.tuples(st.just("turn"), words),
    st.tuples(st.just("branch"), picks, words),
    st.tuples(st.just("label"), picks, st.none() | words),
    st.tuples(st.just("pin"), picks),
    st.tuples(st.just("archive"), picks),
    st.tuples(st.just("unarchive"), picks),
    st.tuples(st.just("delete"), picks),
    st.tuples(st.just("merge"), picks, st.sampled_from(["summary", "messages"])),
    st.tuples(st.just("switch"), picks),
)
operations = st.lists(operation, min_size=4, max_size=10)


@dataclass
class Model:
    parents: dict[str, str | None] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    archived: set[str] = field(default_factory=set)
    pinned: str | None = None
    head: str | None = None
    snapshots: dict[str, str] = field(default_factory=dict)

    def children(self, checkpoint_id: str | None) -> list[str]:
        return sorted(c for c, p in self.parents.items() if p == checkpoint_id)

    def chain(self, checkpoint_id: str) -> list[str]:
        out = [checkpoint_id]
        while self.parents[out[-1]] is not None:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def subtree(self, checkpoint_id: str) -> set[str]:
        out, stack = set(), [checkpoint_id]
        while stack:
            current = stack.pop()
            out.add(current)
            stack.extend(self.children(current))
        return out

    def start_of(self, checkpoint_id: str) -> str:
        current = checkpoint_id
        while (parent := self.parents[current]) is not None:
            if self.parents[parent] is None or len(self.children(parent)) > 1:
                return current
            current = parent
        return current

    def refuses(self, start: str) -> bool:
        return self.parents[start] is None or start in self.chain(self.head)

    def hidden(self) -> set[str]:
        return set().union(*(self.subtree(mark) for mark in self.archived if mark in self.parents))

    def visible(self, keep: set[str] = frozenset()) -> Model:
        gone = self.hidden() - keep
        return Model({c: p for c, p in self.parents.items() if c not in gone}, self.labels, set(), self.pinned, self.head)

    def leaves(self) -> list[str]:
        return sorted((c for c in self.parents if not self.children(c)), reverse=True)

    def fork_point(self, leaf: str) -> str | None:
        current = leaf
        while (parent := self.parents[current]) is not None:
            if len(self.children(parent)) > 1:
                return parent
            current = parent
        return None

    def label_of(self, leaf: str) -> str | None:
        stop, current = self.fork_point(leaf), leaf
        while current is not None and current != stop:
            if current in self.labels:
                return self.labels[current]
            current = self.parents[current]
        return None

    def newest_leaf(self, checkpoint_id: str) -> str:
        return max(c for c in self.subtree(checkpoint_id) if not self.children(c))


@dataclass
class Run:
    agent: object
    thread_id: str
    model: Model
    user_id: str


def _snapshot(state: dict) -> str:
    items = [{k: v for k, v in item.items() if k not in PLACE_KEYS} for item in state["messages"]]
    return json.dumps(items, sort_keys=True)


def _learn(run: Run, checkpoint_id: str, parent: str) -> None:
    run.model.parents[checkpoint_id] = parent
    run.model.head = checkpoint_id
    state = run.agent.get_checkpoint_state(run.thread_id, checkpoint_id, user_id=run.user_id)
    run.model.snapshots[checkpoint_id] = _snapshot(state)


def _pick(run: Run, index: int) -> str:
    ids = sorted(run.model.parents)
    return ids[index % len(ids)]


def _turn(run: Run, text: str, checkpoint_id: str | None = None) -> None:
    ids = outputs(say(run.agent, text, thread_id=run.thread_id, checkpoint_id=checkpoint_id, user_id=run.user_id))
    _learn(run, ids["checkpoint_id"], ids["parent_checkpoint_id"])


def apply(run: Run, op: tuple) -> None:
    agent, thread_id, model, user = run.agent, run.thread_id, run.model, run.user_id
    kind = op[0]
    if kind == "turn":
        _turn(run, op[1])
    elif kind == "branch":
        _turn(run, op[2], _pick(run, op[1]))
    elif kind == "label":
        at = _pick(run, op[1])
        agent.label_branch(thread_id, at, op[2], user_id=user)
        model.labels.pop(at, None)
        if op[2] is not None:
            model.labels[at] = op[2]
    elif kind == "pin":
        at = _pick(run, op[1])
        agent.pin_branch(thread_id, at, user_id=user)
        model.pinned = at
    elif kind in ("archive", "delete"):
        at = _pick(run, op[1])
        start = model.start_of(at)
        method = agent.archive_branch if kind == "archive" else agent.delete_branch
        if model.refuses(start):
            with pytest.raises(InvalidRequest):
                method(thread_id, at, user_id=user)
            return
        result = method(thread_id, at, user_id=user)
        assert result["checkpoint_id"] == start
        if kind == "archive":
            model.archived.add(start)
            return
        gone = model.subtree(start)
        assert set(result["deleted_checkpoint_ids"]) == gone
        for checkpoint_id in gone:
            del model.parents[checkpoint_id]
            model.labels.pop(checkpoint_id, None)
            model.archived.discard(checkpoint_id)
            if model.pinned == checkpoint_id:
                model.pinned = None
            with pytest.raises(CheckpointNotFound):
                agent.get_checkpoint_state(thread_id, checkpoint_id, user_id=user)
    elif kind == "unarchive":
        at = _pick(run, op[1])
        agent.unarchive_branch(thread_id, at, user_id=user)
        model.archived -= set(model.chain(at))
    elif kind == "merge":
        source, mode = _pick(run, op[1]), op[2]
        source_state = agent.get_checkpoint_state(thread_id, source, user_id=user)
        message_ids = [source_state["messages"][-1]["id"]] if mode == "messages" and source_state["messages"] else None
        if source in model.chain(model.head) or (mode == "messages" and message_ids is None):
            with pytest.raises(InvalidRequest):
                agent.merge_branch(thread_id, source, model.head, mode=mode, message_ids=message_ids, user_id=user)
            return
        head = model.head
        result = agent.merge_branch(thread_id, source, head, mode=mode, message_ids=message_ids, user_id=user)
        assert result["parent_checkpoint_id"] == head
        _learn(run, result["checkpoint_id"], head)
        merged = agent.get_checkpoint_state(thread_id, result["checkpoint_id"], user_id=user)
        assert merged["merged_from"]["checkpoint_id"] == source and merged["merged_from"]["mode"] == mode
        assert merged["message_count"] == agent.get_checkpoint_state(thread_id, head, user_id=user)["message_count"] + 1
    elif kind == "switch":
        at = _pick(run, op[1])
        agent.set_head(thread_id, at, user_id=user)
        model.head = at


def check(run: Run) -> None:
    agent, thread_id, model, user = run.agent, run.thread_id, run.model, run.user_id
    for checkpoint_id, snapshot in model.snapshots.items():
        if checkpoint_id in model.parents:
            assert _snapshot(agent.get_checkpoint_state(thread_id, checkpoint_id, user_id=user)) == snapshot
    visible = model.visible(keep=set(model.chain(model.head)))  # the head's branch is listed even when archived
    pinned = visible.newest_leaf(model.pinned) if model.pinned in visible.parents else None
    expected = sorted(visible.leaves(), key=lambda leaf: leaf != pinned)
    listed = agent.list_branches(thread_id, user_id=user)
    assert [b["checkpoint_id"] for b in listed] == expected
    assert [b["label"] for b in listed] == [visible.label_of(leaf) for leaf in expected]
    assert [b["pinned"] for b in listed] == [leaf == pinned for leaf in expected]
    everything = agent.list_branches(thread_id, include_archived=True, user_id=user)
    assert sorted(b["checkpoint_id"] for b in everything) == sorted(model.leaves())
    # Sibling counts of the head's messages: the visible children of where each message branched, its own kept.
    seen = model.visible(keep=set(model.chain(model.head)))
    state = agent.get_checkpoint_state(thread_id, user_id=user)
    for item in state["messages"]:
        if "siblings" in item:
            assert item["siblings"]["count"] == len(seen.children(item["branch_checkpoint_id"]))
    stored = stored_message_bytes(agent, thread_id)
    assert stored <= 2 * sum(len(s) for s in model.snapshots.values()) + 600 * len(model.parents)


def test_random_trees_with_labels_archives_deletions_and_merges_match_the_model(backend_url, make_agent):
    agent = make_agent(backend_url)

    @settings(max_examples=MAX_EXAMPLES, deadline=None)
    @given(ops=operations)
    def property_holds(ops):
        user = f"user-{uuid.uuid4().hex[:8]}"
        first = outputs(say(agent, "start", user_id=user))
        thread_id = first["thread_id"]
        run = Run(agent, thread_id, Model(), user)
        run.model.parents[first["parent_checkpoint_id"]] = None
        run.model.snapshots[first["parent_checkpoint_id"]] = _snapshot(
            agent.get_checkpoint_state(thread_id, first["parent_checkpoint_id"], user_id=user)
        )
        _learn(run, first["checkpoint_id"], first["parent_checkpoint_id"])
        for op in ops:
            apply(run, op)
            check(run)
        # What export writes, import restores: labels, the pin and archives included.
        document = agent.export_thread(thread_id, user_id=user)
        copy = agent.import_thread(document, thread_id=f"copy-{uuid.uuid4().hex}", user_id=user)
        copied = agent.list_branches(copy["thread_id"], include_archived=True, user_id=user)
        original = agent.list_branches(thread_id, include_archived=True, user_id=user)
        assert [(b["label"], b["pinned"], b["archived"]) for b in copied] == [(b["label"], b["pinned"], b["archived"]) for b in original]

    property_holds()


def test_deleting_the_heads_branch_or_the_root_writes_nothing(agent):
    first = outputs(say(agent, "planning a trip"))
    thread_id = first["thread_id"]
    say(agent, "headed to SF", thread_id=thread_id)
    before = agent.export_thread(thread_id)
    for checkpoint_id in (first["parent_checkpoint_id"], first["checkpoint_id"], agent.get_head(thread_id)["checkpoint_id"]):
        with pytest.raises(InvalidRequest, match="root|head"):
            agent.delete_branch(thread_id, checkpoint_id)
    after = agent.export_thread(thread_id)
    assert after["checkpoints"] == before["checkpoints"]


def test_an_archived_alternative_counts_again_when_asked_for(agent):
    first = outputs(say(agent, "planning a trip"))
    thread_id = first["thread_id"]
    sf = outputs(say(agent, "headed to SF", thread_id=thread_id))
    outputs(say(agent, "headed to NY", thread_id=thread_id, checkpoint_id=first["checkpoint_id"]))
    counts = lambda **kw: [m["siblings"]["count"] for m in agent.get_checkpoint_state(thread_id, **kw)["messages"][-2:]]  # noqa: E731
    assert counts() == [2, 2]
    agent.archive_branch(thread_id, sf["checkpoint_id"])
    assert counts() == [1, 1]
    assert counts(include_archived=True) == [2, 2]
    assert agent.get_checkpoint_state(thread_id, sf["checkpoint_id"])["branch"]["archived"] is True
    agent.unarchive_branch(thread_id, sf["checkpoint_id"])
    assert counts() == [2, 2]


def test_the_heads_branch_is_listed_when_the_head_moved_onto_an_archived_branch(agent):
    first = outputs(say(agent, "planning a trip"))
    thread_id = first["thread_id"]
    sf = outputs(say(agent, "headed to SF", thread_id=thread_id))
    ny = outputs(say(agent, "headed to NY", thread_id=thread_id, checkpoint_id=first["checkpoint_id"]))
    agent.archive_branch(thread_id, sf["checkpoint_id"])
    assert [b["checkpoint_id"] for b in agent.list_branches(thread_id)] == [ny["checkpoint_id"]]
    agent.set_head(thread_id, sf["checkpoint_id"])
    on_sf = outputs(say(agent, "booking the hotel", thread_id=thread_id))
    listed = agent.list_branches(thread_id)
    heads = [b for b in listed if b["is_head"]]
    assert [(b["checkpoint_id"], b["archived"]) for b in heads] == [(on_sf["checkpoint_id"], True)]
    assert [b["checkpoint_id"] for b in listed if not b["is_head"]] == [ny["checkpoint_id"]]
    agent.set_head(thread_id, ny["checkpoint_id"])  # away from it, the archived branch is hidden again
    assert [b["checkpoint_id"] for b in agent.list_branches(thread_id)] == [ny["checkpoint_id"]]
