"""The chain check that `bench.load` judges concurrent turns with (`bench.traffic.check_chain`) finds forks,
lost, duplicated and wrongly stored turns, on hand-made histories."""

from __future__ import annotations

import pytest

from bench.traffic import check_chain


def entry(checkpoint_id: str, parent: str | None, message_count: int) -> dict:
    return {"checkpoint_id": checkpoint_id, "parent_checkpoint_id": parent, "message_count": message_count}


def linear(n: int, *, root: bool = False) -> list[dict]:
    """A thread of `n` turns (checkpoints c1..cn), newest first, optionally under a root r0."""
    entries = [entry("r0", None, 0)] if root else []
    for i in range(1, n + 1):
        entries.append(entry(f"c{i}", entries[-1]["checkpoint_id"] if entries else None, 2 * i))
    return list(reversed(entries))


LANDED = {"u1": "c1", "u2": "c2", "u3": "c3"}


@pytest.mark.parametrize("root", [False, True])
def test_a_linear_chain_holding_each_landed_turn_once_passes(root):
    assert check_chain(linear(3, root=root), LANDED, ["refused"], ["u2", "u1", "u3"]) == []


def test_two_children_of_one_checkpoint_are_a_fork():
    history = linear(2)
    history.insert(0, entry("c3", "c1", 6))  # c3 forks from c1 instead of continuing c2
    problems = check_chain(history, LANDED, [], ["u1", "u2", "u3"])
    assert any("a fork" in p for p in problems)


def test_a_duplicated_user_message_is_found():
    problems = check_chain(linear(3), LANDED, [], ["u1", "u2", "u2", "u3"])
    assert any("duplicated user messages: ['u2']" in p for p in problems)


def test_an_acknowledged_turn_missing_from_the_thread_is_lost():
    problems = check_chain(linear(2), LANDED, [], ["u1", "u2"])
    assert any("2 turn checkpoints for 3 turns" in p for p in problems)
    assert any("lost user messages: ['u3']" in p for p in problems)


def test_a_refused_turn_that_was_stored_is_found():
    problems = check_chain(linear(3), LANDED, ["u4"], ["u1", "u2", "u3", "u4"])
    assert any("refused but stored" in p for p in problems)
