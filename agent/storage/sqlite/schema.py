"""The SQLite schema: the agent's migrations, LangGraph's store lists beside them, and how setup applies them.

Read top to bottom, `MIGRATIONS` is the agent's schema. Each migration is a
list of statements applied in one `BEGIN IMMEDIATE` transaction, recorded with
`PRAGMA user_version` (migration i brings the file to version i + 1), as the
Postgres migrations table records its own. LangGraph's checkpoint tables are
`SqliteSaver.setup()`'s; its store tables (long-term memory) are applied from
its own lists, recorded in its own version tables (`STORE_SCHEMA`), as
`SqliteStore.setup()` would. Setup checks that every table exists and
re-applies everything if one was dropped.
"""

from __future__ import annotations

import sqlite3

from langgraph.store.sqlite.base import MIGRATIONS as STORE_MIGRATIONS
from langgraph.store.sqlite.base import VECTOR_MIGRATIONS as STORE_VECTOR_MIGRATIONS

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
    [
        # Waiting turns in arrival order, and deleting a user's data while turns may start (see
        # `storage.turns`): a claim records its user, so a deletion finds the turns running for that user.
        "ALTER TABLE agent_claims ADD COLUMN user_id TEXT",
        "CREATE INDEX IF NOT EXISTS agent_claims_user_id_idx ON agent_claims (user_id) WHERE user_id IS NOT NULL",
        # The turns waiting for a busy thread; the smallest live ticket is served next. A new rowid is
        # larger than every rowid in the table, which is all the order needs.
        """CREATE TABLE IF NOT EXISTS agent_claim_waiters (
            ticket INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            token TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agent_claim_waiters_thread_idx ON agent_claim_waiters (thread_id, ticket)",
        # A deletion's hold on all of one user's data (a lease, like a claim).
        """CREATE TABLE IF NOT EXISTS agent_user_claims (
            user_id TEXT PRIMARY KEY,
            token TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
    ],
]

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = (
    "checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency",
    "agent_claim_waiters", "agent_user_claims", "store_migrations", "store", "vector_migrations", "store_vectors",
)  # fmt: skip

#: LangGraph's store (long-term memory, agent.memory): its migration lists and their version tables,
#: as SqliteStore.setup() applies them. The vectors table is a plain BLOB table, created always.
STORE_SCHEMA = (("store_migrations", STORE_MIGRATIONS), ("vector_migrations", STORE_VECTOR_MIGRATIONS))

TABLE_NAMES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table'"


def missing_tables(conn: sqlite3.Connection) -> list[str]:
    """Those of `TABLES` that do not exist (read only)."""
    present = {row[0] for row in conn.execute(TABLE_NAMES_SQL)}
    return [table for table in TABLES if table not in present]


def migrate(conn: sqlite3.Connection, *, start: int) -> None:
    """Apply the agent's migrations from index `start` (the file's `user_version`), each in its own transaction."""
    for index in range(start, len(MIGRATIONS)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[index]:
                _apply(conn, statement)
            conn.execute(f"PRAGMA user_version = {index + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def migrate_store(conn: sqlite3.Connection, *, everything: bool) -> None:
    """Apply LangGraph's store migrations not yet recorded (all of them if `everything`), in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, migrations in STORE_SCHEMA:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v INTEGER PRIMARY KEY)")
            current = -1 if everything else conn.execute(f"SELECT coalesce(max(v), -1) FROM {table}").fetchone()[0]
            for version in range(current + 1, len(migrations)):
                _apply(conn, migrations[version])
                conn.execute(f"INSERT OR IGNORE INTO {table} (v) VALUES (?)", (version,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _apply(conn: sqlite3.Connection, statement: str) -> None:
    try:
        conn.execute(statement)
    except sqlite3.OperationalError as exc:
        # Re-applying after a dropped table: SQLite has no ADD COLUMN IF NOT EXISTS.
        if "duplicate column name" not in str(exc):
            raise
