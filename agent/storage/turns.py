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
* **Waiting turns are served in arrival order** (`enqueue`, and `interrupt` /
  `rollback` after their stop request), across processes. A turn refused
  because its thread is busy takes a ticket in the same round trip
  (`agent_claim_waiters`, a number that grows with every waiter); a claim is
  given only when no live waiter holds a smaller ticket, so a newcomer, or a
  waiter whose poll happens to come first, never overtakes. Each attempt
  keeps its ticket alive for `lease_seconds`: a waiter whose process died
  stops blocking the queue after that, as a dead turn's claim does. A waiter
  that gives up (its timeout, an error) leaves the queue. Before tickets,
  waiters polled with backoff and whichever polled first after a release won.
* **Steering** (`steer`, OpenAI's word): a turn that finds its thread busy
  takes its ticket like `enqueue` and, when no live waiter is ahead of it,
  offers its messages to the running turn (`agent_steers`: a row bound to the
  running claim's token, written in the same statement that checks that claim
  is live). The running turn reads its offers before its next model call (a
  safe point: after a tool result; `agent.operations.turns.steer`) and commits
  them with its checkpoint. The steering request keeps waiting (past its
  timeout: its messages may already be in the running turn's commit) until it
  gets the claim in its turn; then the head says what happened: its messages
  are there (joined) or not (the running turn was past its last model call,
  failed, was rolled back or died), and then it runs them as the next turn.
  The row is the steering request's until then, and it deletes it; nothing is
  lost if either process dies: a dead running turn writes nothing, and a
  dead steering request's row is read by nobody after the running turn ends.
  Waiters ahead of it keep their order: a steer offers nothing then, and waits.
* **Deleting a user's data** (`user_claimed`, `delete_user_data`) holds a
  `UserClaim` (`agent_user_claims`, a lease) for the whole deletion: every
  claim for that user is refused meanwhile (`UserBeingDeleted`), and
  `claimed_threads_of_user` finds the threads whose turns were already running
  when it began (a new thread has no record until its turn commits), so the
  deletion waits for them and deletes them too. On Postgres a claim takes a
  shared advisory lock on its user and the user claim an exclusive one, so a
  claim that passed the check before the user claim was written has committed
  its row before the deletion reads the running claims. SQLite's claims are
  serialized by `BEGIN IMMEDIATE`.
* **Exactly-once retries.** A claim carries the request's idempotency key
  (scoped by user), so a retry can see that its original still runs; the
  commit stores the result under the key (`Tx.store_response`, primary key
  user + key), so of two racing requests with one key only one can commit.
* **A release that cannot reach the database** (it is down) is retried by
  the keeper until it can, so the thread is free as soon as the database is
  back instead of after `lease_seconds`.

Backends implement the hooks (`_try_claim`, `_leave_queue`, `_commit`, `try_release`,
`_request_cancel`, `renew`, `poll_cancels`, `_claim_user`, `_release_user`,
`claimed_threads_of_user`) and a `Tx` (the statements a write
transaction may run, `transaction`); the protocol above is written once, here,
in `TurnProtocol`, which `base.ThreadStorage` extends with the rest of the
interface. The claim keeper is handed in (`open_storage` builds it) and knows
the storage only as `claims.Leases`, so `claims` imports nothing of this module.
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from agent.config import AgentSettings, MultitaskStrategy
from agent.errors import ThreadBusy, ThreadNotFound, TurnCancelled, UserBeingDeleted, shown_id
from agent.storage.claims import Claim, ClaimAttempt, ClaimKeeper, UserClaim
from agent.storage.records import owned_by
from agent.storage.transaction import Tx

#: Offers older than this are deleted with the next settled offer on their thread (their steering request died).
STEER_ROW_TTL_SECONDS = 24 * 3600


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
        user_claim: UserClaim | None = None,
        steer: tuple[str, bytes] | None = None,
        abandoned: threading.Event | None = None,
    ) -> Claim:
        """Claim `thread_id` for one turn, and read its record and the turn's start, without holding a connection.

        Args:
            thread_id: the thread; it need not exist yet.
            user_id: the caller; a thread owned by someone else is never claimed.
            checkpoint_id: the checkpoint the turn starts from; None: the head.
            strategy: when another turn holds the thread: `reject` raises at once;
                `enqueue` waits up to `timeout` seconds, behind the turns already
                waiting (arrival order); `interrupt` and `rollback` first ask the
                running turn to stop, then wait like `enqueue`; `steer` waits like
                `enqueue` and offers `steer` to the running turn when no waiter is
                ahead (module docstring), then waits for the claim without a timeout.
            timeout: seconds to wait (not `reject`).
            idempotency_key: stored with the claim, so a retry can tell that its original is still running.
            read_start: False: do not read the start checkpoint (`Claim.start` is None), for work
                that needs only the thread record (the retention sweep's deletions).
            user_claim: the deletion of `user_id`'s data this claim is part of: its own claims are
                the only ones that user claim lets through.
            steer: with `strategy="steer"`, the serialized messages to offer (`serde.dumps_typed`).
            abandoned: set when the caller no longer wants the claim (its task was cancelled while it waited:
                a client that left, a queued background run cancelled): the wait ends at once, its place in
                the thread's queue given up.

        Returns:
            The claim; it is renewed until `commit` or `release`. `Claim.steered_into` is set when `steer`
            was offered to a running turn (the caller then settles the offer: `drop_steer`).

        Raises:
            ThreadNotFound: the thread belongs to another user (worded as if it did not exist).
            ThreadBusy: another turn holds the thread, or turns wait for it (`reject`), or it stayed
                busy for `timeout` seconds.
            UserBeingDeleted: `delete_user_data` is deleting `user_id`'s data; nothing was written.
            TurnCancelled: `abandoned` was set while the claim waited; nothing was claimed.
            StorageUnavailable: the database failed; nothing was written.
        """
        self.setup()
        token = uuid.uuid4().hex
        waits = strategy != "reject"
        deadline = time.monotonic() + (timeout if waits else 0.0)
        delay = 0.005
        asked_to_stop = False
        steered_into: str | None = None
        queued = False  # whether an attempt may have taken a ticket in the thread's queue
        try:
            while True:
                attempt = self._try_claim(
                    thread_id,
                    token,
                    user_id=user_id,
                    checkpoint_id=checkpoint_id,
                    idempotency_key=idempotency_key,
                    read_start=read_start,
                    queue=waits,
                    user_claim=user_claim.token if user_claim is not None else None,
                )
                if attempt.claim is not None:
                    attempt.claim.waited = queued  # an earlier attempt found the thread busy
                    queued = False  # the claim's round trip took this turn out of the queue
                    attempt.claim.steered_into = steered_into
                    self.keeper.add(attempt.claim)
                    return attempt.claim
                if attempt.user_being_deleted:
                    raise UserBeingDeleted(
                        f"The data of user {user_id!r} is being deleted (delete_user_data); the request on thread "
                        f"{thread_id!r} was refused and nothing was written.",
                        thread_id=thread_id,
                        user_id=user_id,
                    )
                if attempt.record is not None and not owned_by(attempt.record, user_id):
                    raise ThreadNotFound(f"Thread {shown_id(thread_id)} was not found.", thread_id=thread_id)
                queued = waits  # refused as busy: the attempt took a ticket (or renewed its own)
                if strategy in ("interrupt", "rollback") and not asked_to_stop:
                    # Asked once: the turn running now. Waiting turns are not cancelled; they then
                    # run one after another, as under `enqueue`.
                    self.request_cancel(thread_id, strategy)
                    asked_to_stop = True
                if strategy == "steer" and steer is not None and steered_into is None:
                    steered_into = self._offer_steer(thread_id, token, steer)
                    if steered_into is not None:
                        deadline = float("inf")  # the running turn may commit the messages: wait for the answer
                        local = self.keeper.local(thread_id)
                        if local is not None and local.token == steered_into:
                            local.steer_offered = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if not waits:
                        raise ThreadBusy(f"Thread {thread_id!r} is busy with another turn.", thread_id=thread_id)
                    raise ThreadBusy(
                        f"Thread {thread_id!r} stayed busy for {timeout} s; the turn was not run.", thread_id=thread_id
                    )
                if abandoned is None:
                    time.sleep(min(delay, remaining))
                elif abandoned.wait(min(delay, remaining)):
                    raise TurnCancelled(
                        f"The turn waiting for thread {thread_id!r} was cancelled; nothing was written.", thread_id=thread_id
                    )
                delay = min(delay * 2, 0.1)
        finally:
            if queued:
                self._leave_queue_quietly(thread_id, token)

    def _leave_queue_quietly(self, thread_id: str, token: str) -> None:
        """Give up a place in the thread's queue. Never raises: a place not given up expires after `lease_seconds`."""
        try:
            self._leave_queue(thread_id, token)
        except Exception:  # noqa: BLE001 - the database is unreachable; the ticket expires on its own
            pass

    def drop_steer(self, claim: Claim) -> None:
        """Delete the messages `claim`'s request offered to a running turn (`Claim.steered_into`), now settled.

        Raises:
            StorageUnavailable: the database failed.
        """
        self._drop_steer(claim.thread_id, claim.token)

    def commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        """In one transaction: check that `claim` still holds its thread, run `apply`, release the claim.

        Raises:
            LeaseExpired: the claim expired and another turn took the thread; nothing was written.
            IdempotencyKeyTaken: `apply` stored a response under a key another request stored first;
                nothing was written.
            ThreadExists: `apply` wrote a checkpoint whose id another thread holds (a checkpoint id names
                one thread: `ThreadStorage.thread_of_checkpoint`); nothing was written.
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
        user_claim: UserClaim | None = None,
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
            user_claim=user_claim,
        )
        try:
            yield claim
        finally:
            if self.keeper.holds(claim):
                self.release(claim)

    # -- a user's data ---------------------------------------------------------------------------------
    def user_lease_seconds(self) -> float:
        """How long a `UserClaim` lasts unrenewed: `renew_user_claim` runs before each thread of a deletion,
        whose longest step is waiting for one thread (`enqueue_timeout`) and committing (`lease_seconds`)."""
        return self.settings.enqueue_timeout + self.settings.lease_seconds

    @contextmanager
    def user_claimed(self, user_id: str) -> Iterator[UserClaim]:
        """Hold all of `user_id`'s data for the block (a deletion): every other claim for that user is refused
        meanwhile (`UserBeingDeleted`); claims made with `user_claim=` the held claim are let through.

        The claim is a lease of `user_lease_seconds`, kept by `renew_user_claim`, so a process that dies
        mid-deletion frees the user after at most that long. Released when the block ends.

        Raises:
            UserBeingDeleted: another deletion holds the user.
            StorageUnavailable: the database failed.
        """
        self.setup()
        held = UserClaim(user_id, uuid.uuid4().hex)
        self.renew_user_claim(held)
        try:
            yield held
        finally:
            try:
                self._release_user(held)
            except Exception:  # noqa: BLE001 - unreachable: the lease expires on its own
                pass

    def renew_user_claim(self, held: UserClaim) -> None:
        """Extend `held` by `user_lease_seconds` (taking it again if it expired and nobody else took it).

        Raises:
            UserBeingDeleted: another deletion holds the user.
            StorageUnavailable: the database failed.
        """
        if not self._claim_user(held, self.user_lease_seconds()):
            raise UserBeingDeleted(
                f"The data of user {held.user_id!r} is already being deleted by another request; nothing was deleted "
                "by this one.",
                user_id=held.user_id,
            )

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
        queue: bool = False,
        user_claim: str | None = None,
    ) -> ClaimAttempt:
        """One attempt, in one round trip (see `claim` and the module docstring).

        Refused while a live waiter holds a smaller ticket than this token's (any, if it has none),
        and while a `UserClaim` on `user_id` other than the one whose token is `user_claim` is held.
        With `queue`, a refusal because the thread is busy gives the token a ticket if it has none;
        every attempt renews the token's ticket and the claim removes it.
        """

    @abstractmethod
    def _leave_queue(self, thread_id: str, token: str) -> None:
        """Remove the token's ticket from the thread's queue (a waiter that gave up)."""

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

    @abstractmethod
    def _offer_steer(self, thread_id: str, token: str, steer: tuple[str, bytes]) -> str | None:
        """In one statement: store `steer` (serde type, bytes) under `token`, bound to the thread's unexpired
        claim, unless a live waiter holds a smaller ticket than `token`'s; the claim's token, or None (not
        stored: no running turn, or waiters ahead)."""

    @abstractmethod
    def steered_messages(self, thread_id: str, target: str) -> list[tuple[str, str, bytes]]:
        """The offers bound to the claim whose token is `target`, oldest first: (offer token, serde type, bytes).

        Raises:
            StorageUnavailable: the database failed.
        """

    @abstractmethod
    def _drop_steer(self, thread_id: str, token: str) -> None:
        """Delete the offer made under `token` (and offers on the thread older than `STEER_ROW_TTL_SECONDS`,
        left by steering requests whose process died)."""

    @abstractmethod
    def _claim_user(self, held: UserClaim, seconds: float) -> bool:
        """Write or extend `held` for `seconds` unless another unexpired user claim holds its user; whether it
        holds now. On Postgres under the exclusive advisory lock of the user (see the module docstring)."""

    @abstractmethod
    def _release_user(self, held: UserClaim) -> None:
        """Delete `held` (if it still holds its user)."""

    @abstractmethod
    def claimed_threads_of_user(self, user_id: str) -> list[str]:
        """The threads (sorted) that an unexpired claim made for `user_id` holds now (turns running for the user,
        on new threads too)."""
