"""SQLite backend (`sqlite:///path`, and `memory://`): LangGraph's `SqliteSaver` on one connection.

Design notes:

* **The embedded default.** No server, one file under `./.agent/`. `memory://`
  is the same code on an in-process `:memory:` database, so notebooks and
  benchmarks exercise the real storage path without a file.
* **The same turn protocol as Postgres** (`base`): a claim row in
  `agent_claims` with a token, a fencing number and an expiry, renewed while
  the turn runs, so it works across processes sharing the file and frees a
  crashed process's threads after `lease_seconds`. Expiry uses this machine's
  clock (a SQLite file is shared only on one machine). Waiting turns poll with
  backoff, so they are not served in arrival order.
* **Short transactions.** The claim (with the reads of the record and the
  start) and the commit (fencing check, writes, head, release) are each one
  `BEGIN IMMEDIATE` transaction; nothing is held while the model runs.
* **Schema.** `MIGRATIONS` is an ordered list applied with `PRAGMA
  user_version` (a migration's position + 1 is its version), like Postgres's
  migrations table. `setup()` also checks that every table exists and
  re-applies the migrations if one was dropped.
* The connection is in autocommit mode (`isolation_level=None`), so
  `SqliteSaver`'s own commits are no-ops and transactions are explicit.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from agent.config import AgentSettings
from agent.errors import LeaseExpired, StorageUnavailable
from agent.storage.base import Claim, ThreadRecord, ThreadStorage, Turn, Tx
from agent.storage.saver import TurnSaverMixin

# Each migration is a list of statements; migration i brings the file to user_version i + 1.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE IF NOT EXISTS agent_threads (
            thread_id TEXT PRIMARY KEY,
            user_id TEXT,
            head_checkpoint_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agent_threads_user_id_idx ON agent_threads (user_id)",
    ],
    [
        "ALTER TABLE agent_threads ADD COLUMN title TEXT",
        "ALTER TABLE agent_threads ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE agent_threads ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agent_threads ADD COLUMN forked_from TEXT",
        "ALTER TABLE agent_threads ADD COLUMN ttl_seconds REAL",
        "CREATE INDEX IF NOT EXISTS agent_threads_activity_idx ON agent_threads (user_id, updated_at DESC, thread_id DESC)",
        "CREATE INDEX IF NOT EXISTS agent_threads_updated_at_idx ON agent_threads (updated_at)",
    ],
    [
        # The first release's lease table, replaced by agent_claims.
        "DROP TABLE IF EXISTS agent_thread_locks",
        """CREATE TABLE IF NOT EXISTS agent_claims (
            thread_id TEXT PRIMARY KEY,
            token TEXT NOT NULL,
            fence INTEGER NOT NULL,
            expires_at REAL NOT NULL,
            idempotency_key TEXT,
            cancel TEXT
        )""",
        """CREATE TABLE IF NOT EXISTS agent_idempotency (
            user_key TEXT NOT NULL,
            key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            response TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (user_key, key)
        )""",
        "CREATE INDEX IF NOT EXISTS agent_idempotency_thread_idx ON agent_idempotency (thread_id)",
    ],
]

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = ("checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency")

# Claims the thread unless an unexpired claim holds it or the thread belongs to another user
# (the rule of `base.owned_by`); `changes()` tells whether it did.
CLAIM_SQL = """
INSERT INTO agent_claims AS c (thread_id, token, fence, expires_at, idempotency_key, cancel)
SELECT :thread_id, :token, 1, :expires_at, :key, NULL
WHERE NOT EXISTS (SELECT 1 FROM agent_threads t WHERE t.thread_id = :thread_id AND t.user_id IS NOT :user_id)
ON CONFLICT (thread_id) DO UPDATE
SET token = excluded.token, fence = c.fence + 1, expires_at = excluded.expires_at,
    idempotency_key = excluded.idempotency_key, cancel = NULL
