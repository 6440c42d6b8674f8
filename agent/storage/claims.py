"""A turn's `Claim` on its thread, the `ClaimKeeper` that renews the claims of this process's running turns, and
a deletion's `UserClaim` on all of one user's data (see `turns` for both protocols).

The keeper knows the database only as `Leases` (renew, poll, release), and
`open_storage` builds it and hands it to the storage it opens: so this module
needs nothing of `base`, and a test can give a storage a keeper of its own.

One daemon thread per storage, alive only while a turn runs. Every
`lease_seconds / 3` it extends every held claim's lease in one statement;
every `CANCEL_POLL_SECONDS` it asks the database whether a newer turn (possibly
in another process) asked one of them to stop (`interrupt` / `rollback`). A
claim found gone (it expired and another turn took the thread) or asked to
stop is signalled (`Claim.signal`), so the running turn can stop early.

Both are one query for all of this process's running turns, whatever their
number, so hundreds of concurrent turns cost a few queries per second.

A release that failed (the database was unreachable) is retried here every
cycle until it succeeds, so a thread whose turn failed during an outage is
free again as soon as the database is back, not `lease_seconds` later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from agent.storage.records import ThreadRecord

if TYPE_CHECKING:  # LangGraph is imported by the backends; read-only commands never load it
    from langgraph.checkpoint.base import CheckpointTuple

logger = logging.getLogger(__name__)

#: How often running turns look for a cancel request from another process, in seconds.
CANCEL_POLL_SECONDS = 0.5


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
    #: A `steer` request's claim: the token of the running turn its messages were offered to, while it waited
    #: (None: not offered; see `turns`, "Steering").
    steered_into: str | None = None
    #: Set when a `steer` request in this process offered messages to this running turn, so that the turn
    #: looks for them before its first model call too (later calls always look).
    steer_offered: bool = False
    #: Set when the thread was busy at the first attempt and the claim came after waiting (other turns
    #: may have committed meanwhile: what was read before the claim is not current).
    waited: bool = False
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
class UserClaim:
    """A deletion's hold on all of one user's data (`TurnProtocol.user_claimed`): while it is held, no other
    claim for `user_id` is given (a turn, a fork, an import, another deletion), except the deletion's own."""

    user_id: str
    token: str


class ClaimAttempt(NamedTuple):
    """One claim attempt's answer (`TurnProtocol._try_claim`): the claim, or None if refused; the thread's record."""

    claim: Claim | None
    record: ThreadRecord | None
    #: Refused because a deletion of the caller's data holds the user (`UserClaim`), not because of the thread.
    user_being_deleted: bool = False


class Leases(Protocol):
    """What the keeper asks of the database: the three statements of a lease (`ThreadStorage` has them)."""

    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        """Extend the claims' leases; {thread_id: cancel request or None} for the claims still held."""

    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        """{thread_id: "interrupt" | "rollback"} for the claims a newer turn asked to stop."""

    def try_release(self, claim: Claim) -> None:
        """Release `claim` once; raises when the database cannot be reached."""


class ClaimKeeper:
    """Keeps this process's claims alive. Thread-safe; the thread starts with the first claim.

    Built by `open_storage` with the storage's `lease_seconds`; the storage binds itself with `keep_for`.
    """

    def __init__(self, *, lease_seconds: float) -> None:
        self._leases: Leases | None = None
        self._renew_every = lease_seconds / 3
        self._claims: dict[str, Claim] = {}
        self._unreleased: list[Claim] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False

    def keep_for(self, leases: Leases) -> None:
        """Renew and release through `leases` (the storage this keeper serves); once, before the first claim.

        Raises:
            RuntimeError: the keeper already serves another storage.
        """
        if self._leases is not None and self._leases is not leases:
            raise RuntimeError("a ClaimKeeper serves one storage")
        self._leases = leases

    def add(self, claim: Claim) -> None:
        # No wake-up: nothing is due for a claim just taken, and polling at once cost every turn a query.
        with self._lock:
            self._claims[claim.thread_id] = claim
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="tt-claim-keeper", daemon=True)
                self._thread.start()

    def remove(self, claim: Claim) -> None:
        with self._lock:
            if self._claims.get(claim.thread_id) is claim:
                del self._claims[claim.thread_id]

    def release_later(self, claim: Claim) -> None:
        """Retry releasing `claim` (whose release failed) every cycle until it succeeds."""
        with self._lock:
            self._unreleased.append(claim)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="tt-claim-keeper", daemon=True)
                self._thread.start()
            self._wake.notify()

    def holds(self, claim: Claim) -> bool:
        """Whether `claim` is still one of this process's running claims (not yet committed or released)."""
        with self._lock:
            return self._claims.get(claim.thread_id) is claim

    def local(self, thread_id: str) -> Claim | None:
        """This process's running claim on `thread_id`, if any."""
        with self._lock:
            return self._claims.get(thread_id)

    def close(self) -> None:
        """Stop renewing; wait for a renewal in progress to finish, then try once more to release the claims
        whose release failed (the storage closes its connections next). Without that last try, a turn stopped
        as its process shuts down (`serving.drain`) whose release met a busy database left its thread claimed
        until the lease expired."""
        with self._lock:
            self._closed = True
            self._claims.clear()
            unreleased, self._unreleased = self._unreleased, []
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        if unreleased and self._leases is not None:
            self._release(unreleased)  # a failure now is left to the lease

    def _run(self) -> None:
        next_renewal = time.monotonic() + self._renew_every
        last_cycle = time.monotonic()
        while True:
            with self._lock:
                if not self._closed:
                    self._wake.wait(max(0.0, last_cycle + CANCEL_POLL_SECONDS - time.monotonic()))
                if self._closed:
                    return
                claims = list(self._claims.values())
                unreleased, self._unreleased = self._unreleased, []
            if unreleased:
                self._release(unreleased)
            if time.monotonic() - last_cycle < CANCEL_POLL_SECONDS:
                continue  # woken early (release_later): the cancel poll and the renewal keep their pace
            last_cycle = time.monotonic()
            if not claims:
                next_renewal = last_cycle + self._renew_every
                continue
            try:
                if time.monotonic() >= next_renewal:
                    held = self._leases.renew(claims)
                    next_renewal = time.monotonic() + self._renew_every
                    for claim in claims:
                        if claim.thread_id not in held:
                            if self.holds(claim):  # not committed meanwhile
                                claim.signal(lost=True)
                        elif held[claim.thread_id]:
                            claim.signal(cancel=held[claim.thread_id])
                else:
                    for thread_id, mode in self._leases.poll_cancels(claims).items():
                        claim = self.local(thread_id)
                        if claim is not None:
                            claim.signal(cancel=mode)
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the keeper; the lease has slack
                logger.warning("Could not renew the claims of %d running turn(s)", len(claims), exc_info=True)

    def _release(self, claims: list[Claim]) -> None:
        failed = []
        for claim in claims:
            try:
                self._leases.try_release(claim)
            except Exception:  # noqa: BLE001 - still unreachable: next cycle
                failed.append(claim)
        if failed:
            with self._lock:
                if not self._closed:
                    self._unreleased.extend(failed)
