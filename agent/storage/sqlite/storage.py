"""`SqliteThreadStorage`: the storage on SQLite: setup, the turn protocol's hooks, the commit, and the reads.

Every claim, commit and release is one `BEGIN IMMEDIATE` transaction on the
saver's one connection, under its lock (see the package docstring); the
statements are in `sql` and `reads`, the schema in `schema`, the write
transaction's statements in `transaction.SqliteTx`. `cursor` is the door other
code (long-term memory) uses to run inside the write transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.config import AgentSettings
from agent.errors import LeaseExpired, StorageUnavailable
from agent.storage import search, staging, summaries
from agent.storage.base import ThreadStorage
from agent.storage.claims import Claim, ClaimAttempt, ClaimKeeper, UserClaim
from agent.storage.records import (
    BranchRecord,
    CheckpointLink,
    ExpiredThread,
    IdempotencyKeyTaken,
    IdempotencyState,
    SearchCandidate,
    ThreadRecord,
    owned_by,
)
from agent.storage.sqlite import branches, reads, schema, sql
from agent.storage.sqlite.saver import TurnSqliteSaver
from agent.storage.sqlite.transaction import SqliteTx, epoch
from agent.storage.transaction import Tx
from agent.storage.turns import STEER_ROW_TTL_SECONDS


#: The longest busy timeout SQLite takes (milliseconds in a C int), for `statement_timeout_ms=0`.
MAX_BUSY_SECONDS = (2**31 - 1) / 1000

#: The page size of a new database file, in bytes. SQLite's default, 4 kB, holds one checkpoint row of a
#: turn of short messages (about 2 kB: the turn's new messages, its versions, its summary) per page and
#: leaves the rest of the page empty, since a row smaller than a page is never split across pages: that
#: was over a kilobyte of every turn. At 16 kB a page holds several rows; larger pages would make every
#: commit write more. It applies to files created from now on (an existing file keeps its page size
#: until a `VACUUM`, which the agent never runs on its own).
PAGE_SIZE = 16384


class SqliteThreadStorage(ThreadStorage):
    """SQLite storage for one agent; `path` is a file (its directory is created), or `":memory:"` for
    `memory://`; `keeper` renews its claims (`agent.storage.open_storage` builds both)."""

    def __init__(self, path: str, settings: AgentSettings, *, keeper: ClaimKeeper) -> None:
        super().__init__(settings, keeper=keeper)
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # statement_timeout_ms bounds the wait for another process's write lock (0: as long as SQLite allows).
        busy = settings.statement_timeout_ms / 1000 if settings.statement_timeout_ms else MAX_BUSY_SECONDS
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=busy)
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a no-op on a file that already has tables
            if path != ":memory:":
                # WAL + NORMAL: durable across application crashes; a power loss
                # may drop the last turns (https://www.sqlite.org/wal.html).
                conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"Cannot open SQLite database {path!r}: {exc}") from None
        self.saver = TurnSqliteSaver(
            conn, self, message_cache_size=settings.message_cache_size, time_limit_ms=settings.statement_timeout_ms
        )
        self._ready = False

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        with self._errors(), self.saver.lock:
            self.saver.setup()
            conn = self.saver.conn
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            schema.migrate(conn, start=version, where=f"SQLite database {self.path!r}")
            schema.migrate_store(conn, everything=False)
            if schema.missing_tables(conn):
                self.saver.is_setup = False  # LangGraph's own tables too, if one of them was dropped
                self.saver.setup()
                schema.migrate(conn, start=0, where=f"SQLite database {self.path!r}")
                schema.migrate_store(conn, everything=True)
        self._ready = True

    def _close(self) -> None:
        with self.saver.lock:  # not while another thread is inside a statement
            self.saver.conn.close()

    def ready(self) -> bool:
        """Whether the database answers a query now. Never raises."""
        try:
            with self.saver.cursor(transaction=False) as cur:
                cur.execute("SELECT 1")
        except sqlite3.Error:
            return False
        return True

    # -- the turn protocol -----------------------------------------------------------------
    def _try_claim(
        self, thread_id, token, *, user_id, checkpoint_id, idempotency_key, read_start=True, queue=False, user_claim=None
    ):
        now = time.time()
        params = {
            "thread_id": thread_id,
            "token": token,
            "user_id": user_id,
            "expires_at": now + self.settings.lease_seconds,
            "key": idempotency_key,
            "now": now,
            "user_claim": user_claim,
        }

        def attempt():
            # One BEGIN IMMEDIATE transaction: the same steps, in the same order, as Postgres's agent_claim_turn.
            with self.saver.transaction() as cur:
                deleting = user_id is not None and cur.execute(sql.USER_BEING_DELETED_SQL, params).fetchone() is not None
                ticket = cur.execute(sql.RENEW_TICKET_SQL, params).fetchone()
                fence_row = None
                if not deleting:
                    cur.execute(sql.CLAIM_SQL, {**params, "ticket": ticket[0] if ticket else None})
                    fence_row = cur.execute(sql.CLAIM_FENCE_SQL, (thread_id, token)).fetchone()
                record = reads.get_thread(cur, thread_id, self.keyring)
                if fence_row is not None:
                    cur.execute(sql.DONE_WAITING_SQL, params)
                elif queue and ticket is None and not deleting and (record is None or owned_by(record, user_id)):
                    cur.execute(sql.TAKE_TICKET_SQL, params)
                start = None
                start_id = checkpoint_id or (record.head_checkpoint_id if record else None)
                if fence_row is not None and start_id is not None and read_start:
                    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": start_id}}
                    start = self.saver.agent_tuple(self.saver._backend_get_tuple(config))
            return fence_row, deleting, record, start

        fence_row, deleting, record, start = self._repairing(attempt)
        if fence_row is None:
            return ClaimAttempt(None, record, deleting)
        claim = Claim(
            thread_id=thread_id,
            user_id=user_id,
            token=token,
            fence=fence_row[0],
            record=record,
            start=start,
            idempotency_key=idempotency_key,
        )
        return ClaimAttempt(claim, record)

    def _leave_queue(self, thread_id: str, token: str) -> None:
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(sql.LEAVE_QUEUE_SQL, (thread_id, token))

    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        try:
            with staging.scope() as staged:
                with self._errors(), self.saver.transaction() as cur:
                    if cur.execute(sql.RELEASE_CLAIM_SQL, (claim.thread_id, claim.token)).rowcount != 1:
                        raise LeaseExpired(
                            f"The turn's claim on thread {claim.thread_id!r} expired and another turn took the "
                            "thread; nothing was written.",
                            thread_id=claim.thread_id,
                        )
                    apply(SqliteTx(cur, self.saver))
                staged.publish()
        except sqlite3.IntegrityError as exc:
            if "agent_idempotency" not in str(exc):
                raise
            raise IdempotencyKeyTaken(claim.thread_id) from None

    def try_release(self, claim: Claim) -> None:
        statement = sql.DROP_CLAIM_SQL if claim.record is None else sql.RELEASE_CLAIM_SQL
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(statement, (claim.thread_id, claim.token))

    def _request_cancel(self, thread_id: str, mode: str) -> None:
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(sql.REQUEST_CANCEL_SQL, (mode, thread_id, time.time()))

    def _offer_steer(self, thread_id: str, token: str, steer: tuple[str, bytes]) -> str | None:
        params = {"thread_id": thread_id, "token": token, "type": steer[0], "payload": steer[1], "now": time.time()}
        with self._errors(), self.saver.transaction() as cur:
            row = cur.execute(sql.OFFER_STEER_SQL, params).fetchone()
        return None if row is None else row[0]

    def steered_messages(self, thread_id: str, target: str) -> list[tuple[str, str, bytes]]:
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return [(row[0], row[1], bytes(row[2])) for row in cur.execute(sql.STEERED_MESSAGES_SQL, (thread_id, target))]

    def _drop_steer(self, thread_id: str, token: str) -> None:
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(sql.DROP_STEER_SQL, (thread_id, token, time.time() - STEER_ROW_TTL_SECONDS))

    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        expires = time.time() + self.settings.lease_seconds
        held: dict[str, str | None] = {}
        with self._errors(), self.saver.transaction() as cur:
            for claim in claims:
                row = cur.execute(sql.RENEW_CLAIM_SQL, (expires, claim.thread_id, claim.token)).fetchone()
                if row is not None:
                    held[row[0]] = row[1]
        return held

    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        found: dict[str, str] = {}
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            for claim in claims:
                row = cur.execute(sql.CANCEL_OF_SQL, (claim.thread_id, claim.token)).fetchone()
                if row is not None:
                    found[claim.thread_id] = row[0]
        return found

    def _claim_user(self, held: UserClaim, seconds: float) -> bool:
        now = time.time()
        params = {"user_id": held.user_id, "token": held.token, "expires_at": now + seconds, "now": now}
        with self._errors(), self.saver.transaction() as cur:
            return cur.execute(sql.CLAIM_USER_SQL, params).fetchone() is not None

    def _release_user(self, held: UserClaim) -> None:
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(sql.RELEASE_USER_SQL, (held.user_id, held.token))

    def claimed_threads_of_user(self, user_id: str) -> list[str]:
        rows = self._read(lambda cur: cur.execute(sql.CLAIMED_THREADS_OF_USER_SQL, (user_id, time.time())).fetchall())
        return [row[0] for row in rows]

    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        now = time.time()
        # The claim before the result, as on Postgres (agent.storage.postgres.reads): the reads are not one
        # snapshot, and the commit that stores the result releases the claim.
        running, stored = self._read(
            lambda cur: (
                cur.execute(sql.RUNNING_WITH_KEY_SQL, (claim_key, now)).fetchone(),
                cur.execute(sql.FIND_IDEMPOTENCY_SQL, (user_key, key, now)).fetchone(),
            )
        )
        return IdempotencyState(
            request_hash=stored[0] if stored else None,
            thread_id=stored[1] if stored else None,
            response=self.keyring.open_json(json.loads(stored[2]), what="A stored response") if stored else None,
            running_thread_id=running[0] if running else None,
        )

    def sweep_idempotency(self) -> int:
        self.setup()
        with self._errors(), self.saver.cursor() as cur:
            return cur.execute(sql.SWEEP_IDEMPOTENCY_SQL, (time.time(),)).rowcount

    def expired_threads(self, *, default_ttl, now, limit, after=None, trimmable_only=False) -> list[ExpiredThread]:
        after_ts, after_id = after if after is not None else (None, None)
        params = {
            "ttl": default_ttl,
            "now": epoch(now),
            "clock": time.time(),
            "after_ts": after_ts,
            "after_id": after_id,
            "trimmable": trimmable_only,
            "limit": limit,
        }
        rows = self._read(lambda cur: cur.execute(sql.EXPIRED_THREADS_SQL, params).fetchall())
        return [ExpiredThread(thread_id, user_id, (updated_at, thread_id)) for thread_id, user_id, updated_at in rows]

    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        self.setup()
        with staging.scope() as staged:
            with self._errors(), self.saver.transaction() as cur:
                result = apply(SqliteTx(cur, self.saver))
            staged.publish()
            return result

    @contextmanager
    def cursor(self, *, write: bool = True) -> Iterator[sqlite3.Cursor]:
        """A cursor on the storage's one connection, under its lock, after setup: inside the write transaction
        running on this thread (a commit's `apply`, `transaction`) when there is one, so its statements commit or
        roll back with it; else, with `write`, in a `BEGIN IMMEDIATE` transaction of its own, or without
        `write` on the autocommit connection. For code that keeps rows beside the checkpoints (long-term memory).

        Raises:
            StorageUnavailable: SQLite failed inside the block (the running transaction rolls back with it).
        """
        self.setup()
        with self._errors():
            if write and not self.saver.in_transaction:
                with self.saver.transaction() as cur:
                    yield cur
            else:
                with self.saver.cursor(transaction=False) as cur:
                    yield cur

    # -- reads -------------------------------------------------------------------------------
    def _read(self, work: Callable[[sqlite3.Cursor], Any]) -> Any:
        def attempt():
            with self.saver.cursor(transaction=False) as cur:
                return work(cur)

        return self._repairing(attempt)

    def _repairing(self, work: Callable[[], Any]) -> Any:
        """`work()` (after setup); once more after re-creating the tables if one was missing."""
        with self._errors():
            for attempt in (1, 2):
                self.setup()
                try:
                    return work()
                except sqlite3.OperationalError as exc:
                    if attempt == 2 or "no such table" not in str(exc):
                        raise
                    self._ready = False
        raise AssertionError("unreachable")

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        return self._read(lambda cur: reads.get_thread(cur, thread_id, self.keyring))

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        return self._read(lambda cur: reads.checkpoint_in_thread(cur, thread_id, checkpoint_id))

    def get_checkpoint(self, thread_id: str, checkpoint_id: str):
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
        return self._repairing(lambda: self.saver.agent_tuple(self.saver._backend_get_tuple(config)))

    def get_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]):
        return [found for found in (self.get_checkpoint(thread_id, c) for c in sorted(set(checkpoint_ids))) if found]

    def list_checkpoints(self, thread_id: str, *, limit: int | None, before: str | None, previews: bool = True) -> list[dict]:
        rows = self._read(lambda cur: reads.list_checkpoints(cur, thread_id, limit=limit, before=before, keyring=self.keyring))
        return self.fill_previews(thread_id, rows) if previews else rows

    def fill_previews(self, thread_id: str, rows: list[dict]) -> list[dict]:
        return self._repairing(lambda: self.saver.agent_rows(thread_id, rows))

    def task_paths(self, thread_id: str, checkpoint_id: str) -> dict[str, str]:
        return dict(self._read(lambda cur: cur.execute(sql.TASK_PATHS_SQL, (thread_id, checkpoint_id)).fetchall()))

    def checkpoint_links(self, thread_id: str) -> list[CheckpointLink]:
        rows = self._read(lambda cur: cur.execute(sql.CHECKPOINT_LINKS_SQL, (thread_id,)).fetchall())
        return [CheckpointLink(cid, parent, count or 0, kept, trailing or 0) for cid, parent, count, kept, trailing in rows]

    def threads_of_user(self, user_id: str) -> list[str]:
        return self._read(lambda cur: reads.threads_of_user(cur, user_id))

    def branch_records(self, thread_id: str) -> dict[str, BranchRecord]:
        return self._read(lambda cur: branches.branch_records(cur, thread_id, self.keyring))

    def search_candidates(self, user_id: str | None, words: list[str]) -> list[SearchCandidate]:
        return self._read(lambda cur: branches.search_candidates(cur, user_id, search.query_keys(words)))

    def unindexed_threads(self, after: str | None, limit: int) -> list[str]:
        return self._read(lambda cur: [row[0] for row in cur.execute(branches.UNINDEXED_SQL, (after or "", limit)).fetchall()])

    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        params = {"checkpoint_id": checkpoint_id}
        row = self._read(lambda cur: cur.execute(sql.THREAD_OF_CHECKPOINT_SQL, params).fetchone())
        return row[0] if row else None

    def list_threads(self, user_id, *, limit, before, metadata):
        return self._read(
            lambda cur: reads.list_threads(cur, user_id, limit=limit, before=before, metadata=metadata, keyring=self.keyring)
        )

    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        return self._read(lambda cur: reads.thread_position(cur, thread_id))

    def exists(self) -> bool:
        if self._ready:
            return True
        if self.path != ":memory:" and not Path(self.path).is_file():
            return False
        with self._errors(), self.saver.lock:
            return not schema.missing_tables(self.saver.conn)

    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        params = (checkpoint_id, checkpoint_id, thread_id)
        inputs, outputs, found, branch = self._read(lambda cur: cur.execute(sql.TOKEN_USAGE_SQL, params).fetchone())
        if not found:
            return None
        branch_usage = summaries.unpack(json.loads(branch)).get("branch_usage") if branch else None
        return {"input_tokens": int(inputs), "output_tokens": int(outputs)}, branch_usage

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                self._ready = False  # the next request runs setup, which re-creates what is missing
            # Interrupted by the saver's time limit, or a lock another process held past the busy timeout.
            limit = self.settings.statement_timeout_ms
            reason = f" (statement_timeout_ms is {limit})" if str(exc) in ("interrupted", "database is locked") else ""
            raise StorageUnavailable(
                f"SQLite database {self.path!r} failed: {exc}{reason}; nothing was written; the request can be retried."
                if reason
                else f"SQLite database {self.path!r} failed: {exc}; nothing was written."
            ) from None
