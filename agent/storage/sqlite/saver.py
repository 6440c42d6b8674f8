"""`TurnSqliteSaver`: LangGraph's `SqliteSaver` with the agent's turns (`storage.saver`), on the storage's one connection.

The connection is in autocommit mode (`isolation_level=None`), so
`SqliteSaver`'s own commits are no-ops and transactions are explicit:
`transaction()` is one `BEGIN IMMEDIATE` under the saver's lock, and while a
thread is inside it (`in_transaction`) every query the saver makes, and long-
term memory's (`SqliteThreadStorage.cursor`), joins it instead of starting its own.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from agent.storage.saver import TurnSaverMixin
from agent.storage.sqlite import sql


class TurnSqliteSaver(TurnSaverMixin, SqliteSaver):
    """`SqliteSaver` with turn buffering, message deltas and summaries.

    `storage` is the `SqliteThreadStorage` it belongs to (its `transaction` runs the thread operations).
    """

    def __init__(self, conn: sqlite3.Connection, storage: Any, *, message_cache_size: int) -> None:
        SqliteSaver.__init__(self, conn)
        self._storage = storage
        self._init_turns(message_cache_size)
        # Set while this OS thread holds `self.lock` inside an explicit transaction.
        self._in_transaction = threading.local()

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        if self.in_transaction:
            cur = self.conn.cursor()
            try:
                yield cur
            finally:
                cur.close()
            return
        with SqliteSaver.cursor(self, transaction) as cur:
            yield cur

    @property
    def in_transaction(self) -> bool:
        """Whether this OS thread is inside one of `transaction`'s blocks (its statements join it)."""
        return getattr(self._in_transaction, "active", False)

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
            rows = cur.execute(sql.SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns)).fetchall()
        return {
            checkpoint_id: self.serde.loads_typed((type_, blob))["channel_values"].get("messages")
            for checkpoint_id, type_, blob in rows
        }
