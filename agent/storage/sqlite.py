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
  migrations table; LangGraph's store tables (long-term memory) are applied
  from its own lists, recorded in its own version tables (`STORE_SCHEMA`).
  `setup()` also checks that every table exists and re-applies the migrations
  if one was dropped; a running agent that finds a table missing does the
  same and runs the claim or read again.
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
from datetime import datetime
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.store.sqlite.base import MIGRATIONS as STORE_MIGRATIONS
from langgraph.store.sqlite.base import VECTOR_MIGRATIONS as STORE_VECTOR_MIGRATIONS

from agent.config import AgentSettings
from agent.errors import LeaseExpired, StorageUnavailable
from agent.storage import deltas, sqlite_reads, summaries
from agent.storage.base import (
    CheckpointLink,
    Claim,
    ExpiredThread,
    IdempotencyKeyTaken,
    IdempotencyState,
    ThreadRecord,
    ThreadStorage,
    Turn,
    Tx,
)
from agent.storage.saver import TurnSaverMixin
from agent.storage.sqlite_reads import (  # noqa: F401 - the reads' statements, shared with SqliteReader
    CHECKPOINT_IN_THREAD_SQL,
    LIST_CHECKPOINTS_SQL,
    SELECT_THREAD_SQL,
    SELECT_USER_THREADS_SQL,
    THREAD_COLUMNS,
)
from agent.storage.sqlite_reads import record as _record  # noqa: F401

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
    [
        # A retry looks for a running turn that carries its key; the sweep deletes expired results.
        "CREATE INDEX IF NOT EXISTS agent_claims_idempotency_idx ON agent_claims (idempotency_key) WHERE idempotency_key IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS agent_idempotency_expires_idx ON agent_idempotency (expires_at)",
    ],
    [
        # An OpenAI response id is `resp_<checkpoint_id>`: finding its thread needs checkpoint_id alone.
        "CREATE INDEX IF NOT EXISTS agent_checkpoints_checkpoint_id_idx ON checkpoints (checkpoint_id)",
    ],
]

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = (
    "checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency",
    "store_migrations", "store", "vector_migrations", "store_vectors",
)  # fmt: skip

#: LangGraph's store (long-term memory, agent.memory): its migration lists and their version tables,
#: as SqliteStore.setup() applies them. The vectors table is a plain BLOB table, created always.
STORE_SCHEMA = (("store_migrations", STORE_MIGRATIONS), ("vector_migrations", STORE_VECTOR_MIGRATIONS))

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
UPSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = excluded.head_checkpoint_id,
    message_count = excluded.message_count, updated_at = excluded.updated_at
"""
# A summary field of a checkpoint's metadata in either layout (`summaries`: under SUMMARY_KEY by its short
# name, or flat in checkpoints written before). SqliteSaver stores metadata as a JSON blob: a BLOB, which
# json_extract would read as binary JSONB, so it is cast to text.
SUMMARY_FIELD = (
    "(CASE WHEN json_type(CAST(metadata AS TEXT), '$.\"{key}\"') = 'object' "
    "THEN json_extract(CAST(metadata AS TEXT), '$.\"{key}\".{short}') "
    "ELSE json_extract(CAST(metadata AS TEXT), '$.{long}') END)"
)


def summary_field(name: str, *, index: int | None = None) -> str:
    """SQL for one summary field; `index` picks input (0) or output (1) tokens of a usage field."""
    short, long = summaries.SHORT_NAMES[name], name
    if index is not None:  # packed usages are [input, output]; flat ones {"input_tokens", "output_tokens"}
        short, long = f"{short}[{index}]", f"{long}.{('input_tokens', 'output_tokens')[index]}"
    return SUMMARY_FIELD.format(key=summaries.SUMMARY_KEY, short=short, long=long)


CHECKPOINT_LINKS_SQL = f"""
SELECT checkpoint_id, parent_checkpoint_id, {summary_field("message_count")}, {summary_field("kept_messages")}
FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''
"""
THREAD_OF_CHECKPOINT_SQL = "SELECT thread_id FROM checkpoints WHERE checkpoint_id = ? AND checkpoint_ns = '' LIMIT 1"
# Leaves updated_at alone: it is the conversation's last activity (see operations.catalogue).
UPDATE_THREAD_SQL = f"""
UPDATE agent_threads SET title = COALESCE(:title, title), metadata = COALESCE(:metadata, metadata),
    ttl_seconds = COALESCE(:ttl_seconds, ttl_seconds)
