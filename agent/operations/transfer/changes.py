"""What a checkpoint changes in its parent's message list: the rule of version 2 documents, both ways.

A version 2 document gives each checkpoint's messages as `MessageChanges`
(`remove`, `add`) against its parent's, so that a thread of N turns is O(N)
bytes instead of the O(N²) of every checkpoint's whole list. The rule is
LangGraph's `add_messages` with `RemoveMessage`s (which is how a turn, an edit
in place and `update_checkpoint_state` change a branch): the parent's messages
in order, without the removed ones, each replaced by the added message with
the same id; then the other added messages. `changes_between` finds the
changes for two lists and says when the rule cannot express them (a message
without an id, an id twice, kept messages in another order: a graph of one's
own may keep any list); the exporter then writes the whole list.

Why by id and not "the first k messages, then these", as `agent.storage.deltas`
stores them: an answer edited in place, or a message removed, near the start
of a long branch would make a prefix delta repeat every later message; by id
it is the one message. The storage keeps prefixes because it resolves them
without reading ids; a document is read whole anyway.

Messages are compared as the storage compares them (the same object, or
equal), so a message kept from the parent is the parent's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def same_messages(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether two message lists hold the same messages in the same order."""
    return len(before) == len(after) and all(a is b or a == b for a, b in zip(before, after, strict=True))


def changes_between(before: Sequence[Any], after: Sequence[Any]) -> tuple[list[str], list[Any]] | None:
    """`(remove, add)` that turn the message list `before` into `after` by the rule above (`add` holds
    the replaced messages in order, then the appended ones), or None when the rule cannot express it."""
    ids_before = [m.id for m in before]
    ids_after = [m.id for m in after]
    for ids in (ids_before, ids_after):
        if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
            return None
    present = set(ids_after)
    kept = [m for m in before if m.id in present]
    if ids_after[: len(kept)] != [m.id for m in kept]:  # a kept message moved: not an add_messages change
        return None
    remove = [m.id for m in before if m.id not in present]
    replaced = [new for new, old in zip(after, kept, strict=False) if not (new is old or new == old)]
    return remove, replaced + list(after[len(kept) :])


def apply_changes(before: Sequence[Any], remove: Sequence[str], add: Sequence[Any]) -> list[Any]:
    """The message list that `remove` and `add` make of `before` (the rule above).

    Raises:
        ValueError: a removed id the parent does not hold or named twice, a message both removed and
            added, or an added id twice; the reason, for the caller's error.
    """
    ids_before = {m.id for m in before}
    removed = set(remove)
    if len(removed) != len(remove):
        raise ValueError("remove names a message twice")
    unknown = sorted(removed - ids_before)
    if unknown:
        raise ValueError(f"remove names messages the parent checkpoint does not hold: {unknown[:3]}")
    added_ids = [m.id for m in add]
    if len(set(added_ids)) != len(added_ids):
        raise ValueError("add holds a message id twice")
    both = sorted(removed.intersection(added_ids))
    if both:
        raise ValueError(f"messages both removed and added: {both[:3]}")
    replacing = {m.id: m for m in add if m.id in ids_before}
    kept = [replacing.get(m.id, m) for m in before if m.id not in removed]
    return kept + [m for m in add if m.id not in ids_before]
