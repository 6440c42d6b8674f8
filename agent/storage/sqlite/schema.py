"""The SQLite schema: the agent's migrations, LangGraph's store lists beside them, and how setup applies them.

Read top to bottom, `MIGRATIONS` is the agent's schema. Each migration is a
list of statements applied in one `BEGIN IMMEDIATE` transaction, recorded with
`PRAGMA user_version` (migration i brings the file to version i + 1), as the
Postgres migrations table records its own. LangGraph's checkpoint tables are
`SqliteSaver.setup()`'s; its store tables (long-term memory) are applied from
its own lists, recorded in its own version tables (`STORE_SCHEMA`), as
`SqliteStore.setup()` would. Setup checks that every table exists and
re-applies everything if one was dropped.

Checkpoint ids name one thread through `agent_checkpoint_ids`, whose primary
key is the checkpoint id, for the reasons the Postgres schema gives ("Checkpoint
ids" in `agent.storage.postgres.schema`; here, on top of them, `SqliteSaver.put`
is an `INSERT OR REPLACE`, which would make a unique index on `checkpoints`
delete the other thread's row instead of failing). `TurnSqliteSaver` registers
each root-namespace checkpoint it writes, in the checkpoint's transaction; the
statements that delete checkpoints delete their rows; a migration registers the
stored checkpoints after `refuse_duplicate_checkpoint_ids` found no id two
threads hold (copies by LangGraph's `copy_thread` aside, as on Postgres).
SQLite has no `CREATE INDEX CONCURRENTLY`, and needs none: one writer at a time
holds the file anyway.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from langgraph.store.sqlite.base import MIGRATIONS as STORE_MIGRATIONS
from langgraph.store.sqlite.base import VECTOR_MIGRATIONS as STORE_VECTOR_MIGRATIONS

from agent.storage import records

# The checkpoints (root namespace) no row of agent_checkpoint_ids names yet, with their thread; a copy LangGraph's
# copy_thread made (its record's forked_from names a thread holding the same id) is left out: the id stays the source's.
UNREGISTERED_CHECKPOINTS_SQL = """
SELECT c.checkpoint_id, c.thread_id FROM checkpoints c
WHERE c.checkpoint_ns = ''
  AND NOT EXISTS (SELECT 1 FROM agent_checkpoint_ids r WHERE r.checkpoint_id = c.checkpoint_id)
  AND NOT EXISTS (
    SELECT 1 FROM agent_threads t JOIN checkpoints s ON s.thread_id = json_extract(t.forked_from, '$.thread_id')
    WHERE t.thread_id = c.thread_id AND s.thread_id <> c.thread_id
      AND s.checkpoint_ns = '' AND s.checkpoint_id = c.checkpoint_id)
