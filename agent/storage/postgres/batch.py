"""`StatementBatch`: the statements of one Postgres write transaction, sent together as one simple query.

Why: a turn's commit is a handful of small statements (`BEGIN`, the fencing
check, the checkpoint, the thread record, `COMMIT`). Sent through psycopg's
pipeline mode, each statement costs a trip through psycopg's Python code for
the extended protocol (parse, bind, describe, execute, and a result to
process): about 0.8 ms of client CPU per commit, more than the database spent
on it. Bound on the client by psycopg's own `ClientCursor.mogrify` (psycopg's
quoting, never string formatting of ours) and joined with `;`, they go as one
simple query: one round trip, one result set to read, and the same single
transaction, because the batch begins with `BEGIN` and ends with `COMMIT`
(an error ends the query there, and the open transaction is rolled back by
whoever returns the connection to the pool).

A statement whose result is needed (`read`, or any direct use of the
connection through `connection()`) first sends what is pending, inside the
same transaction, so statements always run in the order they were given.
A batch grows to at most `FLUSH_BYTES` of SQL before it is sent, so a large
import does not build one huge string.

No prepared statement can come of it (`prepare=False`): each batch's text is
new, and a transaction-mode pooler (PgBouncer) must not see any.

`running(batch)` marks the batch as the write transaction of this thread (a
context variable), so that the saver's queries and long-term memory's, made
deep inside LangGraph, join it (`running_batch`) instead of taking a pooled
connection of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agent.storage.postgres.round_trips import carrying

#: Pending SQL (characters) after which the batch is sent before more is added.
FLUSH_BYTES = 1 << 20

Params = Sequence[Any] | Mapping[str, Any] | None


class StatementBatch:
    """Write statements of one transaction on `conn`, bound client-side and sent in as few round trips as
    the reads among them allow. `conn` must be in autocommit mode (the batch sends its own `BEGIN`)."""

    def __init__(self, conn: psycopg.Connection, *, long_statements: bool = False) -> None:
        """`long_statements`: its statements may each run up to `statement_timeout_ms` (a prune's or a
        deletion's deletes), so a round trip's deadline grows with the statements it carries
        (`round_trips.carrying`); else a round trip has one statement's deadline (a turn's commit: single-row
        statements, whose claim keeps other writers of the thread away)."""
        self._conn = conn
        self._long_statements = long_statements
        self._binder = psycopg.ClientCursor(conn)
        self._pending: list[str] = ["BEGIN"]
        self._size = 0

    def execute(self, query: str, params: Params = None) -> None:
        """Add one statement whose result is not needed; nothing is sent yet (unless the batch is full).

        Raises:
            psycopg.ProgrammingError, psycopg.DataError: a parameter psycopg cannot adapt (from `mogrify`).
        """
        statement = self._binder.mogrify(query, params)
        self._pending.append(statement)
        self._size += len(statement)
        if self._size >= FLUSH_BYTES:
            self.flush()

    def executemany(self, query: str, params_seq: Iterable[Params]) -> None:
        """`execute` for each parameter set, in order (the cursor method LangGraph's savers call)."""
        for params in params_seq:
            self.execute(query, params)

    def read(self, query: str, params: Params = None) -> psycopg.Cursor:
        """Send what is pending, then run `query` in the same transaction; its cursor yields dict rows."""
        return self.connection().cursor(binary=True, row_factory=dict_row).execute(query, params)

    def connection(self) -> psycopg.Connection:
        """The connection, with everything added so far sent: for work that needs results as it goes."""
        self.flush()
        return self._conn

    def commit(self, returning: tuple[str, Params] | None = None) -> Any:
        """Send what is pending and `COMMIT`, in one round trip; with `returning` (a query and its parameters),
        run that query last before `COMMIT` and return the first column of its first row (None: no row).

        Raises:
            psycopg.Error: as the server answered; a failed batch leaves its transaction for the caller to roll back.
        """
        if returning is None:
            self._pending.append("COMMIT")
            self.flush()
            return None
        self._pending.append(self._binder.mogrify(*returning))  # never flushed on its own: its result is read here
        position = len(self._pending) - 1  # the query's result among the results of the statements sent
        self._pending.append("COMMIT")
        cursor = self.flush()
        for _ in range(position):
            cursor.nextset()
        row = cursor.fetchone()
        return None if row is None else next(iter(row.values())) if isinstance(row, dict) else row[0]

    def flush(self) -> psycopg.Cursor | None:
        """Send the pending statements as one simple query (no parameters: psycopg uses the simple protocol);
        the cursor holding their results (None when nothing was pending)."""
        if not self._pending:
            return None
        sql = ";\n".join(self._pending)
        statements = len(self._pending)
        self._pending, self._size = [], 0
        with carrying(statements if self._long_statements else 1):  # the server limits each statement
            return self._conn.execute(sql, prepare=False)


# The batch of the write transaction running on this thread (a commit, `PostgresThreadStorage.transaction`).
_RUNNING: ContextVar[StatementBatch | None] = ContextVar("tt_tx_batch", default=None)


def running_batch() -> StatementBatch | None:
    """The batch of the write transaction running on this thread, if any."""
    return _RUNNING.get()


@contextmanager
def running(batch: StatementBatch) -> Iterator[None]:
    """Make `batch` this thread's running write transaction for the block (see the module docstring)."""
    token = _RUNNING.set(batch)
    try:
        yield
    finally:
        _RUNNING.reset(token)
