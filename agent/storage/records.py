"""The values storage hands out and takes in: thread records, tree links, retention candidates, idempotency
state, a turn's buffered writes, and the commit's own refusals.

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

from agent.errors import ConfigurationError, ThreadExists

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
    #: How many of its last messages are its parent's, after `kept_messages` (an in-place replacement).
    kept_trailing: int = 0


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


def checkpoint_taken(thread_id: str, checkpoint_id: str | None) -> ThreadExists:
    """The error of a commit that would give `checkpoint_id` (root namespace) to `thread_id` while another
    thread holds it: a checkpoint id names one thread (`storage.base.ThreadStorage.thread_of_checkpoint`)."""
    return ThreadExists(
        f"Checkpoint {checkpoint_id!r} belongs to another thread (a checkpoint id names one thread); "
        "nothing was written.",
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
    )


#: How many ids `duplicate_checkpoint_ids` names.
DUPLICATES_SHOWN = 5


def duplicate_checkpoint_ids(where: str, duplicates: list[tuple[str, list[str]]], *, total: int) -> ConfigurationError:
    """Setup's refusal of a database where `total` checkpoint ids are each held by more than one thread;
    `duplicates` are the first few, each with its threads. `where` names the database (password masked)."""
    shown = "; ".join(f"{checkpoint_id} in threads {', '.join(map(repr, threads))}" for checkpoint_id, threads in duplicates)
    more = f" (and {total - len(duplicates)} more)" if total > len(duplicates) else ""
    return ConfigurationError(
        f"Cannot set up {where}: {total} checkpoint id(s) belong to more than one thread, and a checkpoint id must "
        f"name one thread (a response id is resp_<checkpoint_id>): {shown}{more}. With the agent version used so "
        "far, keep one thread of each and move the others to new checkpoint ids: export each (`tt-agent export "
        "THREAD_ID -o FILE`), delete it (`agent.delete_thread(thread_id)`), and import it under a new thread id "
        "(`tt-agent import FILE --thread-id NEW_ID`, a copy with new checkpoint ids); then start this version "
        "again. The schema change that needs this was not applied.",
        checkpoint_id=duplicates[0][0],
        thread_id=duplicates[0][1][0],
    )


@dataclass(frozen=True)
class BranchRecord:
    """What a user said about one checkpoint's branch (`agent_branches`; `agent.operations.branch_records`).

    A thread has rows only for the checkpoints a user labelled, pinned or archived: no cost per turn.
    """

    checkpoint_id: str
    label: str | None = None
    pinned: bool = False
    """The thread's main branch is the newest branch through this checkpoint (at most one per thread)."""
    archived: bool = False
    """This checkpoint and everything after it are hidden from `list_branches` and sibling counts."""


@dataclass(frozen=True)
class SearchCandidate:
    """One thread whose rows of the message search index hold, together, every key of a query
    (`agent.storage.search`): its messages may hold the query's words."""

    thread_id: str
    newest_checkpoint_id: str
    """The greatest id of its root-namespace checkpoints: no hit of the thread is newer."""


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
    #: The id its last checkpoint is given when it commits (`name_head`), chosen once the turn holds its
    #: thread, so that the turn's response id (`resp_<id>`) is known before the model runs (a stream's
    #: `response.created` carries it). None: the last checkpoint keeps LangGraph's id (so does a head
    #: that waits at an `interrupt()`).
    head_id: str | None = None
    #: The config and metadata each checkpoint of the turn was written with (`TurnSaverMixin._write_checkpoint`),
    #: by id: what the Postgres storage needs to keep the head it committed (`PostgresThreadStorage`, "Known heads").
    written: dict[str, tuple[dict, dict]] = field(default_factory=dict)

    def name_head(self) -> str | None:
        """Give the last buffered checkpoint the id `head_id`, unless writes wait on it; returns the head's id.

        LangGraph makes a checkpoint's id when it writes it (with `durability="exit"`, when the run
        ends). `head_id` is a uuid6 made after the claim, so it still sorts after the turn's start
        checkpoint and before anything written after the turn, as LangGraph's own id would. A head
        with pending writes (a run stopped at `interrupt()`) keeps LangGraph's id: LangGraph derives
        its tasks' ids, and so the interrupts' ids, from the checkpoint id.
        """
        if self.head_id is None or not self.puts:
            return self.new_head
        config, checkpoint, metadata, versions = self.puts[-1]
        old = checkpoint["id"]
        if any(c["configurable"].get("checkpoint_id") == old for c, *_ in self.writes):
            return old
        self.puts[-1] = (config, {**checkpoint, "id": self.head_id}, metadata, versions)
        if old in self.loaded:
            self.loaded[self.head_id] = self.loaded.pop(old)
        return self.head_id

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