"""
# The SELECT's WHERE clause keeps SQLite from reading ON CONFLICT as a join's ON (https://sqlite.org/lang_upsert.html).
REGISTER_STORED_CHECKPOINTS_SQL = f"""
INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) {UNREGISTERED_CHECKPOINTS_SQL}
ON CONFLICT (checkpoint_id) DO NOTHING
"""
# The first few ids more than one thread holds, each with its threads (a JSON array), and how many there are.
DUPLICATE_CHECKPOINT_IDS_SQL = f"""
SELECT checkpoint_id, json_group_array(thread_id) AS thread_ids, count(*) OVER () AS total
FROM ({UNREGISTERED_CHECKPOINTS_SQL}) GROUP BY checkpoint_id HAVING count(*) > 1 ORDER BY checkpoint_id LIMIT ?
"""

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
    [
        # The thread each checkpoint id names, unique by this primary key (see the module docstring).
        """CREATE TABLE IF NOT EXISTS agent_checkpoint_ids (
            checkpoint_id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agent_checkpoint_ids_thread_idx ON agent_checkpoint_ids (thread_id)",
        # Rows whose checkpoint is gone go (re-applied after a dropped table), then the stored checkpoints are
        # registered; `migrate` first refuses ids that two threads hold (`refuse_duplicate_checkpoint_ids`).
        """DELETE FROM agent_checkpoint_ids WHERE NOT EXISTS (
            SELECT 1 FROM checkpoints c WHERE c.thread_id = agent_checkpoint_ids.thread_id AND c.checkpoint_ns = ''
              AND c.checkpoint_id = agent_checkpoint_ids.checkpoint_id)""",
        REGISTER_STORED_CHECKPOINTS_SQL,
    ],
    [
        # Branch records (`agent.operations.branch_records`): rows only for checkpoints a user labelled,
        # pinned or archived, so a turn writes none. At most one pinned checkpoint per thread.
        """CREATE TABLE IF NOT EXISTS agent_branches (
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            label TEXT,
            pinned INTEGER NOT NULL DEFAULT 0,
            archived INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (thread_id, checkpoint_id)
        )""",
        "CREATE UNIQUE INDEX IF NOT EXISTS agent_branches_pinned_idx ON agent_branches (thread_id) WHERE pinned",
        # The message search index (`agent.storage.search`): one row per checkpoint; FTS5 indexes its body
        # with the row table as its content (https://sqlite.org/fts5.html#external_content_tables), so the
        # text is stored once, and triggers keep the two in step.
        """CREATE TABLE IF NOT EXISTS agent_message_text (
            id INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            message_ids TEXT NOT NULL,
            body TEXT NOT NULL,
            UNIQUE (thread_id, checkpoint_id)
        )""",
        """CREATE VIRTUAL TABLE IF NOT EXISTS agent_message_fts USING fts5(
            body, content='agent_message_text', content_rowid='id', tokenize='unicode61')""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_text_ai AFTER INSERT ON agent_message_text BEGIN
            INSERT INTO agent_message_fts (rowid, body) VALUES (new.id, new.body);
        END""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_text_ad AFTER DELETE ON agent_message_text BEGIN
            INSERT INTO agent_message_fts (agent_message_fts, rowid, body) VALUES ('delete', old.id, old.body);
        END""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_text_au AFTER UPDATE ON agent_message_text BEGIN
            INSERT INTO agent_message_fts (agent_message_fts, rowid, body) VALUES ('delete', old.id, old.body);
            INSERT INTO agent_message_fts (rowid, body) VALUES (new.id, new.body);
        END""",
    ],
    [
        # Steering (`multitask_strategy="steer"`, see `storage.turns`): messages offered to a running turn
        # (`target`: its claim's token) by a request waiting for the thread (`token`: its own), read in `id` order.
        """CREATE TABLE IF NOT EXISTS agent_steers (
            id INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            token TEXT NOT NULL UNIQUE,
            target TEXT NOT NULL,
            type TEXT NOT NULL,
            payload BLOB NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agent_steers_thread_idx ON agent_steers (thread_id, target)",
    ],
    [
        # `agent_threads_activity_idx` starts with user_id and serves every lookup by user; every turn's
        # change of `updated_at` rewrote an entry of this one too (the Postgres schema drops it as well).
        "DROP INDEX IF EXISTS agent_threads_user_id_idx",
    ],
    [
        # The search index without a copy of the text (`agent.storage.search`): the earlier content table kept
        # each row's text beside its FTS5 index, about twice the text, and broke the storage bound. A
        # contentless FTS5 table (https://sqlite.org/fts5.html#contentless_tables) of each row's word keys,
        # `detail=none` (no positions: a query needs only which rows hold every key; `columnsize=0` would
        # save a few bytes a row more, but makes the table refuse a scan), with the row ids of `agent_message_rows`; AUTOINCREMENT so that a deleted row's id,
        # whose FTS5 entry stays until a rebuild, never names another checkpoint. The earlier rows are
        # dropped, not converted: `search.backfill` (`tt-agent search-index`) indexes them again.
        "DROP TRIGGER IF EXISTS agent_message_text_ai",
        "DROP TRIGGER IF EXISTS agent_message_text_ad",
        "DROP TRIGGER IF EXISTS agent_message_text_au",
        "DROP TABLE IF EXISTS agent_message_fts",
        "DROP TABLE IF EXISTS agent_message_text",
        """CREATE TABLE IF NOT EXISTS agent_message_rows (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            UNIQUE (thread_id, checkpoint_id)
        )""",
        """CREATE VIRTUAL TABLE IF NOT EXISTS agent_message_terms USING fts5(
            body, content='', detail=none)""",
    ],
    [
        # Runs (`agent.runs.store`): one row per streamed or background turn, and its event log; short-lived
        # rows, swept `response_events_seconds` after the turn ends.
        """CREATE TABLE IF NOT EXISTS agent_runs (
            response_id TEXT PRIMARY KEY,
            user_id TEXT,
            status TEXT NOT NULL,
            background INTEGER NOT NULL,
            thread_id TEXT,
            checkpoint_id TEXT,
            reason TEXT,
            code TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            request TEXT NOT NULL DEFAULT '{}',
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agent_runs_expires_idx ON agent_runs (expires_at)",
        """CREATE TABLE IF NOT EXISTS agent_run_events (
            response_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            payload BLOB NOT NULL,
            PRIMARY KEY (response_id, seq)
        )""",
    ],
    [
        # The search index holds only the words new to a checkpoint's branch, and a row at each root
        # (`agent.storage.search`), and forgets a deleted row: the row keeps its tokens (`terms`) and is the
        # external content of the FTS5 table (https://sqlite.org/fts5.html#external_content_tables), whose
        # triggers delete a row's entries with them. The contentless table before could forget a row only
        # with `contentless_delete` (SQLite 3.43): a deleted checkpoint's entries stayed until a rebuild.
        # The earlier rows are dropped, not converted: `search.backfill` (`tt-agent search-index`) indexes
        # their threads again.
        "DROP TABLE IF EXISTS agent_message_terms",
        "DROP TABLE IF EXISTS agent_message_rows",
        """CREATE TABLE IF NOT EXISTS agent_message_rows (
            id INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            terms TEXT NOT NULL
        )""",
        # By thread only (every look-up names the thread; a thread has few rows): half the bytes of a
        # unique index on (thread_id, checkpoint_id), which would copy the checkpoint id of every row.
        "CREATE INDEX IF NOT EXISTS agent_message_rows_thread_idx ON agent_message_rows (thread_id)",
        # `detail=none`: no positions, a query needs only which rows hold a token. The punctuation is part of
        # a token (`search.FTS5_DIGITS`: tokens in base 64, shorter than in base 36).
        """CREATE VIRTUAL TABLE IF NOT EXISTS agent_message_terms USING fts5(
            terms, content='agent_message_rows', content_rowid='id', detail=none,
            tokenize="unicode61 tokenchars '!#$%&()*+,-./:;<=>?@[]^_{|}~'")""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_rows_ai AFTER INSERT ON agent_message_rows BEGIN
            INSERT INTO agent_message_terms (rowid, terms) VALUES (new.id, new.terms);
        END""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_rows_ad AFTER DELETE ON agent_message_rows BEGIN
            INSERT INTO agent_message_terms (agent_message_terms, rowid, terms) VALUES ('delete', old.id, old.terms);
        END""",
        """CREATE TRIGGER IF NOT EXISTS agent_message_rows_au AFTER UPDATE ON agent_message_rows BEGIN
            INSERT INTO agent_message_terms (agent_message_terms, rowid, terms) VALUES ('delete', old.id, old.terms);
            INSERT INTO agent_message_terms (rowid, terms) VALUES (new.id, new.terms);
        END""",
    ],
]

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = (
    "checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency", "agent_checkpoint_ids",
    "agent_claim_waiters", "agent_user_claims", "agent_steers", "store_migrations", "store", "vector_migrations",
    "store_vectors", "agent_branches", "agent_message_rows", "agent_message_terms", "agent_runs", "agent_run_events",
)  # fmt: skip