WHERE c.expires_at < :now OR c.token = excluded.token
"""
CLAIM_FENCE_SQL = "SELECT fence FROM agent_claims WHERE thread_id = ? AND token = ?"
RELEASE_CLAIM_SQL = """
UPDATE agent_claims SET token = '', expires_at = -1, cancel = NULL, idempotency_key = NULL
WHERE thread_id = ? AND token = ?
"""
DROP_CLAIM_SQL = "DELETE FROM agent_claims WHERE thread_id = ? AND token = ?"
REQUEST_CANCEL_SQL = "UPDATE agent_claims SET cancel = ? WHERE thread_id = ? AND token <> '' AND expires_at >= ?"
RENEW_CLAIM_SQL = "UPDATE agent_claims SET expires_at = ? WHERE thread_id = ? AND token = ? RETURNING thread_id, cancel"
CANCEL_OF_SQL = "SELECT cancel FROM agent_claims WHERE thread_id = ? AND token = ? AND cancel IS NOT NULL"
THREAD_COLUMNS = (
    "thread_id, user_id, head_checkpoint_id, title, metadata, message_count, forked_from, ttl_seconds, "
    "created_at, updated_at"
)
SELECT_THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM agent_threads WHERE thread_id = ?"
UPSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = excluded.head_checkpoint_id,
    message_count = excluded.message_count, updated_at = excluded.updated_at
"""
CHECKPOINT_IN_THREAD_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND (? IS NULL OR checkpoint_id < ?)
ORDER BY checkpoint_id DESC LIMIT ?
"""
SELECT_THREAD_MESSAGES_SQL = "SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = ? ORDER BY thread_id"
# A thread's token usage (summed over the checkpoints' `usage`) and one checkpoint's `branch_usage`.
# SqliteSaver stores metadata as JSON bytes: a BLOB, which json_extract would read as binary JSONB.
TOKEN_USAGE_SQL = """
SELECT coalesce(sum(json_extract(CAST(metadata AS TEXT), '$.usage.input_tokens')), 0),
    coalesce(sum(json_extract(CAST(metadata AS TEXT), '$.usage.output_tokens')), 0),
    coalesce(max(checkpoint_id = ?), 0),
    max(CASE WHEN checkpoint_id = ? THEN json_extract(CAST(metadata AS TEXT), '$.branch_usage') END)
FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''
"""
DELETE_THREAD_SQL = [
    "DELETE FROM writes WHERE thread_id = ?",
    "DELETE FROM checkpoints WHERE thread_id = ?",
    "DELETE FROM agent_idempotency WHERE thread_id = ?",
    "DELETE FROM agent_threads WHERE thread_id = ?",
    # Only a released claim: the deleting operation's own claim is released by its commit first.
    "DELETE FROM agent_claims WHERE thread_id = ? AND token = ''",
]


class TurnSqliteSaver(TurnSaverMixin, SqliteSaver):
    """`SqliteSaver` with turn buffering, message deltas and summaries."""

    def __init__(self, conn: sqlite3.Connection, *, message_cache_size: int) -> None:
        SqliteSaver.__init__(self, conn)
        self._init_turns(message_cache_size)
        # Set while this OS thread holds `self.lock` inside an explicit transaction.
        self._in_transaction = threading.local()

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


class SqliteTx(Tx):
    """The statements of one write transaction, on the saver's connection."""

    def __init__(self, cur: sqlite3.Cursor, saver: TurnSqliteSaver) -> None:
        self.cur = cur
        self.saver = saver

    def write_turn(self, turn: Turn) -> None:
        self.saver.write_turn(turn)

    def upsert_thread(self, thread_id: str, *, user_id: str | None, head_checkpoint_id: str, message_count: int) -> None:
        now = time.time()
        self.cur.execute(UPSERT_THREAD_SQL, (thread_id, user_id, head_checkpoint_id, message_count, now, now))

    def delete_thread(self, thread_id: str) -> None:
        for statement in DELETE_THREAD_SQL:
            self.cur.execute(statement, (thread_id,))


