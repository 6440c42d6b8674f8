"""`ThreadStorage`: what every backend provides: the turn protocol, thread records, checkpoints, retention.

The interface is cut in three so that each part reads on its own: the values
(`records`), the turn protocol written once over the backends' hooks
(`turns.TurnProtocol`, with the why of its two short transactions and a
lease), and here the rest: lifecycle, idempotency lookups, the retention
sweep's candidates, writes without a claim, and the reads. `ThreadReads` is the
subset a read-only command needs, which the light SQLite reader provides too.

This module, like the package door, imports no LangGraph; the backends do.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from agent.encryption import Keyring
from agent.storage.claims import Claim, ClaimKeeper
from agent.storage.records import (
    BranchRecord,
    CheckpointLink,
    ExpiredThread,
    IdempotencyKeyTaken,
    IdempotencyState,
    SearchCandidate,
    ThreadRecord,
    Turn,
    owned_by,
)
from agent.storage.transaction import Tx
from agent.storage.turns import TurnProtocol

if TYPE_CHECKING:  # LangGraph is imported by the backends; read-only commands never load it
    from langgraph.checkpoint.base import CheckpointTuple

    from agent.config import AgentSettings

__all__ = [
    "BranchRecord",
    "CheckpointLink",
    "Claim",
    "ClaimKeeper",
    "ExpiredThread",
    "IdempotencyKeyTaken",
    "IdempotencyState",
    "SearchCandidate",
    "ThreadReads",
    "ThreadRecord",
    "ThreadStorage",
    "Turn",
    "Tx",
    "owned_by",
]


class ThreadStorage(TurnProtocol):
    """One database: the LangGraph saver the graph is compiled with, thread records, and turn claims.

    Implementations: `PostgresThreadStorage` (`postgresql://`),
    `SqliteThreadStorage` (`sqlite:///path`, and `memory://` as an in-process
    SQLite database); build one with `agent.storage.open_storage`. Every method
    that reads or writes raises `StorageUnavailable` when the database cannot
    be reached or refuses.

    Code that keeps its own rows beside the checkpoints (long-term memory) runs
    its statements inside the commit through each backend's public hook:
    `PostgresThreadStorage.run` / `.cursor`, `SqliteThreadStorage.cursor`.
    """

    saver: Any  # a TurnSaverMixin subclass of the backend's LangGraph saver

    def __init__(self, settings: AgentSettings, *, keeper: ClaimKeeper) -> None:
        super().__init__(settings, keeper=keeper)
        #: The keys that seal what this storage writes (`agent.encryption`); no keys: plaintext.
        self.keyring = Keyring.from_settings(settings)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release connections and stop renewing claims. The storage is unusable afterwards."""
        self.keeper.close()
        self._close()

    @abstractmethod
    def _close(self) -> None:
        """Close the backend's connections (the keeper has stopped)."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether the database answers a query now (for readiness probes). Never raises."""

    # -- idempotency -------------------------------------------------------------------------------
    @abstractmethod
    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        """In one round trip: the unexpired stored result under (`user_key`, `key`), and the thread of a
        running turn whose claim carries `claim_key` (the scoped key it was claimed with). The claim is
        read before the result (two snapshots): the commit that stores a result releases its claim, so a
        turn that committed between the reads still shows its result.

        Raises:
            StorageUnavailable: the database failed.
        """

    @abstractmethod
    def sweep_idempotency(self) -> int:
        """Delete every expired stored result; returns how many. Never needed for correctness (lookups
        ignore expired rows); it keeps the table small."""

    # -- retention -----------------------------------------------------------------------------------
    @abstractmethod
    def expired_threads(
        self,
        *,
        default_ttl: float | None,
        now: datetime | None,
        limit: int,
        after: Any = None,
        trimmable_only: bool = False,
    ) -> list[ExpiredThread]:
        """Up to `limit` expired threads that no turn holds now, oldest activity first (by
        `updated_at`, then `thread_id`), after the position `after` (an `ExpiredThread.position`).

        Expired: `updated_at` + the thread's `ttl_seconds` (else `default_ttl`; both None: never)
        is at or before `now` (None: the database's clock on Postgres, this machine's on SQLite).
        `trimmable_only`: only threads with a checkpoint besides the head. A candidate list only:
        the sweep claims each thread and checks again (`Tx.is_expired`) before removing anything.
        """

    # -- writes without a claim ------------------------------------------------------------------------
    @abstractmethod
    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        """Run `apply` in one write transaction (for changes that need no claim) and return its result."""

    # -- reads ------------------------------------------------------------------------------------------
    @abstractmethod
    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        """The thread's record, or None when the agent never committed a turn on it."""

    @abstractmethod
    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        """Whether `checkpoint_id` is a checkpoint of `thread_id` (root namespace)."""

    @abstractmethod
    def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointTuple | None:
        """The checkpoint with its messages resolved, or None when it is not in the thread."""

    @abstractmethod
    def get_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]) -> list[CheckpointTuple]:
        """Those of `checkpoint_ids` that are checkpoints of the thread, messages resolved, oldest first (one query)."""

    @abstractmethod
    def task_paths(self, thread_id: str, checkpoint_id: str) -> dict[str, str]:
        """The LangGraph task path of each task with a pending write on the checkpoint (root namespace), by
        task id (`"~__pregel_pull, <node>"` for a node's task; `""` for a write stored without one); `{}` for a
        checkpoint with none. One query that reads no value: a `CheckpointTuple`'s `pending_writes` leave the
        paths out."""

    @abstractmethod
    def list_checkpoints(
        self, thread_id: str, *, limit: int | None, before: str | None, previews: bool = True
    ) -> list[dict]:
        """Up to `limit` (None: all) checkpoints of the thread, newest first, older than `before` if given.

        Each row: `checkpoint_id`, `parent_checkpoint_id`, `metadata` (dict, with
        the summary written by `summaries.summarize`). The message previews a
        checkpoint does not store are read from its stored delta, for all rows in
        one more query (`summaries`, "Previews from the delta"); with `previews`
        False they are left out, for `fill_previews` on the rows the caller shows.
        """

    @abstractmethod
    def fill_previews(self, thread_id: str, rows: list[dict]) -> list[dict]:
        """`rows` of `list_checkpoints(..., previews=False)` with their message previews (`last_message`,
        `last_user_message`) in `metadata`; one query at most. The rows are changed in place and returned."""

    @abstractmethod
    def checkpoint_links(self, thread_id: str) -> list[CheckpointLink]:
        """Every checkpoint of the thread (root namespace) as a `CheckpointLink`, in no particular order.

        One index range scan reading four values per checkpoint: cheaper than
        `list_checkpoints`, and it reads no message.
        """

    @abstractmethod
    def threads_of_user(self, user_id: str) -> list[str]:
        """The ids of the threads `user_id` owns, sorted."""

    @abstractmethod
    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        """The thread whose (root namespace) checkpoint `checkpoint_id` is, or None; one indexed read.

        A checkpoint id names one thread (Postgres: a unique index over the checkpoints that are no copy,
        `postgres.checkpoint_ids`; SQLite: the primary key of `agent_checkpoint_ids`, which every commit
        writes; a fork and an import under another thread id write new ids), which is what lets an
        OpenAI response id (`resp_<checkpoint_id>`) name its thread. An id that names no thread that
        way (a LangGraph `copy_thread` copy's, once its source is deleted) is found in the first copy
        (by thread id) that holds it.
        """

    @abstractmethod
    def list_threads(
        self, user_id: str | None, *, limit: int, before: tuple[str, str] | None, metadata: Mapping[str, str]
    ) -> list[tuple[ThreadRecord, tuple[str, str]]]:
        """Up to `limit` threads `user_id` owns (None: those written without one), newest activity first
        (`updated_at` DESC, `thread_id` DESC), strictly after the position `before`, whose metadata holds
        every pair of `metadata`; each with its position (`activity`, `thread_id`): `activity` is the exact
        stored `updated_at` as text (of this backend), for the next page's `before`. One index range scan
        (`agent_threads_activity_asc_idx` on Postgres, scanned backward)."""

    @abstractmethod
    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        """The thread's position in `list_threads` order as it is now, or None when there is no such thread."""

    @abstractmethod
    def exists(self) -> bool:
        """Whether the database has been set up (its tables exist), found without creating anything.

        Read-only commands ask this before their first read, which would otherwise run `setup()`.
        """

    @abstractmethod
    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        """Token usage from checkpoint metadata, in one statement that reads no message.

        Returns:
            (the thread's usage: `{"input_tokens", "output_tokens"}` summed over the `usage` of every
            checkpoint, so every recorded model call of every branch counts once; the `branch_usage`
            of `checkpoint_id`, None when it has none), or None when `checkpoint_id` is not a
            checkpoint of the thread.
        """

    @abstractmethod
    def branch_records(self, thread_id: str) -> dict[str, BranchRecord]:
        """The thread's branch records (labels, the pin, archives) by checkpoint id; one query."""

    @abstractmethod
    def search_candidates(self, user_id: str | None, words: list[str]) -> list[SearchCandidate]:
        """The threads of `user_id` (None: those written without one) whose search index rows hold, together,
        the key of every one of `words` (`search.terms`), newest checkpoint first (then the greater thread
        id); one query. Candidates only: `search.thread_hits` reads their messages."""

    @abstractmethod
    def unindexed_threads(self, after: str | None, limit: int) -> list[str]:
        """Up to `limit` ids of threads with a root checkpoint (root namespace, no parent) that has no search
        index row, in id order, after `after` (the last of the previous page; None: from the start)."""

    def index_thread(self, thread_id: str, checkpoint_ids: Sequence[str], rows: Sequence[tuple[str, list[int]]]) -> None:
        """Replace the search index rows of the thread's checkpoints `checkpoint_ids` (those read) by `rows`
        ((checkpoint_id, keys), `search.thread_rows`), in one transaction."""
        self.transaction(lambda tx: tx.index_thread(thread_id, checkpoint_ids, rows))

    def clear_search_index(self) -> None:
        """Remove every search index row, in one transaction."""
        self.transaction(lambda tx: tx.clear_search_index())


class ThreadReads(Protocol):
    """The reads a thread's history needs; `ThreadStorage` has them, and so does the light
    `sqlite.reads.SqliteReader` of read-only commands (see `agent.storage.open_reader`)."""

    def get_thread(self, thread_id: str) -> ThreadRecord | None: ...

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool: ...

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None, previews: bool = True) -> list[dict]: ...

    def fill_previews(self, thread_id: str, rows: list[dict]) -> list[dict]: ...

    def branch_records(self, thread_id: str) -> dict[str, BranchRecord]: ...

    def threads_of_user(self, user_id: str) -> list[str]: ...

    def list_threads(
        self, user_id: str | None, *, limit: int, before: tuple[str, str] | None, metadata: Mapping[str, str]
    ) -> list[tuple[ThreadRecord, tuple[str, str]]]: ...

    def thread_position(self, thread_id: str) -> tuple[str, str] | None: ...

    def close(self) -> None: ...
