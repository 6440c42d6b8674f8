"""How branch records (labels, the pin, archives) read on a thread's tree: which checkpoints are hidden, which
branch a label or the pin names, and which checkpoints a branch alone uses.

A record belongs to one checkpoint (`storage.BranchRecord`); what it means for
a branch is computed here, at read time, from the tree, so a record never has
to move when a turn continues its branch:

* **Archived.** A checkpoint is hidden when it or one of its ancestors is
  archived; `archive_branch` marks the checkpoint where the branch starts
  (`branch_start`), so the whole branch, and whatever continues it, is hidden.
  A hidden checkpoint still reads (`get_checkpoint_state`), and a chain that
  runs through one keeps it among its own siblings.
* **Label.** A branch (a leaf) shows the label of the newest labelled
  checkpoint on its own part: from the leaf up to, not including, where it
  leaves its nearest other branch (`ThreadTree.fork_point`). A label given to
  a leaf stays with the branch as it grows.
* **Pin.** The pinned branch is the newest visible leaf through the pinned checkpoint.
* **A branch's own checkpoints** (`branch_start`, `subtree`): from a
  checkpoint, walk up while the parent has no other child and is not the
  root; that is where the branch starts, and its subtree is what only that
  branch uses. For a leaf it is the leaf's own part; for a sibling (an edit,
  a regeneration) it is that alternative with everything after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agent.operations.tree import ThreadTree
from agent.storage import BranchRecord, CheckpointLink


def branch_start(tree: ThreadTree, checkpoint_id: str) -> str:
    """The first checkpoint of the branch through `checkpoint_id` that no other branch shares (see the module
    docstring); the checkpoint itself when it is the root."""
    current = checkpoint_id
    while (parent := tree.parent(current)) is not None:
        if tree.parent(parent) is None or len(tree.children.get(parent, ())) > 1:
            return current
        current = parent
    return current


def subtree(tree: ThreadTree, checkpoint_id: str) -> list[str]:
    """The checkpoint and all its descendants, oldest first."""
    out, stack = [], [checkpoint_id]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(tree.children.get(current, ()))
    return sorted(out)


def hidden(tree: ThreadTree, records: Mapping[str, BranchRecord]) -> set[str]:
    """The checkpoints an archive hides: each archived checkpoint of the tree and its descendants."""
    out: set[str] = set()
    for record in records.values():
        if record.archived and record.checkpoint_id in tree and record.checkpoint_id not in out:
            out.update(subtree(tree, record.checkpoint_id))
    return out


def visible_links(links: Iterable[CheckpointLink], gone: set[str], keep: Iterable[str] = ()) -> list[CheckpointLink]:
    """`links` but the hidden ones (`gone`), except those in `keep` (the chain being read)."""
    kept = set(keep)
    return [link for link in links if link.checkpoint_id not in gone or link.checkpoint_id in kept]


def visible_tree(tree: ThreadTree, records: Mapping[str, BranchRecord], *, keep: Iterable[str] = ()) -> ThreadTree:
    """The tree without the hidden checkpoints (but those in `keep`), with what `fill_kept` found."""
    gone = hidden(tree, records)
    if not gone:
        return tree
    out = ThreadTree(tree.thread_id, visible_links(tree.links.values(), gone, keep))
    out.kept.update({c: k for c, k in tree.kept.items() if c in out})
    return out


def label_of(tree: ThreadTree, leaf: str, records: Mapping[str, BranchRecord]) -> str | None:
    """The label of the newest labelled checkpoint on the leaf's own part (see the module docstring)."""
    stop = tree.fork_point(leaf)
    current: str | None = leaf
    while current is not None and current != stop:
        record = records.get(current)
        if record is not None and record.label is not None:
            return record.label
        current = tree.parent(current)
    return None


def pinned_leaf(tree: ThreadTree, records: Mapping[str, BranchRecord]) -> str | None:
    """The leaf of the pinned branch (the newest leaf of `tree` through the pinned checkpoint), or None."""
    pinned = next((r.checkpoint_id for r in records.values() if r.pinned), None)
    if pinned is None or pinned not in tree:
        return None
    return tree.newest_leaf(pinned)


def record_of_chain(chain: list[str], tree: ThreadTree, records: Mapping[str, BranchRecord]) -> dict[str, object] | None:
    """What a checkpoint's branch says (for `get_checkpoint_state`): `label` (as for its leaf, the newest
    leaf through it), `pinned` (its chain holds the pinned checkpoint) and `archived` (it is hidden); None
    when the thread has no branch record."""
    if not records:
        return None
    target = chain[-1]
    gone = hidden(tree, records)
    leaf = tree.newest_leaf(target)
    label = label_of(tree, leaf, records)
    if label is None:  # a label on the chain above the leaf's own part, newest first
        label = next((records[c].label for c in reversed(chain) if c in records and records[c].label is not None), None)
    return {
        "label": label,
        "pinned": any(records.get(c, BranchRecord(c)).pinned for c in chain),
        "archived": target in gone,
    }