class SqliteThreadStorage(ThreadStorage):
    """SQLite storage for one agent; `path` is a file, or `":memory:"` for `memory://`."""

    def __init__(self, path: str, settings: AgentSettings) -> None:
        super().__init__(settings)
        self.path = path
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
        self._ready = False

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        with self._errors(), self.saver.lock:
            self.saver.setup()
            conn = self.saver.conn
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            self._migrate(conn, start=version)
            if self._missing_tables(conn):
                self._migrate(conn, start=0)
        self._ready = True

    @staticmethod
    def _migrate(conn: sqlite3.Connection, *, start: int) -> None:
        for index in range(start, len(MIGRATIONS)):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[index]:
                    try:
                        conn.execute(statement)
                    except sqlite3.OperationalError as exc:
                        # Re-applying after a dropped table: SQLite has no ADD COLUMN IF NOT EXISTS.
                        if "duplicate column name" not in str(exc):
                            raise
                conn.execute(f"PRAGMA user_version = {index + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @staticmethod
    def _missing_tables(conn: sqlite3.Connection) -> list[str]:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return [table for table in TABLES if table not in present]

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
    def _try_claim(self, thread_id, token, *, user_id, checkpoint_id, idempotency_key):
        now = time.time()
        params = {
            "thread_id": thread_id,
            "token": token,
            "user_id": user_id,
            "expires_at": now + self.settings.lease_seconds,
            "key": idempotency_key,
            "now": now,
        }
        with self._errors(), self.saver.transaction() as cur:
            cur.execute(CLAIM_SQL, params)
            fence_row = cur.execute(CLAIM_FENCE_SQL, (thread_id, token)).fetchone()
            record = _record(cur.execute(SELECT_THREAD_SQL, (thread_id,)).fetchone())
            start = None
            start_id = checkpoint_id or (record.head_checkpoint_id if record else None)
            if fence_row is not None and start_id is not None:
                config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": start_id}}
                start = self.saver._backend_get_tuple(config)
        if fence_row is None:
            return None, record
        claim = Claim(
            thread_id=thread_id,
            user_id=user_id,
            token=token,
            fence=fence_row[0],
            record=record,
            start=start,
            idempotency_key=idempotency_key,
        )
        return claim, record

    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        with self._errors(), self.saver.transaction() as cur:
            if cur.execute(RELEASE_CLAIM_SQL, (claim.thread_id, claim.token)).rowcount != 1:
                raise LeaseExpired(
                    f"The turn's claim on thread {claim.thread_id!r} expired and another turn took the thread; "
                    "nothing was written.",
                    thread_id=claim.thread_id,
                )
            apply(SqliteTx(cur, self.saver))

    def _release(self, claim: Claim) -> None:
        statement = DROP_CLAIM_SQL if claim.record is None else RELEASE_CLAIM_SQL
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(statement, (claim.thread_id, claim.token))

    def _request_cancel(self, thread_id: str, mode: str) -> None:
        with self._errors(), self.saver.cursor() as cur:
            cur.execute(REQUEST_CANCEL_SQL, (mode, thread_id, time.time()))

    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        expires = time.time() + self.settings.lease_seconds
        held: dict[str, str | None] = {}
        with self._errors(), self.saver.transaction() as cur:
            for claim in claims:
                row = cur.execute(RENEW_CLAIM_SQL, (expires, claim.thread_id, claim.token)).fetchone()
                if row is not None:
                    held[row[0]] = row[1]
        return held

    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        found: dict[str, str] = {}
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            for claim in claims:
                row = cur.execute(CANCEL_OF_SQL, (claim.thread_id, claim.token)).fetchone()
                if row is not None:
                    found[claim.thread_id] = row[0]
        return found

    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        self.setup()
        with self._errors(), self.saver.transaction() as cur:
            return apply(SqliteTx(cur, self.saver))

    # -- reads -------------------------------------------------------------------------------
    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        self.setup()
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return _record(cur.execute(SELECT_THREAD_SQL, (thread_id,)).fetchone())

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        self.setup()
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return cur.execute(CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)).fetchone() is not None

    def get_checkpoint(self, thread_id: str, checkpoint_id: str):
        self.setup()
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
        with self._errors():
            return self.saver._backend_get_tuple(config)

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None) -> list[dict]:
        self.setup()
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            rows = cur.execute(LIST_CHECKPOINTS_SQL, (thread_id, before, before, limit)).fetchall()
        return [
            {"checkpoint_id": cid, "parent_checkpoint_id": parent, "metadata": json.loads(meta)}
            for cid, parent, meta in rows
        ]

    def threads_of_user(self, user_id: str) -> list[str]:
        self.setup()
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            return [row[0] for row in cur.execute(SELECT_USER_THREADS_SQL, (user_id,))]

    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        self.setup()
        with self._errors(), self.saver.cursor(transaction=False) as cur:
            inputs, outputs, found, branch = cur.execute(TOKEN_USAGE_SQL, (checkpoint_id, checkpoint_id, thread_id)).fetchone()
        if not found:
            return None
        return {"input_tokens": int(inputs), "output_tokens": int(outputs)}, json.loads(branch) if branch else None

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                self._ready = False  # the next request runs setup, which re-creates what is missing
            raise StorageUnavailable(f"SQLite database {self.path!r} failed: {exc}; nothing was written.") from None


def _record(row: Sequence[Any] | None) -> ThreadRecord | None:
    if row is None:
        return None
    thread_id, user_id, head, title, metadata, count, forked_from, ttl, created, updated = row
    return ThreadRecord(
        thread_id=thread_id,
        user_id=user_id,
        head_checkpoint_id=head,
        title=title,
        metadata=json.loads(metadata) if metadata else {},
        message_count=count,
        forked_from=json.loads(forked_from) if forked_from else None,
        ttl_seconds=ttl,
        created_at=_iso(created),
        updated_at=_iso(updated),
    )


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat() if epoch is not None else None
