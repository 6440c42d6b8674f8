"""SQLite backend (`sqlite:///path`, and `memory://`): LangGraph's `SqliteSaver` on one connection.

Design notes:

* **The embedded default.** No server, one file under `./.agent/`. `memory://`
  is the same code on an in-process `:memory:` database, so notebooks and
  benchmarks exercise the real storage path without a file.
* **Thread locks are leases.** SQLite has no advisory locks, and holding a
  write transaction while the chat model runs would stop every other thread.
  A turn instead claims a row in `agent_thread_locks` (owner token, expiry),
  which works across processes sharing the file. A process that dies holding
  a lease blocks that thread until `sqlite_lease_seconds` pass. Under
  `enqueue` a waiting turn polls with backoff; waiters are not served in
  arrival order (Postgres's are).
* **One short transaction per turn.** The turn's buffered writes, the head and
  the owner are written in one `BEGIN IMMEDIATE` transaction, which first
  checks that the lease is still ours.
* The connection is in autocommit mode (`isolation_level=None`), so
  `SqliteSaver`'s own commits are no-ops and transactions are explicit.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from agent.config import AgentSettings
from agent.errors import StorageUnavailable, ThreadBusy
from agent.storage.base import Store, ThreadRecord, Turn, TurnSaverMixin

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS agent_threads (
    thread_id TEXT PRIMARY KEY,
    user_id TEXT,
    head_checkpoint_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_threads_user_id_idx ON agent_threads (user_id);
CREATE TABLE IF NOT EXISTS agent_thread_locks (
    thread_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""
# Claims the lease when it is free or expired; `changes()` tells whether it did.
CLAIM_LOCK_SQL = """
INSERT INTO agent_thread_locks (thread_id, owner, expires_at) VALUES (?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE agent_thread_locks.expires_at < ?
"""
RELEASE_LOCK_SQL = "DELETE FROM agent_thread_locks WHERE thread_id = ? AND owner = ?"
LOCK_OWNER_SQL = "SELECT owner FROM agent_thread_locks WHERE thread_id = ?"
SELECT_THREAD_SQL = "SELECT thread_id, user_id, head_checkpoint_id FROM agent_threads WHERE thread_id = ?"
UPSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = excluded.head_checkpoint_id, updated_at = excluded.updated_at
"""
CHECKPOINT_IN_THREAD_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND (? IS NULL OR checkpoint_id < ?)
ORDER BY checkpoint_id DESC LIMIT ?
"""
SELECT_THREAD_MESSAGES_SQL = "SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = ? ORDER BY thread_id"
DELETE_THREAD_SQL = [
    "DELETE FROM writes WHERE thread_id = ?",
    "DELETE FROM checkpoints WHERE thread_id = ?",
    "DELETE FROM agent_threads WHERE thread_id = ?",
]


class TurnSqliteSaver(TurnSaverMixin, SqliteSaver):
    """`SqliteSaver` with turn buffering, message deltas and summaries."""

    def __init__(self, conn: sqlite3.Connection, *, message_cache_size: int) -> None:
        SqliteSaver.__init__(self, conn)
        self._init_turns(message_cache_size)
        # Set while this OS thread holds `self.lock` inside an explicit transaction.
        self._in_transaction = threading.local()

    def setup(self) -> None:
        if self.is_setup:
            return
        SqliteSaver.setup(self)
        self.conn.executescript(SCHEMA_SQL)

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        if getattr(self._in_transaction, "active", False):
            cur = self.conn.cursor()
            try:
                yield cur
            finally:
                cur.close()
            return
        with SqliteSaver.cursor(self, transaction) as cur:
            yield cur

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """One `BEGIN IMMEDIATE` transaction; the saver's own queries inside it join it."""
        with self.lock:
            self.setup()
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            self._in_transaction.active = True
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            finally:
                self._in_transaction.active = False
                cur.close()

    def _backend_get_tuple(self, config):
        return self._resolve_tuple(SqliteSaver.get_tuple(self, config))

    def list(self, config, *, filter=None, before=None, limit=None):
        # SqliteSaver.list yields while holding `self.lock`; resolving a delta
        # may query, so read everything first.
        found = list(SqliteSaver.list(self, config, filter=filter, before=before, limit=limit))
        return iter([self._resolve_tuple(tup) for tup in found])

    def _backend_put(self, config, checkpoint, metadata, new_versions):
        return SqliteSaver.put(self, config, checkpoint, metadata, new_versions)

    def _backend_put_writes(self, config, writes, task_id, task_path):
        return SqliteSaver.put_writes(self, config, writes, task_id, task_path)

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:
        with self.cursor(transaction=False) as cur:
            rows = cur.execute(SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns)).fetchall()
        return {
            checkpoint_id: self.serde.loads_typed((type_, blob))["channel_values"].get("messages")
            for checkpoint_id, type_, blob in rows
        }


