"""Retention: threads idle longer than their time to live are deleted, or cut down to their head.

A thread expires when no write has touched it (`agent_threads.updated_at`,
moved by every turn, state update and head switch) for its `ttl_seconds`
(set per thread with `update_thread`), else the agent's `thread_ttl_seconds`;
with neither it never expires. `sweep_expired_threads` then applies
`thread_ttl_strategy`:

* `delete`: every row of the thread, exactly as `delete_thread` removes it
  (`lifecycle.delete_rows`: checkpoints, blobs, writes, record, claim,
  idempotency results, its runs and their stream events, branch-scoped memories).
* `keep_latest`: the head stays, every other checkpoint goes with its blobs
  and pending writes. Messages are stored as deltas against an ancestor
  (`storage.deltas`), so the head's messages are first stored whole; the head
  then becomes a **root** (no parent checkpoint, `kept_messages` 0) rather than
  keeping the thread's old root as well: the old root holds no message, and
  keeping it would leave a parent link that skips every removed checkpoint. The
  thread stays usable: history shows the head, then whatever comes after it.
  Its `updated_at` does not move (trimming is not activity: catalogues keep
  their order), and a thread with nothing but its head is not swept again.
  Lost with the removed checkpoints: their history entries and their share of
  the thread's token usage (the head's `branch_usage` stays).

**Concurrency.** Each expired thread is claimed with the turn protocol
(`storage.base`) under `reject`: a thread a turn holds is skipped (the next
sweep sees it again if it is still expired), and of several replicas
sweeping at once exactly one claims a thread; the others skip it or, if they
come after, find it deleted (no record) or with nothing left to trim. Under
the claim, in the commit's transaction, the expiry is checked again
(`Tx.is_expired`): a turn that committed between the candidate query and the
claim has moved `updated_at`, and the thread survives. No transaction spans
more than one thread: candidates are read in batches of `BATCH_SIZE`, and each
thread costs one claim and one short commit.

**One thread never stops a sweep.** A thread whose rows the sweep cannot
handle (an error claiming, reading or removing it) is skipped: logged, counted
in the result (`failed_thread_ids`), its commit rolled back, and tried again
by the next sweep, while every other expired thread is still removed. Only
the database failing ends a sweep early: an error from the candidate query, or
`StorageUnavailable` for a thread while `storage.ready()` says the database
does not answer (telling "this thread's rows" from "the server is down" that
way costs one query, only after a failure). The candidate query itself holds
for every stored `ttl_seconds`: rows written before the 100-year bound was
enforced (`thread_values.MAX_TTL_SECONDS`) are read as at most that.

**The clock.** Expiry is judged by the clock that wrote `updated_at`: the
database's (`now()`) on Postgres, where replicas' clocks may differ, and this
machine's on SQLite. `now=` judges it as of another time instead, the same way
in the candidate query and in the re-check under the claim; tests use it to
say "ttl + 1 s later" without sleeping or editing rows. Claims are always
judged by the real clock, so a running turn is never swept, whatever `now` says.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.config import AgentSettings, ThreadTtlStrategy
from agent.errors import AgentError, InvalidRequest, StorageUnavailable, ThreadBusy, ThreadNotFound, UserBeingDeleted
from agent.operations.lifecycle import delete_rows
from agent.operations.operation import Operation, param
from agent.storage import ExpiredThread, ThreadStorage, Tx
from agent.types import SweepResult, TrimmedThread

if TYPE_CHECKING:
    from agent.memory.service import Memories
    from agent.operations.context import OperationContext

logger = logging.getLogger(__name__)

#: Expired threads read per candidate query.
BATCH_SIZE = 100


def sweep_expired_threads(
    storage: ThreadStorage,
    settings: AgentSettings,
    *,
    now: datetime | None = None,
    memories: Memories | None = None,
    stop: threading.Event | None = None,
    batch_size: int = BATCH_SIZE,
) -> SweepResult:
    """Delete (or trim, under `keep_latest`) every expired thread that no turn holds.

    Args:
        storage: the agent's storage.
        settings: `thread_ttl_seconds` (the default time to live, None: only threads with their
            own `ttl_seconds` expire) and `thread_ttl_strategy`.
        now: judge expiry as of this time (timezone-aware); None: the database's clock on
            Postgres, this machine's on SQLite.
        memories: the agent's long-term memories (branch-scoped ones of deleted threads go too).
        stop: when set, the sweep ends after the thread it is on (a server shutting down).
        batch_size: threads per candidate query.

    Returns:
        A `SweepResult`: the threads deleted, and the threads trimmed with how many checkpoints
        each lost, oldest activity first. A thread another sweeper handled, or a turn held, is in neither.
        A thread the sweep could not handle (any error while claiming or removing it, the database
        still answering) is skipped, logged as a warning and listed in `failed_thread_ids`; its
        commit rolled back, and the next sweep tries it again.

    Raises:
        InvalidRequest: `now` is a naive datetime.
        StorageUnavailable: the database failed (the candidate query, or a thread's work while the
            database no longer answers `ready()`); what was swept before stays swept.
    """
    if now is not None and now.utcoffset() is None:
        raise InvalidRequest("now must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    strategy = settings.thread_ttl_strategy
    deleted: list[str] = []
    trimmed: list[TrimmedThread] = []
    failed: list[str] = []
    after = None
    while stop is None or not stop.is_set():
        batch = storage.expired_threads(
            default_ttl=settings.thread_ttl_seconds,
            now=now,
            limit=batch_size,
            after=after,
            trimmable_only=strategy == "keep_latest",
        )
        for found in batch:
            if stop is not None and stop.is_set():
                break
            try:
                removed = _expire(storage, found, strategy, settings.thread_ttl_seconds, now, memories)
            except Exception as exc:  # noqa: BLE001 - one thread must not stop retention for every other
                if isinstance(exc, StorageUnavailable) and not storage.ready():
                    raise  # the database failed, not this thread
                _report_failure(found.thread_id, exc)
                failed.append(found.thread_id)
                continue
            if removed is None:
                continue
            if strategy == "delete":
                deleted.append(found.thread_id)
            elif removed:
                trimmed.append(TrimmedThread(found.thread_id, removed))
        if len(batch) < batch_size:
            break
        after = batch[-1].position
    return SweepResult(deleted_thread_ids=tuple(deleted), trimmed=tuple(trimmed), failed_thread_ids=tuple(failed))


def _report_failure(thread_id: str, exc: BaseException) -> None:
    """One warning per thread the sweep skipped; the traceback too when the error is not the agent's own."""
    if isinstance(exc, AgentError):
        logger.warning("Retention sweep skipped thread %r (tried again next sweep): %s", thread_id, exc.message)
    else:
        logger.warning("Retention sweep skipped thread %r (tried again next sweep)", thread_id, exc_info=exc)


