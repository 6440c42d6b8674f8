"""Indexes built `CONCURRENTLY`: after setup's transaction, so that setup on a big existing table locks out no writer.

`CREATE INDEX CONCURRENTLY` cannot run inside a transaction block, and setup
applies its migrations in one. Inside it, a plain `CREATE INDEX` holds a SHARE
lock on the table until the migrations commit: every turn's commit waits for the
whole build. So a migration that creates an index concurrently (LangGraph's and
the agent's own, `agent_checkpoints_checkpoint_id_idx`) is applied as written
only where the build is instant, on a table that setup's transaction itself
creates; on a table that already existed it is left to `build`, which runs
after the commit, on a connection of its own with no statement timeout (a build
takes as long as the table is big).

An interrupted concurrent build (a killed process, a cancel, a lost connection)
leaves the index behind marked INVALID (`pg_index.indisvalid`): Postgres keeps
it up to date but never reads it, and `IF NOT EXISTS` then skips it for good.
`build` finds those and drops and builds them again, unless another session is
building that index right now (`pg_stat_progress_create_index`; another setup
of the agent): an index being built concurrently is INVALID until its build
ends, and dropping it would only start the work over. `CREATE INDEX
CONCURRENTLY` and `pg_stat_progress_create_index` are Postgres 12+.

An index is a speed-up here, so a build that fails (a role that may not create
indexes, a read-only replica, a cancel) is logged and setup goes on; the next
setup tries again. One is also a rule, `checkpoint_ids.OWNER_INDEX`: what fails
its build is settled by setup (`checkpoint_ids.settle_duplicates`). The one read (`INDEX_STATE_SQL`)
is all a setup does when every index is valid.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)

# LangGraph's and the agent's form: `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ON table ...`.
CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)\s+ON\s+(?:ONLY\s+)?(\w+)", re.IGNORECASE
)

# Each index that is missing or INVALID, and whether a session is building it now.
INDEX_STATE_SQL = """
SELECT n.name, i.indisvalid AS valid,
    EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid) AS building
FROM unnest(%s::text[]) AS n(name)
LEFT JOIN pg_index i ON i.indexrelid = to_regclass(n.name)
WHERE i.indisvalid IS NOT TRUE
ORDER BY n.name
"""
DROP_INDEX_SQL = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}")


@dataclass(frozen=True)
class ConcurrentIndex:
    """A migration that creates an index `CONCURRENTLY`: the index, its table and the statement."""

    name: str
    table: str
    statement: str


def concurrent_index(statement: str) -> ConcurrentIndex | None:
    """The index `statement` creates `CONCURRENTLY`, or None when it creates none."""
    found = CONCURRENT_INDEX.search(statement)
    return ConcurrentIndex(found.group(1), found.group(2), statement) if found else None


def concurrent_indexes(statements: Iterable[str]) -> dict[str, ConcurrentIndex]:
    """Every index the statements create `CONCURRENTLY`, by name (a later statement for a name wins)."""
    return {index.name: index for index in map(concurrent_index, statements) if index is not None}


def build(
    conn: psycopg.Connection,
    indexes: Mapping[str, ConcurrentIndex],
    *,
    connect: Callable[[], psycopg.Connection],
    where: str,
) -> list[str]:
    """Build every index of `indexes` that is missing or INVALID and that no session is building now, each
    `CONCURRENTLY` on its own connection from `connect` (which must not limit statements' time). `conn` (in
    autocommit mode) only reads. `where` names the database in the log.

    Returns:
        The names of the indexes built (empty when every index was valid).

    Never raises for a build that fails (see the module docstring); psycopg's error of the read propagates.
    """
    built: list[str] = []
    for row in conn.execute(INDEX_STATE_SQL, (sorted(indexes),)).fetchall():
        name = row["name"]
        if row["building"]:
            logger.info("Index %s in %s is being built by another session; leaving it to that one", name, where)
            continue
        try:
            with connect() as builder:
                builder.autocommit = True  # CREATE INDEX CONCURRENTLY cannot run in a transaction block
                if row["valid"] is False:
                    logger.warning("Index %s in %s is INVALID (an interrupted build); building it again", name, where)
                    builder.execute(DROP_INDEX_SQL.format(sql.Identifier(name)))
                builder.execute(indexes[name].statement)
        except psycopg.Error as exc:
            logger.warning(
                "Could not build index %s in %s (%s); queries it serves are slower until a later setup builds it",
                name,
                where,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            continue
        built.append(name)
    return built