WHERE thread_id = :thread_id AND user_id IS :user_id
RETURNING {THREAD_COLUMNS}
"""
SET_HEAD_SQL = "UPDATE agent_threads SET head_checkpoint_id = ?, message_count = ?, updated_at = ? WHERE thread_id = ?"
INSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, forked_from,
    created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
SELECT_THREAD_MESSAGES_SQL = "SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
THREADS_WITH_CHECKPOINTS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_id IN (SELECT value FROM json_each(?)) ORDER BY thread_id
"""
# A thread's token usage (summed over the checkpoints' `usage`) and one checkpoint's metadata (its `branch_usage`).
TOKEN_USAGE_SQL = f"""
SELECT coalesce(sum({summary_field("usage", index=0)}), 0),
    coalesce(sum({summary_field("usage", index=1)}), 0),
    coalesce(max(checkpoint_id = ?), 0),
    max(CASE WHEN checkpoint_id = ? THEN CAST(metadata AS TEXT) END)
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

# -- retention (`operations.retention`) --
# A thread's expiry: its own ttl_seconds, else the agent's thread_ttl_seconds (NULL: never); epoch seconds.
EXPIRED_CONDITION = """COALESCE(t.ttl_seconds, :ttl) IS NOT NULL
    AND t.updated_at + COALESCE(t.ttl_seconds, :ttl) <= :now"""
# Candidates only (the sweep claims each one and checks again); a thread a turn holds is left out.
EXPIRED_THREADS_SQL = f"""
SELECT t.thread_id, t.user_id, t.updated_at FROM agent_threads t
WHERE {EXPIRED_CONDITION}
  AND (:after_ts IS NULL OR t.updated_at > :after_ts OR (t.updated_at = :after_ts AND t.thread_id > :after_id))
  AND NOT EXISTS (SELECT 1 FROM agent_claims c
                  WHERE c.thread_id = t.thread_id AND c.token <> '' AND c.expires_at >= :clock)
  AND (NOT :trimmable OR EXISTS (SELECT 1 FROM checkpoints k
                                 WHERE k.thread_id = t.thread_id AND k.checkpoint_id <> t.head_checkpoint_id))