def _expire(
    storage: ThreadStorage,
    found: ExpiredThread,
    strategy: ThreadTtlStrategy,
    default_ttl: float | None,
    now: datetime | None,
    memories: Memories | None,
) -> int | None:
    """Claim one candidate and, if it is still expired, apply `strategy` in the commit.

    Returns None when nothing was done (busy, gone, no longer expired); else the
    checkpoints removed (`keep_latest`) or 0 (`delete`: the thread is gone).
    """
    thread_id = found.thread_id
    outcome: list[int | None] = [None]

    def delete(tx: Tx) -> None:
        if tx.is_expired(thread_id, default_ttl=default_ttl, now=now):
            delete_rows(tx, thread_id, user_id=found.user_id, memories=memories)
            outcome[0] = 0

    try:
        # The owner's id: the claim refuses anyone else (`storage.base.owned_by`).
        with storage.claimed(
            thread_id, user_id=found.user_id, strategy="reject", timeout=0, read_start=strategy == "keep_latest"
        ) as claim:
            if claim.record is None:
                return None  # deleted since the candidate query (released, this claim leaves no row)
            if strategy == "delete":
                storage.commit(claim, delete)
            elif claim.start is not None:
                head = claim.start

                def keep_latest(tx: Tx) -> None:
                    if tx.is_expired(thread_id, default_ttl=default_ttl, now=now):
                        outcome[0] = tx.keep_only_head(thread_id, head)

                storage.commit(claim, keep_latest)
    except (ThreadBusy, ThreadNotFound, UserBeingDeleted):
        # Held by a turn or another sweeper; or (LeaseExpired) taken over mid-commit, nothing written;
        # or its owner's data is being deleted, this thread with it.
        return None
    return outcome[0]


# -- the operation ------------------------------------------------------------------------------
def _aware(name: str, value: Any) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise InvalidRequest(f"{name} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    return value


@dataclass(frozen=True, kw_only=True)
class SweepArgs:
    now: datetime | None = param(None, check=_aware)
    stop: threading.Event | None = param(None)


def sweep(context: OperationContext, args: SweepArgs) -> SweepResult:
    """Delete, or trim to their head, the threads idle longer than their time to live.

    A thread expires `ttl_seconds` (its own, set with `update_thread`, else the
    `thread_ttl_seconds` setting; neither: never) after its last write (`updated_at`).
    `thread_ttl_strategy` says what happens: `delete` (the whole thread, as `delete_thread`)
    or `keep_latest` (only the head checkpoint stays, its messages whole; the thread stays usable).
    A thread busy with a turn is skipped; replicas sweeping at once handle each thread once.

    Args:
        now: judge expiry as of this timezone-aware time instead of the database's clock
            (Postgres) or this machine's (SQLite); for tests.

    Returns:
        `{"deleted_thread_ids": [str], "trimmed": [{"thread_id": str, "removed_checkpoints": int}],
        "failed_thread_ids": [str]}`, oldest activity first; a thread the sweep could not handle is
        skipped, logged and listed in `failed_thread_ids` (the next sweep tries it again).

    Raises: `InvalidRequest` (a naive `now`), `StorageUnavailable`.
    """
    return sweep_expired_threads(context.storage, context.settings, now=args.now, memories=context.memories, stop=args.stop)


SWEEP_EXPIRED_THREADS = Operation(
    name="sweep_expired_threads",
    summary="Delete, or trim to their head, the threads idle longer than their time to live.",
    args=SweepArgs,
    run=sweep,
    positional=0,
    action=False,
    writes=True,
)
