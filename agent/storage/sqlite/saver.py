"""`TurnSqliteSaver`: LangGraph's `SqliteSaver` with the agent's turns (`storage.saver`), on the storage's one connection.

The connection is in autocommit mode (`isolation_level=None`), so
`SqliteSaver`'s own commits are no-ops and transactions are explicit:
`transaction()` is one `BEGIN IMMEDIATE` under the saver's lock, and while a
thread is inside it (`in_transaction`) every query the saver makes, and long-
term memory's (`SqliteThreadStorage.cursor`), joins it instead of starting its own.

* **Checkpoint ids name one thread.** A root-namespace checkpoint is written
  with its row in `agent_checkpoint_ids` (see `schema`), in one transaction
  (the running one, else its own); another thread's row is `ThreadExists`.
  SQLite lets one writer in at a time, so the primary key and the owner read
  after it cannot race.
* **A time limit on every operation** (`statement_timeout_ms`): SQLite has no
  statement timeout. Waiting for another process's write lock is bounded by
  the busy timeout (set by the storage), and each hold of the saver's lock (a
  read, a transaction) by a progress handler that interrupts the statement
  running when the limit is past (`sqlite3.OperationalError: interrupted`,
  which rolls back the transaction). Per hold rather than per statement: the
  sqlite3 module has no hook at a statement's start short of a trace callback,
  which would expand every bound blob into text. Setup is not limited.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.sqlite import SqliteSaver

from agent.storage import summaries
from agent.storage.records import checkpoint_taken
from agent.storage.saver import TurnSaverMixin
from agent.storage.sqlite import branches, sql

#: SQLite virtual machine instructions between two looks at the time limit (a few milliseconds of work).
PROGRESS_STEPS = 10_000


class TurnSqliteSaver(TurnSaverMixin, SqliteSaver):
    """`SqliteSaver` with turn buffering, message deltas and summaries.

    `storage` is the `SqliteThreadStorage` it belongs to (its `transaction` runs the thread operations).
    """

    def __init__(
        self, conn: sqlite3.Connection, storage: Any, *, message_cache_size: int, time_limit_ms: int = 0
    ) -> None:
        """`time_limit_ms` bounds each hold of the lock (see the module docstring); 0: no limit."""
        SqliteSaver.__init__(self, conn)
        self._storage = storage
        self._init_turns(message_cache_size, storage.keyring)
        # Set while this OS thread holds `self.lock` inside an explicit transaction.
        self._in_transaction = threading.local()
        self._time_limit = time_limit_ms / 1000
        self._deadline = math.inf  # changed only under `self.lock`
        if time_limit_ms > 0:
            conn.set_progress_handler(self._past_deadline, PROGRESS_STEPS)

    def _past_deadline(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    @contextmanager
    def limited(self) -> Iterator[None]:
        """Interrupt the statements of the block once `statement_timeout_ms` has passed (the caller holds the lock)."""
        if not self._time_limit:
            yield
            return
        self._deadline = time.monotonic() + self._time_limit
        try:
            yield
        finally:
            self._deadline = math.inf

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        if self.in_transaction:
            cur = self.conn.cursor()
            try:
                yield cur
            finally:
                cur.close()
            return
        # SqliteSaver.cursor takes the lock (and sets up) first: the limit starts once the lock is held.
        with SqliteSaver.cursor(self, transaction) as cur, self.limited():
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
            cur.execute("BEGIN IMMEDIATE")  # waits for another process's lock up to the busy timeout
            self._in_transaction.active = True
            try:
                with self.limited():
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
        return self._resolve_tuple(_summary_as_object(SqliteSaver.get_tuple(self, config)))

    def list(self, config, *, filter=None, before=None, limit=None):
        # SqliteSaver.list yields while holding `self.lock`; resolving a delta
        # may query, so read everything first.
        found = list(SqliteSaver.list(self, config, filter=filter, before=before, limit=limit))
        return iter([self._resolve_tuple(_summary_as_object(tup)) for tup in found])

    def _backend_put(self, config, checkpoint, metadata, new_versions, terms):
        metadata = summaries.as_positional(metadata)  # read back as the object (`_summary_as_object`)
        if config["configurable"].get("checkpoint_ns", ""):
            return SqliteSaver.put(self, config, checkpoint, metadata, new_versions)
        # Registered and written in one transaction: the running one (a commit), else one of its own. Used
        # directly as a LangGraph checkpointer, the saver may be the first to touch the file: the storage's
        # setup (its tables, agent_checkpoint_ids among them) comes first, as on Postgres.
        if not self.in_transaction:
            self._storage.setup()
        with nullcontext() if self.in_transaction else self.transaction():
            thread_id = str(config["configurable"]["thread_id"])
            self._register(thread_id, checkpoint["id"])
            result = SqliteSaver.put(self, config, checkpoint, metadata, new_versions)
            if terms is not None:
                with self.cursor() as cur:
                    branches.index_checkpoint(cur, thread_id, checkpoint["id"], terms)
            return result

    def _register(self, thread_id: str, checkpoint_id: str) -> None:
        with self.cursor() as cur:
            if cur.execute(sql.REGISTER_CHECKPOINT_SQL, (checkpoint_id, thread_id)).rowcount == 0:
                owner = cur.execute(sql.CHECKPOINT_OWNER_SQL, (checkpoint_id,)).fetchone()
                if owner is not None and owner[0] != thread_id:
                    raise checkpoint_taken(thread_id, checkpoint_id)

    def _backend_put_writes(self, config, writes, task_id, task_path):
        return SqliteSaver.put_writes(self, config, writes, task_id, task_path)

    def _fetch_checkpoint_messages(self, thread_id: str, checkpoint_ids: Sequence[str]) -> Mapping[str, Any]:
        with self.cursor(transaction=False) as cur:
            return branches.stored_messages(cur, self.serde, thread_id, checkpoint_ids)

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:
        with self.cursor(transaction=False) as cur:
            rows = cur.execute(sql.SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns)).fetchall()
        return {
            checkpoint_id: self.serde.loads_typed((type_, blob))["channel_values"].get("messages")
            for checkpoint_id, type_, blob in rows
        }


def _summary_as_object(tup: CheckpointTuple | None) -> CheckpointTuple | None:
    """`tup` with a summary stored as the positional array (`summaries.as_positional`) as the object that was
    put, as LangGraph's reads expect."""
    if tup is None or not tup.metadata:
        return tup
    return tup._replace(metadata=summaries.as_object(tup.metadata))
