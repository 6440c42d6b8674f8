"""A thread's checkpoints as a tree, and where each message of a checkpoint sits in it, without reading messages.

The tree is built from `CheckpointLink`s (id, parent, `message_count`,
`kept_messages`: how many leading messages a checkpoint shares with its
parent; `agent.storage.summaries`), one cheap index scan of metadata. From it:

* **Where a message first appeared.** Walk the chain of a checkpoint X from X
  towards the root. A checkpoint wrote the positions from its `kept_messages`
  up to its last `kept_trailing` messages; the others it holds as its parent
  does. The newest checkpoint on the chain that wrote position i is where the
  message at i first appeared. An ordinary turn keeps its parent's messages
  and adds two, so both of its messages first appear at its own checkpoint. A
  removal in the middle shifts the messages after it, so they count as
  appearing again there. An in-place replacement ("save only":
  `update_checkpoint_state` with a message's id) keeps the length, and the
  messages after the replaced one keep their places, so their alternatives
  stay where they were written (before `kept_trailing`, they lost them).
* **The checkpoint to branch from** to edit or regenerate a message is the one
  just before that checkpoint on the chain (a thread's root for its first
  messages); when a later checkpoint of X's branch replaced a message before
  it, that checkpoint no longer holds X's messages before it, and the turn
  starts by resetting them (`agent.operations.edits`). The message's
  **siblings** are that checkpoint's children,
  oldest first: every alternative written at that point (edits, regenerations,
  branches, state updates). This is LangGraph `useStream`'s message metadata
  (`firstSeenState`, `branch`, `branchOptions`), computed here on the server.
  With each sibling comes its newest descendant (a leaf), which is what a UI
  switches to when the user picks that alternative ("< 2/3 >"), like
  `useStream`, which follows the newest child at every later fork.

One pass over the chain assigns every position (O(depth × replacements + messages)), so
reading a checkpoint costs the same whatever the number of other branches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.errors import CheckpointNotFound
from agent.operations.access import checkpoint_not_found
from agent.storage import CheckpointLink, ThreadStorage
from agent.storage.deltas import common_prefix, kept_trailing
from agent.types import MessagePlace

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


class ThreadTree:
    """The checkpoints of one thread (root namespace), linked by `parent_checkpoint_id`."""

    def __init__(self, thread_id: str, links: Iterable[CheckpointLink]) -> None:
        self.thread_id = thread_id
        self.links: dict[str, CheckpointLink] = {link.checkpoint_id: link for link in links}
        #: Checkpoint id -> its children, oldest first (ids are time-ordered). None: the roots (no parent
        #: in the thread).
        self.children: dict[str | None, list[str]] = {}
        for checkpoint_id in sorted(self.links):
            parent = self.links[checkpoint_id].parent_checkpoint_id
            self.children.setdefault(parent if parent in self.links else None, []).append(checkpoint_id)
        self._newest_leaf: dict[str, str] | None = None
        #: `kept_messages` by checkpoint id, where known (see `fill_kept`).
        self.kept: dict[str, int] = {
            link.checkpoint_id: link.kept_messages for link in self.links.values() if link.kept_messages is not None
        }
        #: `kept_trailing` by checkpoint id, where not 0.
        self.trailing: dict[str, int] = {link.checkpoint_id: link.kept_trailing for link in self.links.values() if link.kept_trailing}

    @classmethod
    def from_rows(cls, thread_id: str, rows: Iterable[Mapping[str, Any]]) -> ThreadTree:
        """A tree from `ThreadStorage.list_checkpoints` rows (which carry the whole metadata)."""
        return cls(
            thread_id,
            (
                CheckpointLink(
                    row["checkpoint_id"],
                    row["parent_checkpoint_id"],
                    (row["metadata"] or {}).get("message_count", 0),
                    (row["metadata"] or {}).get("kept_messages"),
                )
                for row in rows
            ),
        )

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self.links

    def parent(self, checkpoint_id: str) -> str | None:
        parent = self.links[checkpoint_id].parent_checkpoint_id
        return parent if parent in self.links else None

    def message_count(self, checkpoint_id: str) -> int:
        return self.links[checkpoint_id].message_count

    def chain(self, checkpoint_id: str) -> list[str]:
        """The checkpoint and its ancestors, oldest (the root) first.

        Raises:
            CheckpointNotFound: the checkpoint is not in this thread.
        """
        if checkpoint_id not in self.links:
            raise checkpoint_not_found(self.thread_id, checkpoint_id)
        chain: list[str] = []
        current: str | None = checkpoint_id
        while current is not None and len(chain) <= len(self.links):  # the bound guards against a cycle
            chain.append(current)
            current = self.parent(current)
        chain.reverse()
        return chain

    def siblings(self, checkpoint_id: str) -> list[str]:
        """The children of the checkpoint's parent (it included), oldest first."""
        return self.children.get(self.parent(checkpoint_id), [])

    def leaves(self) -> list[str]:
        """The checkpoints without children, newest first."""
        return sorted((c for c in self.links if c not in self.children), reverse=True)

    def newest_leaf(self, checkpoint_id: str) -> str:
        """The newest checkpoint without children that descends from `checkpoint_id` (itself if it has none)."""
        if self._newest_leaf is None:
            # A child is always written after its parent, so newest-first visits children before parents.
            newest: dict[str, str] = {}
            for checkpoint_id_ in sorted(self.links, reverse=True):
                kids = self.children.get(checkpoint_id_)
                newest[checkpoint_id_] = max(newest[kid] for kid in kids) if kids else checkpoint_id_
            self._newest_leaf = newest
        return self._newest_leaf[checkpoint_id]

    def fork_point(self, checkpoint_id: str) -> str | None:
        """The newest ancestor of the checkpoint with more than one child (where its branch leaves another)."""
        current = checkpoint_id
        while (parent := self.parent(current)) is not None:
            if len(self.children.get(parent, ())) > 1:
                return parent
            current = parent
        return None

    def common_ancestor(self, a: str, b: str) -> str | None:
        """The newest checkpoint that is `a` or an ancestor of `a`, and `b` or an ancestor of `b`."""
        ancestors_a = set(self.chain(a))
        return next((c for c in reversed(self.chain(b)) if c in ancestors_a), None)

    def shared_messages(self, a: str, b: str) -> int:
        """How many leading messages checkpoints `a` and `b` hold alike (with the same places in the tree).

        Those of their newest common ancestor that every checkpoint on the way down to either kept
        (`kept_messages`). Requires `kept` for both chains (see `fill_kept`).

        Raises:
            CheckpointNotFound: either checkpoint is not in this thread.
        """
        chain_a, chain_b = self.chain(a), self.chain(b)
        common = self.common_ancestor(a, b)
        if common is None:
            return 0
        shared = self.message_count(common)
        for chain in (chain_a, chain_b):
            for checkpoint_id in chain[chain.index(common) + 1 :]:
                shared = min(shared, self.kept[checkpoint_id])
        return shared

    def first_seen(self, chain: Sequence[str], message_count: int) -> list[int]:
        """For each message position of the chain's last checkpoint, the chain index where it first appeared.

        Requires `kept` for the chain (see `fill_kept`).
        """
        first = [0] * message_count
        # The positions not assigned yet, as [start, end) ranges: one, until an in-place replacement splits it.
        open_ = [(0, message_count)]
        for index in range(len(chain) - 1, 0, -1):
            if not open_:
                break
            checkpoint_id = chain[index]
            # The positions this checkpoint wrote; the others are its parent's, at the same positions.
            wrote = (self.kept[checkpoint_id], self.message_count(checkpoint_id) - self.trailing.get(checkpoint_id, 0))
            still = []
            for start, end in open_:
                low, high = max(start, wrote[0]), min(end, wrote[1])
                if low >= high:
                    still.append((start, end))
                    continue
                first[low:high] = [index] * (high - low)
                still += [(a, b) for a, b in ((start, low), (high, end)) if a < b]
            open_ = still
        # What is left first appeared at the chain's oldest checkpoint (0, the default).
        return first

    def newest_holding(self, chain: Sequence[str], count: int, since: int = 0) -> int | None:
        """The chain index, `since` or later, of the newest checkpoint that holds exactly the first `count`
        messages of the chain's last checkpoint (none of the checkpoints after it changed them), or None.

        Requires `kept` for the chain (see `fill_kept`).
        """
        kept_after = count  # the fewest leading messages the checkpoints after `index` kept, capped at `count`
        for index in range(len(chain) - 1, since - 1, -1):
            if kept_after >= count and self.message_count(chain[index]) == count:
                return index
            if index:
                kept_after = min(kept_after, self.kept[chain[index]])
        return None

    def holds(self, chain: Sequence[str], index: int, count: int) -> bool:
        """Whether `chain[index]` holds exactly the first `count` messages of the chain's last checkpoint.

        Requires `kept` for the chain (see `fill_kept`).
        """
        return self.message_count(chain[index]) == count and all(self.kept[c] >= count for c in chain[index + 1 :])

    def intact(self, chain: Sequence[str]) -> set[str]:
        """The checkpoints of the chain whose messages are the first messages of the chain's last checkpoint,
        unchanged (a checkpoint before a replacement in place holds the replaced message as it was).

        Requires `kept` for the chain (see `fill_kept`).
        """
        out = set()
        kept_after = None  # the fewest leading messages the checkpoints after `index` kept
        for index in range(len(chain) - 1, -1, -1):
            checkpoint_id = chain[index]
            if kept_after is None or self.message_count(checkpoint_id) <= kept_after:
                out.add(checkpoint_id)
            if index:
                kept = self.kept[checkpoint_id]
                kept_after = kept if kept_after is None else min(kept_after, kept)
        return out

    def places(self, chain: Sequence[str], message_count: int) -> list[MessagePlace]:
        """The `MessagePlace` of each message of the chain's last checkpoint, in order."""
        made: dict[int, MessagePlace] = {}
        out = []
        for index in self.first_seen(chain, message_count):
            if index not in made:
                checkpoint_id = chain[index]
                parent = chain[index - 1] if index > 0 else None
                siblings = tuple(self.children.get(parent, [checkpoint_id]))
                made[index] = MessagePlace(
                    checkpoint_id, parent, siblings, tuple(self.newest_leaf(sibling) for sibling in siblings)
                )
            out.append(made[index])
        return out

    def made_root_by_retention(self, checkpoint_id: str) -> bool:
        """Whether the checkpoint is a root that holds messages and recorded `kept_messages` 0: a
        `keep_latest` sweep made it the thread's root (`Tx.keep_only_head`). The roots of threads written
        before threads started with an empty root hold messages too, but were written before
        `kept_messages` existed, so they record none."""
        return self.parent(checkpoint_id) is None and self.message_count(checkpoint_id) > 0 and (
            self.links[checkpoint_id].kept_messages == 0
        )

    def missing_kept(self, chain: Sequence[str]) -> list[str]:
        """The chain's checkpoints (but the first) whose `kept_messages` is unknown (written by an older release)."""
        return [c for c in chain[1:] if c not in self.kept]