class SqliteStore(Store):
    """SQLite storage for one agent; `path` is a file, or `":memory:"` for `memory://`."""

    def __init__(self, path: str, settings: AgentSettings) -> None:
        self.path = path
        self.settings = settings
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            if path != ":memory:":
                # WAL + NORMAL: durable across application crashes; a power loss
                # may drop the last turns (https://www.sqlite.org/wal.html).
                conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"Cannot open SQLite database {path!r}: {exc}") from None
        self.saver = TurnSqliteSaver(conn, message_cache_size=settings.message_cache_size)

    def setup(self) -> None:
        with self._errors(), self.saver.cursor():
            pass  # SqliteSaver.cursor() runs setup() once.

    def close(self) -> None:
        self.saver.conn.close()

    # -- turns -----------------------------------------------------------------
    @contextmanager
    def turn(
        self, thread_id: str, *, user_id: str | None, strategy: str, timeout: float, checkpoint_id: str | None = None
    ) -> Iterator[Turn]:
        with self._errors():
            owner = self._claim(thread_id, strategy, timeout)
        released = False
        try:
            record = self.get_thread(thread_id)
            turn = Turn(thread_id=thread_id, user_id=user_id, lock=owner, record=record)
            start_id = checkpoint_id or (record.head_checkpoint_id if record else None)
            if start_id is not None:
                config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": start_id}}
                with self._errors():
                    start = self.saver._backend_get_tuple(config)
                if start is not None:
                    turn.loaded[start_id] = start
            with self.saver.buffering(turn):
                yield turn
            # The writes, the head and the lock's release commit together, after
            # the buffer is unregistered: a turn of this process waiting for the
            # lease registers its own buffer as soon as the lease is released.
            with self._errors(), self.saver.transaction() as cur:
                self._check_still_ours(cur, thread_id, owner)
                if turn.puts:
                    self.saver.write_turn(turn)
                    now = time.time()
                    cur.execute(UPSERT_THREAD_SQL, (thread_id, user_id, turn.new_head, now, now))
                cur.execute(RELEASE_LOCK_SQL, (thread_id, owner))
            released = True
        finally:
            if not released:
                with self._errors(), self.saver.cursor() as cur:
                    cur.execute(RELEASE_LOCK_SQL, (thread_id, owner))

    def _claim(self, thread_id: str, strategy: str, timeout: float) -> str:
        owner = uuid.uuid4().hex
        deadline = time.monotonic() + (timeout if strategy == "enqueue" else 0.0)
        delay = 0.002
        while True:
            now = time.time()
            with self.saver.cursor() as cur:
                cur.execute(CLAIM_LOCK_SQL, (thread_id, owner, now + self.settings.sqlite_lease_seconds, now))
                if cur.rowcount == 1:
                    return owner
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if strategy == "reject":
                    raise ThreadBusy(f"Thread {thread_id!r} is busy with another turn.", thread_id=thread_id)
                raise ThreadBusy(
                    f"Thread {thread_id!r} stayed busy for {timeout} s; the turn was not run.", thread_id=thread_id
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)

    @staticmethod
    def _check_still_ours(cur: sqlite3.Cursor, thread_id: str, owner: str) -> None:
        row = cur.execute(LOCK_OWNER_SQL, (thread_id,)).fetchone()
        if row is None or row[0] != owner:
            raise ThreadBusy(
                f"The lock on thread {thread_id!r} expired while the turn ran (raise sqlite_lease_seconds); "
                "nothing was written.",
                thread_id=thread_id,
            )

    # -- reads -------------------------------------------------------------------
    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            row = cur.execute(SELECT_THREAD_SQL, (thread_id,)).fetchone()
        return ThreadRecord(*row) if row else None

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return cur.execute(CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)).fetchone() is not None

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None) -> list[dict]:
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            rows = cur.execute(LIST_CHECKPOINTS_SQL, (thread_id, before, before, limit)).fetchall()
        return [
            {"checkpoint_id": cid, "parent_checkpoint_id": parent, "metadata": json.loads(meta)}
            for cid, parent, meta in rows
        ]

    def threads_of_user(self, user_id: str) -> list[str]:
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return [row[0] for row in cur.execute(SELECT_USER_THREADS_SQL, (user_id,))]

    def delete_thread(self, thread_id: str, *, check: Callable[[ThreadRecord | None], object]) -> None:
        with self.turn(thread_id, user_id=None, strategy="enqueue", timeout=self.settings.enqueue_timeout) as turn:
            check(turn.record)
            with self._errors(), self.saver.transaction() as cur:
                for sql in DELETE_THREAD_SQL:
                    cur.execute(sql, (thread_id,))
        self.saver.message_cache.clear()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(f"SQLite database {self.path!r} failed: {exc}; nothing was written.") from None
