"""The turn protocol, written once for every backend: claim, run without a connection, commit, lease.

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

Backends implement the hooks (`_try_claim`, `_commit`, `try_release`,
`_request_cancel`, `renew`, `poll_cancels`) and a `Tx` (the statements a write
transaction may run, `transaction`); the protocol above is written once, here,
in `TurnProtocol`, which `base.ThreadStorage` extends with the rest of the
interface. The claim keeper is handed in (`open_storage` builds it) and knows
the storage only as `claims.Leases`, so `claims` imports nothing of this module.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from agent.config import AgentSettings, MultitaskStrategy
from agent.errors import ThreadBusy, ThreadNotFound
from agent.storage.claims import Claim, ClaimKeeper
from agent.storage.records import ThreadRecord, owned_by
from agent.storage.transaction import Tx


class TurnProtocol(ABC):
    """Claim, commit, release and cancel of turns on one database, over the backend's hooks.

    `keeper` renews the claims this storage hands out (one keeper per storage; `open_storage` builds it).
    """

    settings: AgentSettings

    def __init__(self, settings: AgentSettings, *, keeper: ClaimKeeper) -> None:
        self.settings = settings
        self.keeper = keeper
        keeper.keep_for(self)

    @abstractmethod
    def setup(self) -> None:
        """Create or migrate the tables and check that they exist. Idempotent; safe from several processes."""

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
            ThreadExists: `apply` wrote a checkpoint whose id another thread holds (a checkpoint id names
                one thread: `agent_checkpoint_ids`); nothing was written.
            StorageUnavailable: the database failed, or a statement ran longer than `statement_timeout_ms`;
                the message says whether anything was written.
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
            self.try_release(claim)
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
    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        """The fencing check, `apply`'s writes and the release in one transaction (see `commit`)."""

    @abstractmethod
    def try_release(self, claim: Claim) -> None:
        """Release `claim` once, without the keeper's retry (the keeper's own retry calls this).

        Raises:
            StorageUnavailable: the database could not be reached; the claim is still held.
        """

    @abstractmethod
    def _request_cancel(self, thread_id: str, mode: str) -> None:
        """Record a cancel request on the thread's unexpired claim, for the keeper of whichever process holds it."""

    @abstractmethod
    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        """Extend the claims' leases; returns {thread_id: cancel request or None} for the claims still held."""

    @abstractmethod
    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        """{thread_id: "interrupt" | "rollback"} for the claims a newer turn asked to stop."""