#: LangGraph's store (long-term memory, agent.memory): its migration lists and their version tables,
#: as SqliteStore.setup() applies them. The vectors table is a plain BLOB table, created always.
STORE_SCHEMA = (("store_migrations", STORE_MIGRATIONS), ("vector_migrations", STORE_VECTOR_MIGRATIONS))

TABLE_NAMES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table'"


def missing_tables(conn: sqlite3.Connection) -> list[str]:
    """Those of `TABLES` that do not exist (read only)."""
    present = {row[0] for row in conn.execute(TABLE_NAMES_SQL)}
    return [table for table in TABLES if table not in present]


def refuse_duplicate_checkpoint_ids(conn: sqlite3.Connection, where: str) -> None:
    """Refuse to register the stored checkpoints when an id is held by more than one thread (read only).

    Raises:
        ConfigurationError: naming the first few ids with their threads, and what to do.
    """
    rows = conn.execute(DUPLICATE_CHECKPOINT_IDS_SQL, (records.DUPLICATES_SHOWN,)).fetchall()
    if rows:
        found = [(checkpoint_id, sorted(json.loads(threads))) for checkpoint_id, threads, _ in rows]
        raise records.duplicate_checkpoint_ids(where, found, total=rows[0][2])


#: Checks run just before a migration's statement (by its text), inside the same transaction.
CHECKS: dict[str, Callable[[sqlite3.Connection, str], None]] = {
    REGISTER_STORED_CHECKPOINTS_SQL: refuse_duplicate_checkpoint_ids,
}


def migrate(conn: sqlite3.Connection, *, start: int, where: str) -> None:
    """Apply the agent's migrations from index `start` (the file's `user_version`), each in its own transaction.
    `where` names the file in errors.

    Raises:
        ConfigurationError: a check refused a migration (`CHECKS`); that migration was not applied.
    """
    for index in range(start, len(MIGRATIONS)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[index]:
                check = CHECKS.get(statement)
                if check is not None:
                    check(conn, where)
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
