"""The values storage hands out and takes in: thread records, tree links, retention candidates, idempotency
state, and a turn's buffered writes.

Plain frozen dataclasses with no I/O and no LangGraph import (a checkpoint is a
`CheckpointTuple` only in annotations), so read-only commands and the layers
above can hold them without loading a backend. The ownership rule (`owned_by`)
lives here, beside the record it reads, so there is one owner for it; the
claim statements of each backend apply the same rule in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # LangGraph is imported by the backends; read-only commands never load it
    from langgraph.checkpoint.base import CheckpointTuple


@dataclass(frozen=True)
class ThreadRecord:
    """A thread as the agent knows it (one row of `agent_threads`).

    Timestamps are ISO 8601 strings in UTC; `metadata` maps strings to strings.
    """

    thread_id: str
    user_id: str | None
    head_checkpoint_id: str
    title: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    message_count: int = 0
    forked_from: Mapping[str, str] | None = None
    ttl_seconds: float | None = None
    created_at: str | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class CheckpointLink:
    """One checkpoint's place in its thread's tree, read from its metadata summary (no messages).

    `kept_messages` is how many of its first messages are its parent's, unchanged
    (`summaries.summarize`); None for a checkpoint written before the summary had it.
    """

    checkpoint_id: str
    parent_checkpoint_id: str | None
    message_count: int
    kept_messages: int | None


@dataclass(frozen=True)
class ExpiredThread:
    """A thread the retention sweep found expired (`ThreadStorage.expired_threads`).

    `position` is where the next batch starts after: the backend's own
    (updated_at, thread_id) pair, opaque to callers.
    """

    thread_id: str
    user_id: str | None
    position: Any


def owned_by(record: ThreadRecord | None, user_id: str | None) -> bool:
    """Whether `user_id` may use the thread: it exists and its owner is `user_id`.

    Threads written without a user_id belong to anonymous callers only. The
    claim statements of each backend apply the same rule in SQL.
    """
    return record is not None and record.user_id == user_id


@dataclass(frozen=True)
class IdempotencyState:
    """What the database knows about one idempotency key (of one user).

    `response` is the stored result of the request that used the key (None when
    there is none, or it expired), with that request's `request_hash` and
    `thread_id`; `running_thread_id` is the thread of a turn that holds its claim
    with this key right now (None when none does).
    """

    request_hash: str | None = None
    thread_id: str | None = None
    response: Mapping[str, Any] | None = None
    running_thread_id: str | None = None


class IdempotencyKeyTaken(Exception):
    """Raised by `ThreadStorage.commit` when another request stored a result under the same key first.

    Internal: the turn runner answers with that stored result; nothing of this turn was written.
    """


@dataclass
class Turn:
    """The writes of one turn, buffered by the saver until `ThreadStorage.commit` writes them."""

    thread_id: str
    #: The thread's record as read by the claim; None for a new thread.
    record: ThreadRecord | None = None
    puts: list[tuple] = field(default_factory=list)
    writes: list[tuple] = field(default_factory=list)
    #: Checkpoints this turn has read (or written), by id, as resolved CheckpointTuples.
    loaded: dict[str, CheckpointTuple | None] = field(default_factory=dict)

    @property
    def new_head(self) -> str | None:
        """The checkpoint this turn will leave as the thread head: its last one."""
        return self.puts[-1][1]["id"] if self.puts else None

    @property
    def latest_id(self) -> str | None:
        """What LangGraph calls the thread's latest checkpoint while this turn runs."""
        if self.puts:
            return self.puts[-1][1]["id"]
        return self.record.head_checkpoint_id if self.record else None
