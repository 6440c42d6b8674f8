"""How setup applies the Postgres schema: the agent's migrations (`migrations`), beside LangGraph's (checkpointer and store).

`migrate` applies every missing migration of the three lists in ONE
transaction under `pg_advisory_xact_lock`, so many processes may set up at
once, also through PgBouncer; it re-applies every (idempotent) migration when a
table that an applied migration created is missing (dropped by hand), since
trusting the migrations tables alone left a database broken for good; a table
that a pending migration creates is only an upgrade (`CREATED_BY`). Its statements have no `statement_timeout_ms` (`SET LOCAL`):
a migration over a big table takes what it takes. An index a migration creates
`CONCURRENTLY` on a table that already existed is built after that transaction
(`indexes`), so that setup locks out no writer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import psycopg
from langgraph.checkpoint.postgres.base import MIGRATIONS as LANGGRAPH_MIGRATIONS
from langgraph.store.postgres.base import MIGRATIONS as STORE_MIGRATIONS

from agent.storage.postgres import checkpoint_ids, indexes
from agent.storage.postgres.migrations import (
    DROPPED_INDEXES,
    MIGRATIONS,
    REGISTRY_REPLACED,
    TABLES,
    USER_LOCK_CLASS,
    missing_privileges_sql,
)

__all__ = ["MIGRATIONS", "TABLES", "USER_LOCK_CLASS", "migrate", "missing_tables", "migrations_current"]

logger = logging.getLogger(__name__)


# Any constant works; it keeps setup's lock apart from other advisory locks.
SETUP_LOCK_KEY = 7_140_213_911

SETUP_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s)"
# Setup's own statements are not limited by statement_timeout_ms (a migration over a big table is slow).
UNLIMITED_SQL = "SET LOCAL statement_timeout = 0"
RECORDED_SQL = "SELECT coalesce(max(v), -1) AS v FROM {}"  # a migrations table's last version
MISSING_TABLES_SQL = "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL"
MIGRATION_VERSIONS_SQL = """
SELECT (SELECT max(v) FROM checkpoint_migrations) AS langgraph, (SELECT max(v) FROM agent_migrations) AS agent,
    (SELECT max(v) FROM store_migrations) AS store, to_regclass('agent_checkpoint_ids') IS NOT NULL AS registry
"""
# The registry the owner index replaced, re-created by an agent of an earlier release (`REGISTRY_REPLACED`).
REGISTRY_SQL = "SELECT to_regclass('agent_checkpoint_ids') IS NOT NULL AS registry"

#: Each migrations table and the list it records, in the order they are applied.
SCHEMAS = (
    ("checkpoint_migrations", LANGGRAPH_MIGRATIONS),
    ("agent_migrations", MIGRATIONS),
    # LangGraph's store (long-term memory, agent.memory): the tables of PostgresStore.setup().
    ("store_migrations", STORE_MIGRATIONS),
)

#: Every index a migration creates CONCURRENTLY (LangGraph's and ours) and no later one drops, which
#: `indexes.build` keeps valid.
CONCURRENT_INDEXES = {
    name: index
    for name, index in indexes.concurrent_indexes(statement for _, migrations in SCHEMAS for statement in migrations).items()
    if name not in DROPPED_INDEXES
}

#: The migration (migrations table, version) that creates each table: a table that a migration not yet
#: applied creates is new (an upgrade), not dropped, and is no reason to re-apply everything.
CREATED_BY = {
    table: (name, version)
    for name, migrations in reversed(SCHEMAS)
    for version, statement in reversed(list(enumerate(migrations)))
    for table in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", statement)
}

def missing_tables(conn: psycopg.Connection) -> list[str]:
    """Those of `TABLES` that do not exist (read only)."""
    return [row["t"] for row in conn.execute(MISSING_TABLES_SQL, (list(TABLES),)).fetchall()]


def migrations_current(conn: psycopg.Connection) -> bool:
    """Whether every migrations table (they exist) records every migration this code has (read only)."""
    row = conn.execute(MIGRATION_VERSIONS_SQL).fetchone()
    names = {"checkpoint_migrations": "langgraph", "agent_migrations": "agent", "store_migrations": "store"}
    current = all(row[names[table]] is not None and row[names[table]] >= len(migrations) - 1 for table, migrations in SCHEMAS)
    return current and not row["registry"]


#: Checks run just before a migration (by its text), inside the same transaction.
CHECKS: dict[str, Callable[[psycopg.Connection, str], None]] = {
    checkpoint_ids.REGISTER_STORED_SQL: checkpoint_ids.refuse_duplicates,
}


def migrate(conn: psycopg.Connection, *, where: str) -> None:
    """Apply LangGraph's (checkpointer, store) and the agent's missing migrations in one transaction; all of
    them if a table is missing. `where` names the database in the log (its URL, password masked). An index
    created CONCURRENTLY on a table that existed before is left to `indexes.build`.

    Raises:
        ConfigurationError: a check refused a migration (`CHECKS`); nothing was applied.
        psycopg.Error: as the server answered; nothing was applied (a deadlock's victim may run it again).
    """
    with conn.transaction():
        conn.execute(UNLIMITED_SQL)
        conn.execute(SETUP_LOCK_SQL, (SETUP_LOCK_KEY,))
        # Decided under the lock: another process may have just created everything, and
        # needless DDL (ALTER TABLE takes an exclusive lock) would contend with its turns.
        missing = missing_tables(conn)
        recorded = {name: conn.execute(RECORDED_SQL.format(name)).fetchone()["v"] for name, _ in SCHEMAS if name not in missing}
        dropped = [t for t in missing if t not in CREATED_BY or recorded.get(CREATED_BY[t][0], -1) >= CREATED_BY[t][1]]
        everything = bool(dropped) and "agent_migrations" not in missing
        if everything:
            logger.warning("Tables %s were missing from %s; re-creating them", dropped, where)
        applied = False
        for table, migrations in SCHEMAS:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v INTEGER PRIMARY KEY)")
            row = conn.execute(f"SELECT max(v) AS v FROM {table}").fetchone()
            current = -1 if everything or row["v"] is None else row["v"]
            if table == "agent_migrations" and current >= REGISTRY_REPLACED and conn.execute(REGISTRY_SQL).fetchone()["registry"]:
                logger.warning(
                    "An agent of an earlier release re-created agent_checkpoint_ids in %s (releases side by side are "
                    "not supported); replacing it by the owner index again",
                    where,
                )
                current = REGISTRY_REPLACED - 1
            for version in range(current + 1, len(migrations)):
                statement = migrations[version]
                check = CHECKS.get(statement)
                if check is not None:
                    check(conn, where)
                index = indexes.concurrent_index(statement)
                if index is None or index.table in missing:
                    # CONCURRENTLY cannot run inside a transaction; on a table this transaction creates,
                    # the build is instant without it.
                    conn.execute(statement.replace("CONCURRENTLY ", ""))
                conn.execute(f"INSERT INTO {table} (v) VALUES (%s) ON CONFLICT DO NOTHING", (version,))
                applied = True
        if applied:
            # The migration that made it is applied once; the table list it checks may have grown since.
            conn.execute(missing_privileges_sql())


