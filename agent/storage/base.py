"""What every backend provides: thread records, checkpoints, and the turn protocol (claim, run, commit).

Why a turn is two short transactions and a lease, not one long transaction:

* **Claim.** A turn first claims its thread: one short statement writes a row
  of `agent_claims` (a random token, a fencing number that grows with every
  claim, and an expiry `lease_seconds` ahead) unless an unexpired claim is
  there, or the thread belongs to another user. In the same round trip it
  reads the thread record and the checkpoint the turn starts from. Then the
  connection goes back to the pool: **no connection and no transaction is held
  while the model runs.** Holding one (the first release did, for its advisory
  lock) capped a process at `pool_max_size / model_seconds` turns per second,
  broke behind transaction-mode PgBouncer, and is what managed Postgres kills
  (`idle_in_transaction_session_timeout`).
* **Run.** LangGraph runs the graph against the saver, which buffers the
  turn's checkpoints and writes in memory (`saver.TurnSaverMixin`) and reads
  the start from the claim.
* **Commit.** One short transaction checks that the claim's token is still
  there (the fencing check: a turn whose claim expired and was taken over by
  a newer turn cannot overwrite the newer head), writes the buffered
  checkpoints, moves the head and releases the claim, atomically. A turn that
  fails writes nothing and releases its claim.
* **Lease.** While a turn runs, `claims.ClaimKeeper` renews its claim every
  `lease_seconds / 3`. A process killed with `kill -9` stops renewing, so its
  threads are free again after at most `lease_seconds` (15 s by default), with
  nothing half-written. Expiry is judged by the database's clock on Postgres
  (replicas' clocks may differ) and by the machine's on SQLite.
* **Double texting.** A turn under `interrupt` or `rollback` that finds its
  thread claimed asks the running turn to stop (`agent_claims.cancel`), then
  waits for the claim like `enqueue` (LangGraph Agent Server's strategies).
* **Exactly-once retries.** A claim carries the request's idempotency key
  (scoped by user), so a retry can see that its original still runs; the
  commit stores the result under the key (`Tx.store_response`, primary key
  user + key), so of two racing requests with one key only one can commit.
* **A release that cannot reach the database** (it is down) is retried by
  the keeper until it can, so the thread is free as soon as the database is
  back instead of after `lease_seconds`.

Backends implement the `_`-prefixed hooks and a `Tx` (the statements a write
transaction may run); the protocol above is written once, here.
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from agent.config import AgentSettings, MultitaskStrategy
from agent.errors import ThreadBusy, ThreadNotFound

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


@dataclass(eq=False)
class Claim:
    """A turn's hold on one thread, from its claim to its commit or release.

    `record` and `start` were read in the claim's round trip: the thread (None
    for a new one) and the checkpoint the turn starts from (the requested one,
    else the head; None when that checkpoint is not in the thread).
    """

    thread_id: str
    user_id: str | None
    token: str
    fence: int
    record: ThreadRecord | None
    start: CheckpointTuple | None
    idempotency_key: str | None = None
    #: Set by `ClaimKeeper` when a newer turn asked this one to stop: "interrupt" or "rollback".
    cancel: str | None = None
    #: Set when renewing found the claim gone (expired and taken over): the commit will fail.
    lost: bool = False
    #: Set together with `cancel` or `lost`, so a running turn can stop early.
    stop: threading.Event = field(default_factory=threading.Event)
    _on_stop: list[Callable[[], None]] = field(default_factory=list)

    def signal(self, *, cancel: str | None = None, lost: bool = False) -> None:
        """Record a cancel request or a lost claim and wake whoever waits on `stop`. Thread-safe."""
        if cancel and self.cancel is None:
            self.cancel = cancel
        self.lost = self.lost or lost
        if not self.stop.is_set():
            self.stop.set()
            for callback in list(self._on_stop):
                callback()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any OS thread) when the claim is signalled; at once if it already was."""
        self._on_stop.append(callback)
        if self.stop.is_set():
            callback()


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
        """Delete every row of the thread in every table (checkpoints, writes, blobs, record, claim, idempotency)."""

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


    # -- the saver's thread operations (`saver.TurnSaverMixin.prune`, `copy_thread`, `delete_for_runs`) --
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
        store its messages whole (no longer a delta against an ancestor) when they are a list of messages."""

    @abstractmethod
    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        """Delete every checkpoint of the thread but those in `keep` (`(checkpoint_ns, checkpoint_id)` pairs),
        with their pending writes, and every blob no kept checkpoint points at. The record stays."""


class ThreadStorage(ABC):
    """One database: the LangGraph saver the graph is compiled with, thread records, and turn claims.

    Implementations: `PostgresThreadStorage` (`postgresql://`),
    `SqliteThreadStorage` (`sqlite:///path`, and `memory://` as an in-process
    SQLite database). Every method that reads or writes raises
    `StorageUnavailable` when the database cannot be reached or refuses.
    """

    saver: Any  # a TurnSaverMixin subclass of the backend's LangGraph saver
    settings: AgentSettings

    def __init__(self, settings: AgentSettings) -> None:
        from agent.storage.claims import ClaimKeeper

        self.settings = settings
        self.keeper = ClaimKeeper(self, lease_seconds=settings.lease_seconds)

    # -- lifecycle ---------------------------------------------------------------------------
    @abstractmethod
    def setup(self) -> None:
        """Create or migrate the tables and check that they exist. Idempotent; safe from several processes."""

    def close(self) -> None:
        """Release connections and stop renewing claims. The storage is unusable afterwards."""
        self.keeper.close()
        self._close()

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def ready(self) -> bool:
        """Whether the database answers a query now (for readiness probes). Never raises."""

    # -- the turn protocol ---------------------------------------------------------------------
    def claim(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        checkpoint_id: str | None,
        strategy: MultitaskStrategy,
        timeout: float,
        idempotency_key: str | None = None,
        read_start: bool = True,
    ) -> Claim:
        """Claim `thread_id` for one turn, and read its record and the turn's start, without holding a connection.

        Args:
            thread_id: the thread; it need not exist yet.
            user_id: the caller; a thread owned by someone else is never claimed.
            checkpoint_id: the checkpoint the turn starts from; None: the head.
            strategy: when another turn holds the thread: `reject` raises at once;
                `enqueue` waits up to `timeout` seconds; `interrupt` and `rollback`
                first ask the running turn to stop, then wait like `enqueue`.
            timeout: seconds to wait (not `reject`).
            idempotency_key: stored with the claim, so a retry can tell that its original is still running.
            read_start: False: do not read the start checkpoint (`Claim.start` is None), for work
                that needs only the thread record (the retention sweep's deletions).

        Returns:
            The claim; it is renewed until `commit` or `release`.

        Raises:
            ThreadNotFound: the thread belongs to another user (worded as if it did not exist).
            ThreadBusy: another turn holds the thread (`reject`), or held it for `timeout` seconds.
            StorageUnavailable: the database failed; nothing was written.
        """
        self.setup()
        token = uuid.uuid4().hex
        deadline = time.monotonic() + (0.0 if strategy == "reject" else timeout)
        delay = 0.005
        asked_to_stop = False
        while True:
            claim, record = self._try_claim(
                thread_id,
                token,
                user_id=user_id,
                checkpoint_id=checkpoint_id,
                idempotency_key=idempotency_key,
                read_start=read_start,
            )
            if claim is not None:
                self.keeper.add(claim)
                return claim
            if record is not None and not owned_by(record, user_id):
                raise ThreadNotFound(f"Thread {thread_id!r} was not found.", thread_id=thread_id)
            if strategy in ("interrupt", "rollback") and not asked_to_stop:
                # Asked once: the turn running now. Waiting turns are not cancelled; they then
                # run one after another, as under `enqueue`.
                self.request_cancel(thread_id, strategy)
                asked_to_stop = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if strategy == "reject":
                    raise ThreadBusy(f"Thread {thread_id!r} is busy with another turn.", thread_id=thread_id)
                raise ThreadBusy(f"Thread {thread_id!r} stayed busy for {timeout} s; the turn was not run.", thread_id=thread_id)
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.1)

    def commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        """In one transaction: check that `claim` still holds its thread, run `apply`, release the claim.

        Raises:
            LeaseExpired: the claim expired and another turn took the thread; nothing was written.
            IdempotencyKeyTaken: `apply` stored a response under a key another request stored first;
                nothing was written.
            StorageUnavailable: the database failed; the message says whether anything was written.
        """
        try:
            self._commit(claim, apply)
        finally:
            self.keeper.remove(claim)

    def release(self, claim: Claim) -> None:
        """Give the thread up without writing (a failed, cancelled or `store: false` turn). Never raises.

        When the database cannot be reached, the keeper retries the release until it can
        (and the claim expires after `lease_seconds` anyway, should this process die).
        """
        self.keeper.remove(claim)
        try:
            self._release(claim)
        except Exception:  # noqa: BLE001 - retried by the keeper
            self.keeper.release_later(claim)

    def request_cancel(self, thread_id: str, mode: str) -> None:
        """Ask the turn that holds `thread_id` to stop (`mode`: "interrupt" or "rollback"), in any process."""
        local = self.keeper.local(thread_id)
        if local is not None:
            local.signal(cancel=mode)
        self._request_cancel(thread_id, mode)

    @contextmanager
    def claimed(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        strategy: MultitaskStrategy = "enqueue",
        timeout: float | None = None,
        checkpoint_id: str | None = None,
        read_start: bool = True,
    ) -> Iterator[Claim]:
        """Claim the thread for a short write that does not run the model; release it if the block raises.

        The block must end by calling `self.commit(claim, ...)` or leave the claim to be released.
        """
        claim = self.claim(
            thread_id,
            user_id=user_id,
            checkpoint_id=checkpoint_id,
            strategy=strategy,
            timeout=self.settings.enqueue_timeout if timeout is None else timeout,
            read_start=read_start,
        )
        try:
            yield claim
        finally:
            if self.keeper.holds(claim):
                self.release(claim)

    # -- backend hooks for the protocol -------------------------------------------------------------
    @abstractmethod
    def _try_claim(
        self,
        thread_id: str,
        token: str,
        *,
        user_id: str | None,
        checkpoint_id: str | None,
        idempotency_key: str | None,
        read_start: bool = True,
    ) -> tuple[Claim | None, ThreadRecord | None]:
        """One attempt, in one round trip: (the claim, or None if refused; the thread record)."""

    @abstractmethod
    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None: ...

    @abstractmethod
    def _release(self, claim: Claim) -> None: ...

    @abstractmethod
    def _request_cancel(self, thread_id: str, mode: str) -> None: ...

    @abstractmethod
    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        """Extend the claims' leases; returns {thread_id: cancel request or None} for the claims still held."""

    @abstractmethod
    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        """{thread_id: "interrupt" | "rollback"} for the claims a newer turn asked to stop."""

    # -- idempotency -------------------------------------------------------------------------------
    @abstractmethod
    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        """In one round trip: the unexpired stored result under (`user_key`, `key`), and the thread of a
        running turn whose claim carries `claim_key` (the scoped key it was claimed with).

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
    def list_checkpoints(self, thread_id: str, *, limit: int | None, before: str | None) -> list[dict]:
        """Up to `limit` (None: all) checkpoints of the thread, newest first, older than `before` if given.

        Each row: `checkpoint_id`, `parent_checkpoint_id`, `metadata` (dict, with
        the summary written by `summaries.summarize`). Reads no message.
        """

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
    def threads_with_checkpoints(self, checkpoint_ids: Sequence[str]) -> list[str]:
        """The ids of the threads (any owner) that hold any of `checkpoint_ids`, sorted.

        For imports, which keep checkpoint ids: checkpoint ids are unique across threads (the
        message cache and response ids rely on it). One read of the index on checkpoint_id
        (the one `thread_of_checkpoint` uses).
        """

    @abstractmethod
    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        """The thread whose (root namespace) checkpoint `checkpoint_id` is, or None; one indexed read.

        Checkpoint ids are unique across threads (a fork copies with new ids), which is what lets an
        OpenAI response id (`resp_<checkpoint_id>`) name its thread.
        """

    @abstractmethod
    def list_threads(
        self, user_id: str | None, *, limit: int, before: tuple[str, str] | None, metadata: Mapping[str, str]
    ) -> list[tuple[ThreadRecord, tuple[str, str]]]:
        """Up to `limit` threads `user_id` owns (None: those written without one), newest activity first
        (`updated_at` DESC, `thread_id` DESC), strictly after the position `before`, whose metadata holds
        every pair of `metadata`; each with its position (`activity`, `thread_id`): `activity` is the exact
        stored `updated_at` as text (of this backend), for the next page's `before`. One index range scan
        (`agent_threads_activity_idx`)."""

    @abstractmethod
    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        """The thread's position in `list_threads` order as it is now, or None when there is no such thread."""

    @abstractmethod
    def exists(self) -> bool:
        """Whether the store has been set up (its tables exist), found without creating anything.

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


class ThreadReads(Protocol):
    """The reads a thread's history needs; `ThreadStorage` has them, and so does the light
    `sqlite_reads.SqliteReader` of read-only commands (see `storage.open_reader`)."""

    def get_thread(self, thread_id: str) -> ThreadRecord | None: ...

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool: ...

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None) -> list[dict]: ...

    def threads_of_user(self, user_id: str) -> list[str]: ...

    def list_threads(
        self, user_id: str | None, *, limit: int, before: tuple[str, str] | None, metadata: Mapping[str, str]
    ) -> list[tuple[ThreadRecord, tuple[str, str]]]: ...

    def thread_position(self, thread_id: str) -> tuple[str, str] | None: ...

    def close(self) -> None: ...