ORDER BY t.updated_at, t.thread_id
LIMIT :limit
"""
IS_EXPIRED_SQL = f"SELECT 1 FROM agent_threads t WHERE t.thread_id = :thread_id AND {EXPIRED_CONDITION}"
SELECT_HEAD_ROW_SQL = """
SELECT type, checkpoint, metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?
"""
UPDATE_HEAD_ROW_SQL = """
UPDATE checkpoints SET parent_checkpoint_id = NULL, type = ?, checkpoint = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?
"""
DELETE_OTHER_WRITES_SQL = "DELETE FROM writes WHERE thread_id = ? AND NOT (checkpoint_ns = '' AND checkpoint_id = ?)"
DELETE_OTHER_ROOT_CHECKPOINTS_SQL = "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id <> ?"
DELETE_NAMESPACED_CHECKPOINTS_SQL = "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns <> ''"
# -- the saver's thread operations (`saver.TurnSaverMixin`: prune, copy_thread, delete_for_runs) --
SELECT_CHECKPOINT_ROW_SQL = """
SELECT type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
REWRITE_CHECKPOINT_SQL = """
UPDATE checkpoints SET parent_checkpoint_id = ?, type = ?, checkpoint = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
THREAD_HAS_ROWS_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = ? LIMIT 1"
BUSY_THREAD_SQL = "SELECT 1 FROM agent_claims WHERE thread_id = ? AND token <> '' AND expires_at >= ?"
THREADS_OF_RUNS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints
WHERE json_extract(CAST(metadata AS TEXT), '$.run_id') IN (SELECT value FROM json_each(?)) ORDER BY thread_id
"""
COPY_THREAD_SQL = [
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
    FROM checkpoints WHERE thread_id = :source""",
    """INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
    SELECT :target, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
    FROM writes WHERE thread_id = :source""",
]
# `keep` is a JSON array of [checkpoint_ns, checkpoint_id] pairs.
KEPT_PAIRS = "(SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keep))"
DELETE_UNKEPT_SQL = [
    f"DELETE FROM writes WHERE thread_id = :thread_id AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}",
    f"DELETE FROM checkpoints WHERE thread_id = :thread_id AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}",
]


FIND_IDEMPOTENCY_SQL = """
SELECT request_hash, thread_id, response FROM agent_idempotency WHERE user_key = ? AND key = ? AND expires_at > ?
"""
RUNNING_WITH_KEY_SQL = """
SELECT thread_id FROM agent_claims WHERE idempotency_key = ? AND token <> '' AND expires_at >= ? LIMIT 1
"""
DELETE_EXPIRED_KEY_SQL = "DELETE FROM agent_idempotency WHERE user_key = ? AND key = ? AND expires_at <= ?"
# A plain INSERT: an unexpired row with the same key fails the commit (IntegrityError).
STORE_RESPONSE_SQL = """
INSERT INTO agent_idempotency (user_key, key, request_hash, thread_id, response, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
SWEEP_IDEMPOTENCY_SQL = "DELETE FROM agent_idempotency WHERE expires_at <= ?"


class TurnSqliteSaver(TurnSaverMixin, SqliteSaver):
    """`SqliteSaver` with turn buffering, message deltas and summaries."""

    def __init__(self, conn: sqlite3.Connection, storage: SqliteThreadStorage, *, message_cache_size: int) -> None:
        SqliteSaver.__init__(self, conn)
        self._storage = storage
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

    def upsert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title=None, metadata=None) -> None:
        now = time.time()
        self.cur.execute(
            UPSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, title, json.dumps(dict(metadata or {})), now, now),
        )

    def update_thread(self, thread_id, *, user_id, title, metadata, ttl_seconds) -> ThreadRecord | None:
        params = {
            "thread_id": thread_id,
            "user_id": user_id,
            "title": title,
            "metadata": json.dumps(dict(metadata)) if metadata is not None else None,
            "ttl_seconds": ttl_seconds,
        }
        return _record(self.cur.execute(UPDATE_THREAD_SQL, params).fetchone())

    def delete_thread(self, thread_id: str) -> None:
        for statement in DELETE_THREAD_SQL:
            self.cur.execute(statement, (thread_id,))

    def store_response(self, user_key, key, *, request_hash, thread_id, response, ttl_seconds) -> None:
        now = time.time()
        self.cur.execute(DELETE_EXPIRED_KEY_SQL, (user_key, key, now))
        self.cur.execute(
            STORE_RESPONSE_SQL, (user_key, key, request_hash, thread_id, json.dumps(response), now, now + ttl_seconds)
        )

    def set_head(self, thread_id: str, head_checkpoint_id: str, *, message_count: int) -> None:
        self.cur.execute(SET_HEAD_SQL, (head_checkpoint_id, message_count, time.time(), thread_id))

    def insert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title, metadata, forked_from):
        now = time.time()
        forked = json.dumps(dict(forked_from)) if forked_from is not None else None
        self.cur.execute(
            INSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, title, json.dumps(dict(metadata)), forked, now, now),
        )


    def is_expired(self, thread_id: str, *, default_ttl: float | None, now: datetime | None) -> bool:
        params = {"thread_id": thread_id, "ttl": default_ttl, "now": _epoch(now)}
        return self.cur.execute(IS_EXPIRED_SQL, params).fetchone() is not None

    def keep_only_head(self, thread_id: str, head) -> int:
        head_id = head.config["configurable"]["checkpoint_id"]
        row = self.cur.execute(SELECT_HEAD_ROW_SQL, (thread_id, head_id)).fetchone()
        if row is None:
            return 0
        type_, blob, metadata = row
        # SqliteSaver keeps channel values inside the checkpoint: store the head's messages whole
        # there (its base checkpoints are about to go, see `deltas`), and make it a root.
        checkpoint = self.saver.serde.loads_typed((type_, blob))
        messages = head.checkpoint["channel_values"].get("messages")
        if messages is not None and "messages" in checkpoint["channel_values"]:
            checkpoint["channel_values"]["messages"] = deltas.encode(list(messages), None, ())
        summary = summaries.with_fields(json.loads(metadata) if metadata is not None else {}, kept_messages=0)
        type_, blob = self.saver.serde.dumps_typed(checkpoint)
        self.cur.execute(
            UPDATE_HEAD_ROW_SQL, (type_, blob, json.dumps(summary, ensure_ascii=False).encode(), thread_id, head_id)
        )
        self.cur.execute(DELETE_OTHER_WRITES_SQL, (thread_id, head_id))
        removed = self.cur.execute(DELETE_OTHER_ROOT_CHECKPOINTS_SQL, (thread_id, head_id)).rowcount
        self.cur.execute(DELETE_NAMESPACED_CHECKPOINTS_SQL, (thread_id,))
        return removed

    def thread_record(self, thread_id: str) -> ThreadRecord | None:
        return sqlite_reads.get_thread(self.cur, thread_id)

    def thread_has_rows(self, thread_id: str) -> bool:
        return self.cur.execute(THREAD_HAS_ROWS_SQL, (thread_id,)).fetchone() is not None

    def busy_threads(self, thread_ids: Sequence[str]) -> list[str]:
        now = time.time()
        return sorted(t for t in set(thread_ids) if self.cur.execute(BUSY_THREAD_SQL, (t, now)).fetchone())

    def threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        return [row[0] for row in self.cur.execute(THREADS_OF_RUNS_SQL, (json.dumps(list(run_ids)),)).fetchall()]

    def copy_thread_rows(self, source_thread_id: str, target_thread_id: str) -> None:
        for statement in COPY_THREAD_SQL:
            self.cur.execute(statement, {"source": source_thread_id, "target": target_thread_id})

    def rewrite_checkpoint(self, thread_id, tup, *, parent_id, metadata) -> None:
        configurable = tup.config["configurable"]
        address = (thread_id, configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"])
        row = self.cur.execute(SELECT_CHECKPOINT_ROW_SQL, address).fetchone()
        if row is None:
            return
        # SqliteSaver keeps channel values inside the serialized checkpoint.
        checkpoint = self.saver.serde.loads_typed(row)
        messages = tup.checkpoint["channel_values"].get("messages")
        if deltas.is_message_list(messages) and "messages" in checkpoint["channel_values"]:
            checkpoint["channel_values"]["messages"] = deltas.encode(list(messages), None, ())
        type_, blob = self.saver.serde.dumps_typed(checkpoint)
        encoded = json.dumps(dict(metadata), ensure_ascii=False).encode()
        self.cur.execute(REWRITE_CHECKPOINT_SQL, (parent_id, type_, blob, encoded, *address))

    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        params = {"thread_id": thread_id, "keep": json.dumps([list(pair) for pair in keep])}
        for statement in DELETE_UNKEPT_SQL:
            self.cur.execute(statement, params)


def _epoch(now: datetime | None) -> float:
    return time.time() if now is None else now.timestamp()


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
        self.saver = TurnSqliteSaver(conn, self, message_cache_size=settings.message_cache_size)
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
            self._migrate_store(conn, everything=False)
            if self._missing_tables(conn):
                self.saver.is_setup = False  # LangGraph's own tables too, if one of them was dropped
                self.saver.setup()
                self._migrate(conn, start=0)
                self._migrate_store(conn, everything=True)
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
    def _migrate_store(conn: sqlite3.Connection, *, everything: bool) -> None:
        """Apply LangGraph's store migrations not yet recorded (all of them if `everything`), one transaction."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table, migrations in STORE_SCHEMA:
                conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v INTEGER PRIMARY KEY)")
                current = -1 if everything else conn.execute(f"SELECT coalesce(max(v), -1) FROM {table}").fetchone()[0]
                for version in range(current + 1, len(migrations)):
                    try:
                        conn.execute(migrations[version])
                    except sqlite3.OperationalError as exc:
                        if "duplicate column name" not in str(exc):  # re-applied after a dropped table
                            raise
                    conn.execute(f"INSERT OR IGNORE INTO {table} (v) VALUES (?)", (version,))
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
    def _try_claim(self, thread_id, token, *, user_id, checkpoint_id, idempotency_key, read_start=True):
        now = time.time()
        params = {
            "thread_id": thread_id,
            "token": token,
            "user_id": user_id,
            "expires_at": now + self.settings.lease_seconds,
            "key": idempotency_key,
            "now": now,
        }

        def attempt():
            with self.saver.transaction() as cur:
                cur.execute(CLAIM_SQL, params)
                fence_row = cur.execute(CLAIM_FENCE_SQL, (thread_id, token)).fetchone()
                record = sqlite_reads.get_thread(cur, thread_id)
                start = None
                start_id = checkpoint_id or (record.head_checkpoint_id if record else None)
                if fence_row is not None and start_id is not None and read_start:
                    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": start_id}}
                    start = self.saver.agent_tuple(self.saver._backend_get_tuple(config))
            return fence_row, record, start

        fence_row, record, start = self._repairing(attempt)
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
        try:
            with self._errors(), self.saver.transaction() as cur:
                if cur.execute(RELEASE_CLAIM_SQL, (claim.thread_id, claim.token)).rowcount != 1:
                    raise LeaseExpired(
                        f"The turn's claim on thread {claim.thread_id!r} expired and another turn took the thread; "
                        "nothing was written.",
                        thread_id=claim.thread_id,
                    )
                apply(SqliteTx(cur, self.saver))
        except sqlite3.IntegrityError as exc:
            if "agent_idempotency" not in str(exc):
                raise
            raise IdempotencyKeyTaken(claim.thread_id) from None

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

    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        now = time.time()
        stored, running = self._read(
            lambda cur: (
                cur.execute(FIND_IDEMPOTENCY_SQL, (user_key, key, now)).fetchone(),
                cur.execute(RUNNING_WITH_KEY_SQL, (claim_key, now)).fetchone(),
            )
        )
        return IdempotencyState(
            request_hash=stored[0] if stored else None,
            thread_id=stored[1] if stored else None,
            response=json.loads(stored[2]) if stored else None,
            running_thread_id=running[0] if running else None,
        )

    def sweep_idempotency(self) -> int:
        self.setup()
        with self._errors(), self.saver.cursor() as cur:
            return cur.execute(SWEEP_IDEMPOTENCY_SQL, (time.time(),)).rowcount

    def expired_threads(self, *, default_ttl, now, limit, after=None, trimmable_only=False) -> list[ExpiredThread]:
        after_ts, after_id = after if after is not None else (None, None)
        params = {
            "ttl": default_ttl,
            "now": _epoch(now),
            "clock": time.time(),
            "after_ts": after_ts,
            "after_id": after_id,
            "trimmable": trimmable_only,
            "limit": limit,
        }
        rows = self._read(lambda cur: cur.execute(EXPIRED_THREADS_SQL, params).fetchall())
        return [ExpiredThread(thread_id, user_id, (updated_at, thread_id)) for thread_id, user_id, updated_at in rows]

    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        self.setup()
        with self._errors(), self.saver.transaction() as cur:
            return apply(SqliteTx(cur, self.saver))

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
        return self._read(lambda cur: sqlite_reads.get_thread(cur, thread_id))

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        return self._read(lambda cur: sqlite_reads.checkpoint_in_thread(cur, thread_id, checkpoint_id))

    def get_checkpoint(self, thread_id: str, checkpoint_id: str):
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
        return self._repairing(lambda: self.saver.agent_tuple(self.saver._backend_get_tuple(config)))

    def get_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]):
        return [found for found in (self.get_checkpoint(thread_id, c) for c in sorted(set(checkpoint_ids))) if found]

    def list_checkpoints(self, thread_id: str, *, limit: int | None, before: str | None) -> list[dict]:
        return self._read(lambda cur: sqlite_reads.list_checkpoints(cur, thread_id, limit=limit, before=before))

    def checkpoint_links(self, thread_id: str) -> list[CheckpointLink]:
        rows = self._read(lambda cur: cur.execute(CHECKPOINT_LINKS_SQL, (thread_id,)).fetchall())
        return [CheckpointLink(cid, parent, count or 0, kept) for cid, parent, count, kept in rows]

    def threads_of_user(self, user_id: str) -> list[str]:
        return self._read(lambda cur: sqlite_reads.threads_of_user(cur, user_id))

    def threads_with_checkpoints(self, checkpoint_ids: Sequence[str]) -> list[str]:
        ids = json.dumps(list(checkpoint_ids))
        return [row[0] for row in self._read(lambda cur: cur.execute(THREADS_WITH_CHECKPOINTS_SQL, (ids,)).fetchall())]

    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        row = self._read(lambda cur: cur.execute(THREAD_OF_CHECKPOINT_SQL, (checkpoint_id,)).fetchone())
        return row[0] if row else None

    def list_threads(self, user_id, *, limit, before, metadata):
        return self._read(lambda cur: sqlite_reads.list_threads(cur, user_id, limit=limit, before=before, metadata=metadata))

    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        return self._read(lambda cur: sqlite_reads.thread_position(cur, thread_id))

    def exists(self) -> bool:
        if self._ready:
            return True
        if self.path != ":memory:" and not Path(self.path).is_file():
            return False
        with self._errors(), self.saver.lock:
            return not self._missing_tables(self.saver.conn)

    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        params = (checkpoint_id, checkpoint_id, thread_id)
        inputs, outputs, found, branch = self._read(lambda cur: cur.execute(TOKEN_USAGE_SQL, params).fetchone())
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
            raise StorageUnavailable(f"SQLite database {self.path!r} failed: {exc}; nothing was written.") from None