def read_tree(storage: ThreadStorage, thread_id: str) -> ThreadTree:
    """The thread's tree from `checkpoint_links` (one query; no messages)."""
    return ThreadTree(thread_id, storage.checkpoint_links(thread_id))


def fill_kept(storage: ThreadStorage, tree: ThreadTree, chain: Sequence[str]) -> None:
    """Compute `kept_messages` (and `kept_trailing`) for checkpoints of `chain` written before summaries had
    it (reads their messages).

    Raises:
        CheckpointNotFound: a checkpoint of the chain disappeared (the thread was deleted meanwhile).
    """
    for checkpoint_id in tree.missing_kept(chain):
        parent = tree.parent(checkpoint_id)
        mine = _messages(storage, tree.thread_id, checkpoint_id)
        theirs = _messages(storage, tree.thread_id, parent) if parent else ()
        tree.kept[checkpoint_id] = kept = common_prefix(mine, theirs)
        if trailing := kept_trailing(mine, theirs, kept):
            tree.trailing[checkpoint_id] = trailing


def places_of(storage: ThreadStorage, tree: ThreadTree, chain: Sequence[str], messages: Sequence[BaseMessage]) -> list[MessagePlace]:
    """`tree.places` for the chain's last checkpoint, whose messages are `messages`."""
    fill_kept(storage, tree, chain)
    return tree.places(chain, len(messages))


def _messages(storage: ThreadStorage, thread_id: str, checkpoint_id: str) -> tuple:
    found = storage.get_checkpoint(thread_id, checkpoint_id)
    if found is None:
        raise CheckpointNotFound(
            f"Checkpoint {checkpoint_id!r} of thread {thread_id!r} disappeared while it was read.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    return tuple(found.checkpoint["channel_values"].get("messages") or ())
