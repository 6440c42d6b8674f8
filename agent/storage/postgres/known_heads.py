"""`KnownHeads`: the heads this process's turns committed, so the next turn on a thread need not read its start.

Why: a turn's claim reads the checkpoint the turn starts from (`agent_claim_turn`),
and on a thread that one process keeps writing (a chat served by one replica)
that checkpoint is the head the process's previous turn wrote a moment ago. Reading
it back cost about 0.25 ms a turn (the blobs' lookups on the server, the row's
bytes, and decoding them on the client: `bench/turn_cost.py`, issue 24).

How it stays right with many processes, branches and rewrites. The cache is a hint,
never trusted on its own: the claim passes the known head's id and its row version
(the `xmin` of its `checkpoints` row, read in the commit that wrote it), and the
server, in the claim's own statement, uses the hint only when

* the turn starts from that checkpoint (the thread's head, or the checkpoint the
  turn names): another process's turn, a branch switch (`set_head`), a fork or a
  deletion moves the head to another id, and then the start is read as before;
* the row is still the version that commit wrote: a prune (`keep_latest` makes the
  head a root), a rewrite of its parent or metadata (`delete_for_runs`) or an
  import writing it again all give it another `xmin`;
* no pending write waits on it (a write added by a raw LangGraph `put_writes`
  does not change the checkpoint's row).

A blob is never changed in place but by a rewrite that keeps its messages
(whole instead of a delta), always with its checkpoint row. So a stale entry only
costs the read it would have saved. `xmin` is a 32-bit transaction id: a row
written again by another transaction with the very same id would need the
server's transaction counter to wrap around (about 4 billion transactions) while
this process keeps the entry.

What is kept: the `CheckpointTuple` that `load_row` would have made of the head
(`TurnPostgresSaver.committed_head`: the message list the message cache holds,
the JSON parts as JSONB gives them back), and a fresh copy of its mutable parts
is handed to each claim (LangGraph changes the checkpoint it runs from). At most
`maxsize` threads (`message_cache_size`), least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from langgraph.checkpoint.base import CheckpointTuple, copy_checkpoint


class KnownHead(NamedTuple):
    """A head this process committed: its checkpoint id, its row's `xmin` (text) and the tuple a read would give."""

    checkpoint_id: str
    xmin: str
    tup: CheckpointTuple


class KnownHeads:
    """A bounded LRU of `KnownHead` by thread id. Thread-safe."""

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._heads: OrderedDict[str, KnownHead] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, thread_id: str) -> KnownHead | None:
        with self._lock:
            found = self._heads.get(thread_id)
            if found is not None:
                self._heads.move_to_end(thread_id)
            return found

    def put(self, thread_id: str, head: KnownHead) -> None:
        if self._maxsize <= 0:
            return
        with self._lock:
            self._heads[thread_id] = head
            self._heads.move_to_end(thread_id)
            while len(self._heads) > self._maxsize:
                self._heads.popitem(last=False)

    def forget(self, thread_id: str) -> None:
        with self._lock:
            self._heads.pop(thread_id, None)


def fresh(tup: CheckpointTuple) -> CheckpointTuple:
    """`tup` with its own copy of the checkpoint (channel values, versions) and the metadata's top level, so
    that the turn that runs from it cannot change the kept one."""
    return tup._replace(checkpoint=copy_checkpoint(tup.checkpoint), metadata=dict(tup.metadata))
