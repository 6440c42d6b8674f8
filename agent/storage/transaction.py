"""`Tx`: the statements one write transaction may run, which each backend implements on its connection.

The turn protocol (`turns`) and the operations above it write only through a
`Tx` handed to them inside a transaction the storage opened (a commit, or
`ThreadStorage.transaction`): so every write of one operation lands in one
transaction or not at all, and on Postgres the statements join the commit's
single round trip (`postgres.batch`). Reads a `Tx` offers (`thread_record`,
`is_expired`…) run inside the same transaction, for checks that must see what
the transaction sees.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.storage.records import BranchRecord, ThreadRecord, Turn

if TYPE_CHECKING:  # LangGraph is imported by the backends; read-only commands never load it
    from langgraph.checkpoint.base import CheckpointTuple


class Tx(ABC):
    """The statements one write transaction may run; each backend implements them on its connection."""

    @abstractmethod
    def write_turn(self, turn: Turn) -> None:
        """Write a turn's buffered checkpoints and pending writes (messages as deltas)."""

    @abstractmethod
    def upsert_thread(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        head_checkpoint_id: str,
        message_count: int,
        title: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Create the thread record (owner `user_id`, with `title` and `metadata`), or move its head
        (`title` and `metadata` are then ignored); `updated_at` becomes now."""

    @abstractmethod
    def update_thread(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        title: str | None,
        metadata: Mapping[str, str] | None,
        ttl_seconds: float | None,
    ) -> ThreadRecord | None:
        """Set the given fields (None: unchanged; `metadata` replaces the whole object) of the thread if
        `user_id` owns it, leaving `updated_at` alone; the record after, or None (unknown or not owned)."""

    @abstractmethod
    def delete_thread(self, thread_id: str) -> None:
        """Delete every row of the thread in every table (checkpoints, writes, blobs, record, claim, idempotency,
        branch records, search index, and its runs with their events)."""

    @abstractmethod
    def store_response(
        self,
        user_key: str,
        key: str,
        *,
        request_hash: str,
        thread_id: str,
        response: Mapping[str, Any],
        ttl_seconds: float,
    ) -> None:
        """Store a request's result under (`user_key`, `key`) until `ttl_seconds` from now (database clock).

        An expired row for the same key is replaced. `response` is JSON:
        `{"output": [Responses items], "custom_outputs": {...}}`.
        The commit raises `IdempotencyKeyTaken` when an unexpired row exists.
        """

    @abstractmethod
    def set_head(self, thread_id: str, head_checkpoint_id: str, *, message_count: int) -> None:
        """Move an existing thread's head (and its `message_count`) without writing a checkpoint; `updated_at` becomes now."""

    @abstractmethod
    def insert_thread(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        head_checkpoint_id: str,
        message_count: int,
        title: str | None,
        metadata: Mapping[str, str],
        forked_from: Mapping[str, str] | None,
    ) -> None:
        """Create a thread record with all its fields (a fork); `created_at` and `updated_at` become now."""

    @abstractmethod
    def is_expired(self, thread_id: str, *, default_ttl: float | None, now: datetime | None) -> bool:
        """Whether the thread is expired, judged in this transaction: its `updated_at` plus its own
        `ttl_seconds` (else `default_ttl`; both None: never) is at or before `now` (None: the
        database's clock on Postgres, this machine's on SQLite). False for an unknown thread."""

    @abstractmethod
    def keep_only_head(self, thread_id: str, head: CheckpointTuple) -> int:
        """Delete every checkpoint of the thread but `head` (its head, messages resolved), with their
        blobs and pending writes, after storing the head's messages whole (no longer a delta against
        an ancestor) and making the head a root (no parent, `kept_messages` 0).

        Returns:
            How many checkpoints (root namespace) were deleted.
        """

    # -- the saver's thread operations (`saver_threads.SaverThreadOperations`: prune, copy_thread, delete_for_runs) --
    @abstractmethod
    def thread_record(self, thread_id: str) -> ThreadRecord | None:
        """The thread's record, read in this transaction."""

    @abstractmethod
    def thread_has_rows(self, thread_id: str) -> bool:
        """Whether the thread has a checkpoint (any namespace)."""

    @abstractmethod
    def busy_threads(self, thread_ids: Sequence[str]) -> list[str]:
        """Those of `thread_ids` an unexpired claim holds (a turn is running on them)."""

    @abstractmethod
    def threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        """The threads (sorted) with a checkpoint whose metadata `run_id` is one of `run_ids`."""

    @abstractmethod
    def copy_thread_rows(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and pending write of the source thread (same ids) to the target."""

    @abstractmethod
    def rewrite_checkpoint(
        self, thread_id: str, tup: CheckpointTuple, *, parent_id: str | None, metadata: Mapping[str, Any]
    ) -> None:
        """Give a stored checkpoint (`tup`, messages resolved) a new parent and metadata (stored layout), and
        store its messages whole (no longer a delta against an ancestor) when they are a list of messages;
        a root-namespace checkpoint's search index row then holds every word of its messages
        (`search.rewritten_keys`: its ancestors may go)."""

    @abstractmethod
    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        """Delete every checkpoint of the thread but those in `keep` (`(checkpoint_ns, checkpoint_id)` pairs),
        with their pending writes, and every blob no kept checkpoint points at. The record stays."""

    # -- branch records and the search index (`operations.branch_records`, `storage.search`) --
    @abstractmethod
    def label_branch(self, thread_id: str, checkpoint_id: str, label: str | None) -> None:
        """Set (None: remove) the label of the checkpoint's branch record."""

    @abstractmethod
    def pin_branch(self, thread_id: str, checkpoint_id: str | None) -> None:
        """Make `checkpoint_id` the thread's one pinned checkpoint (None: pin none)."""

    @abstractmethod
    def archive_branch(self, thread_id: str, checkpoint_id: str, archived: bool) -> None:
        """Mark (or unmark) the checkpoint archived: it and its descendants are hidden from branch lists."""

    @abstractmethod
    def put_branch_records(self, thread_id: str, records: Sequence[BranchRecord]) -> None:
        """Write `records` as they are (an import)."""

    @abstractmethod
    def index_thread(self, thread_id: str, checkpoint_ids: Sequence[str], rows: Sequence[tuple[str, list[int]]]) -> None:
        """Replace the search index rows of the thread's checkpoints `checkpoint_ids` by `rows`
        ((checkpoint_id, keys), `search.thread_rows`)."""

    @abstractmethod
    def clear_search_index(self) -> None:
        """Remove every search index row."""

    @abstractmethod
    def delete_branch_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
        """Delete these checkpoints (any namespace) with their pending writes, registered ids, branch
        records and search rows, and every blob no remaining checkpoint points at. The caller removes
        only whole subtrees, so no remaining message delta names a deleted base (`deltas`)."""
