"""Postgres backend: `psycopg_pool.ConnectionPool` + LangGraph's `PostgresSaver`.

Design notes:

* **One connection per turn.** A turn checks out a connection, opens a
  transaction and takes `pg_advisory_xact_lock` on the thread id, so turns on
  one thread queue (or are refused) across processes and replicas, and
  different threads never wait for each other. The lock ends with the
  transaction, also when the process dies. The turn's reads and its final
  writes use that connection; the chat model runs while the transaction is
  idle, so `pool_max_size` bounds the turns that run at once.
* **No saver-wide lock.** `PostgresSaver` serializes every query of an
  instance behind one lock even when it is given a pool (langgraph#7259), so
  `_cursor` is overridden to take a pooled connection without it.
* **Schema.** LangGraph's tables are created by `PostgresSaver.setup()`; the
  agent adds `agent_threads` (owner and head of each thread) through its own
  numbered migrations. `setup()` runs under a session advisory lock because
  LangGraph's migrations (`CREATE INDEX CONCURRENTLY`) are not safe to run from
  two processes at once.
* **Managed credentials.** With a `credential_provider`, the pool's connection
  kwargs are a callable (psycopg_pool >= 3.3), so every new connection gets a
  fresh or cached password, and `max_lifetime` retires connections before their
  token expires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from agent.config import AgentSettings, mask_url
from agent.errors import StorageUnavailable, ThreadBusy
from agent.storage.base import Store, ThreadRecord, Turn, TurnSaverMixin

# The agent's own migrations; a migration's position is its version.
MIGRATIONS = [
    "CREATE TABLE IF NOT EXISTS agent_migrations (v INTEGER PRIMARY KEY)",
    """CREATE TABLE IF NOT EXISTS agent_threads (
        thread_id TEXT PRIMARY KEY,
        user_id TEXT,
        head_checkpoint_id TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS agent_threads_user_id_idx ON agent_threads (user_id)",
]

# Any constant works; it keeps setup's lock apart from the thread locks' key space.
SETUP_LOCK_KEY = 7_140_213_911

TRY_THREAD_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0)) AS locked"
WAIT_THREAD_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)), true AS locked"
SET_LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, true)"
SELECT_THREAD_SQL = "SELECT thread_id, user_id, head_checkpoint_id FROM agent_threads WHERE thread_id = %s"
UPSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id) VALUES (%s, %s, %s)
ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = EXCLUDED.head_checkpoint_id, updated_at = now()
"""
# The turn's start (the requested checkpoint, else the thread head), in the
# shape of PostgresSaver.SELECT_SQL. The blobs are fetched by one primary-key
# lookup per channel (OFFSET 0 keeps the planner from flattening it): on a
# young table without statistics the planner otherwise hashes every blob of
# the thread, a cost that grows with the thread.
SELECT_START_SQL = """
SELECT c.thread_id, c.checkpoint, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
    (SELECT array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
     FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v(channel, version)
     CROSS JOIN LATERAL (
        SELECT b.channel, b.type, b.blob FROM checkpoint_blobs b
        WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
          AND b.channel = v.channel AND b.version = v.version
        OFFSET 0) AS bl
    ) AS channel_values,
    (SELECT array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob,
                            convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
     FROM checkpoint_writes cw
     WHERE cw.thread_id = c.thread_id AND cw.checkpoint_ns = c.checkpoint_ns AND cw.checkpoint_id = c.checkpoint_id
    ) AS pending_writes
FROM checkpoints c
WHERE c.thread_id = %s AND c.checkpoint_ns = '' AND c.checkpoint_id = COALESCE(
    %s, (SELECT head_checkpoint_id FROM agent_threads WHERE thread_id = %s))
"""
CHECKPOINT_IN_THREAD_SQL = """
SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s
"""
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = '' AND (%s::text IS NULL OR checkpoint_id < %s)
ORDER BY checkpoint_id DESC LIMIT %s
"""
# Every checkpoint's stored `messages` value: the blob its channel version points at.
SELECT_THREAD_MESSAGES_SQL = """
SELECT c.checkpoint_id, b.type, b.blob FROM checkpoints c
JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
  AND b.channel = 'messages' AND b.version = c.checkpoint -> 'channel_versions' ->> 'messages'
WHERE c.thread_id = %s AND c.checkpoint_ns = %s
"""
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = %s ORDER BY thread_id"
DELETE_THREAD_SQL = [
    "DELETE FROM checkpoint_writes WHERE thread_id = %s",
    "DELETE FROM checkpoint_blobs WHERE thread_id = %s",
    "DELETE FROM checkpoints WHERE thread_id = %s",
    "DELETE FROM agent_threads WHERE thread_id = %s",
]

# Set only for the duration of one synchronous call, so the saver's queries run
# on the turn's connection (inside its transaction) instead of the pool.
_TURN_CONN: ContextVar[psycopg.Connection | None] = ContextVar("tt_turn_conn", default=None)


class TurnPostgresSaver(TurnSaverMixin, PostgresSaver):
    """`PostgresSaver` with turn buffering, message deltas, summaries and no instance lock."""

    def __init__(self, pool: ConnectionPool, *, message_cache_size: int) -> None:
        PostgresSaver.__init__(self, pool)
        self._init_turns(message_cache_size)

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor]:
        turn_conn = _TURN_CONN.get()
        # langgraph#7259: the base class holds `self.lock` here even with a
        # pool; a pooled (or the turn's) connection is not shared, so no lock.
        with nullcontext(turn_conn) if turn_conn is not None else self.conn.connection() as conn:
            # Inside the turn's commit pipeline a nested one would cost a round trip.
            nested = pipeline and conn.info.pipeline_status == psycopg.pq.PipelineStatus.OFF
            with conn.pipeline() if nested else nullcontext(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur

    @contextmanager
    def on_connection(self, conn: psycopg.Connection | None) -> Iterator[None]:
        """Run the saver's queries in this block on `conn` (None: the pool)."""
        token = _TURN_CONN.set(conn)
        try:
            yield
        finally:
            _TURN_CONN.reset(token)

    def _backend_get_tuple(self, config):
        turn = self.active_turn(config["configurable"]["thread_id"])
        with self.on_connection(turn.lock if turn is not None and turn.opened_here() else _TURN_CONN.get()):
            return PostgresSaver.get_tuple(self, config)

    def _load_checkpoint_tuple(self, value):
        return self._resolve_tuple(PostgresSaver._load_checkpoint_tuple(self, value))

    def _backend_put(self, config, checkpoint, metadata, new_versions):
        return PostgresSaver.put(self, config, checkpoint, metadata, new_versions)

    def _backend_put_writes(self, config, writes, task_id, task_path):
        return PostgresSaver.put_writes(self, config, writes, task_id, task_path)

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:
        with self._cursor() as cur:
            cur.execute(SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns))
            rows = cur.fetchall()
        decoded: dict[tuple, Any] = {}
        stored = {}
        for row in rows:
            key = (row["type"], bytes(row["blob"]) if row["blob"] is not None else None)
            if key not in decoded:
                decoded[key] = None if row["type"] == "empty" else self.serde.loads_typed(key)
            stored[row["checkpoint_id"]] = decoded[key]
        return stored


class CachedCredential:
    """Calls `provider` for a password at most once per `lifetime` seconds. Thread-safe."""

    def __init__(self, provider: Callable[[], str], lifetime: float) -> None:
        self._provider = provider
        self._lifetime = lifetime
        self._lock = threading.Lock()
        self._value: str | None = None
        self._expires = 0.0

    def __call__(self) -> str:
        with self._lock:
            if self._value is None or time.monotonic() >= self._expires:
                self._value = self._provider()
                self._expires = time.monotonic() + self._lifetime
            return self._value


class PostgresStore(Store):
    """Postgres storage for one agent. Connects on first use; `setup()` is run then."""

    def __init__(self, url: str, settings: AgentSettings) -> None:
        self.url = url
        self.settings = settings
        base_kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        kwargs: Any = base_kwargs
        if settings.credential_provider is not None:
            credential = CachedCredential(settings.credential_provider, settings.credential_cache_seconds)
            kwargs = lambda: {**base_kwargs, "password": credential()}  # noqa: E731 - psycopg_pool calls it per connection
        self._kwargs = kwargs
        self.pool = ConnectionPool(
            url,
            kwargs=kwargs,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout,
            max_lifetime=settings.pool_max_lifetime,
            open=False,
            name="timetravel-agent",
        )
        self.saver = TurnPostgresSaver(self.pool, message_cache_size=settings.message_cache_size)
        self._setup_lock = threading.Lock()
        self._ready = False

    # -- lifecycle -----------------------------------------------------------
    def setup(self) -> None:
        if self._ready:  # every turn calls this; only the first takes the lock
            return
        with self._setup_lock:
            if self._ready:
                return
            with self._errors("set up the database"):
                # One direct attempt first: the pool would retry an unreachable
                # server for `pool_timeout` seconds before saying anything.
                kwargs = self._kwargs() if callable(self._kwargs) else self._kwargs
                psycopg.connect(self.url, connect_timeout=max(2, int(min(self.settings.pool_timeout, 10))), **kwargs).close()
                self.pool.open(wait=True, timeout=self.settings.pool_timeout)
                with self.pool.connection() as conn:
                    self._take_setup_lock(conn)
                    try:
                        # On this connection: a second one from the pool may not
                        # exist (pool_max_size=1) while this one holds the lock.
                        with self.saver.on_connection(conn):
                            self.saver.setup()
                        self._migrate(conn)
                    finally:
                        conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK_KEY,))
            self._ready = True

    def _take_setup_lock(self, conn: psycopg.Connection) -> None:
        # Polled, not waited for: a statement blocked in pg_advisory_lock keeps
        # its snapshot, and the holder's CREATE INDEX CONCURRENTLY waits for
        # every older snapshot, so two processes would deadlock.
        deadline = time.monotonic() + self.settings.pool_timeout
        while not conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (SETUP_LOCK_KEY,)).fetchone()["locked"]:
            if time.monotonic() > deadline:
                raise StorageUnavailable(
                    f"Another process held the setup lock of {mask_url(self.url)} for {self.settings.pool_timeout} s; "
                    "nothing was written."
                )
            time.sleep(0.05)

    def _migrate(self, conn: psycopg.Connection) -> None:
        conn.execute(MIGRATIONS[0])
        row = conn.execute("SELECT max(v) AS v FROM agent_migrations").fetchone()
        current = -1 if row["v"] is None else row["v"]
        for version in range(current + 1, len(MIGRATIONS)):
            with conn.transaction():
                conn.execute(MIGRATIONS[version])
                conn.execute("INSERT INTO agent_migrations (v) VALUES (%s)", (version,))

    def close(self) -> None:
        self.pool.close()

    # -- turns -----------------------------------------------------------------
    @contextmanager
    def turn(
        self, thread_id: str, *, user_id: str | None, strategy: str, timeout: float, checkpoint_id: str | None = None
    ) -> Iterator[Turn]:
        """See `Store.turn`. Two round trips: (lock, read the record and the start) and (write, commit)."""
        self.setup()
        with self._errors("start the turn", thread_id):
            conn, record, start = self._begin_turn(thread_id, strategy, timeout, checkpoint_id)
        committing = False
        try:
            turn = Turn(thread_id=thread_id, user_id=user_id, lock=conn, record=record)
            if start is not None:
                turn.loaded[start.config["configurable"]["checkpoint_id"]] = start
            with self.saver.buffering(turn):
                yield turn
            # Commit after the buffer is unregistered: COMMIT releases the lock,
            # and a turn of this process waiting for it registers its own buffer.
            committing = True
            # One pipeline: every write, the head, and COMMIT in one round trip.
            with conn.pipeline(), self.saver.on_connection(conn):
                if turn.puts:
                    self.saver.write_turn(turn)
                    conn.execute(UPSERT_THREAD_SQL, (thread_id, user_id, turn.new_head))
                conn.execute("COMMIT")
        except psycopg.OperationalError as exc:
            # The server ends a session it terminates (pg_terminate_backend, a
            # shutdown) with AdminShutdown before running anything else, so the
            # pipelined COMMIT did not run. Any other loss during the commit
            # leaves its outcome unknown.
            unknown = committing and not isinstance(exc, psycopg.errors.AdminShutdown)
            outcome = (
                "the turn may or may not have been saved; list the thread's history before retrying"
                if unknown
                else "nothing was written; the request can be retried"
            )
            raise StorageUnavailable(
                f"Lost the connection to {mask_url(self.url)}: {_first_line(exc)}; {outcome}.", thread_id=thread_id
            ) from None
        finally:
            _rollback_quietly(conn)
            self.pool.putconn(conn)

    def _begin_turn(self, thread_id: str, strategy: str, timeout: float, checkpoint_id: str | None):
        # Connections are not checked when taken from the pool (that costs a
        # round trip per turn). A connection that died (pg_terminate_backend,
        # a server restart) fails here, before anything is written: the pool
        # then drops every dead idle connection and the turn tries once more.
        for attempt in (1, 2):
            conn = self.pool.getconn()
            try:
                return (conn, *self._lock_and_read(conn, thread_id, strategy, timeout, checkpoint_id))
            except psycopg.OperationalError:
                self.pool.putconn(conn)
                if attempt == 2 or not conn.closed:
                    raise
                self.pool.check()
            except BaseException:
                _rollback_quietly(conn)
                self.pool.putconn(conn)
                raise
        raise AssertionError("unreachable")

    def _lock_and_read(self, conn: psycopg.Connection, thread_id: str, strategy: str, timeout: float, checkpoint_id: str | None):
        """BEGIN, take the thread lock, read the record and the turn's start checkpoint, in one round trip.

        Returns (record or None, start CheckpointTuple or None). The start is
        `checkpoint_id` if given, else the head; None if it is not in the thread.
        The statements go in one pipeline, as prepared statements, so the start
        query is planned once per connection, not once per turn.
        """
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                if strategy == "reject":
                    locked = conn.execute(TRY_THREAD_LOCK_SQL, (thread_id,))
                else:
                    # Local to the transaction; lock_timeout also bounds advisory lock waits.
                    conn.execute(SET_LOCK_TIMEOUT_SQL, (f"{max(1, int(timeout * 1000))}ms",))
                    locked = conn.execute(WAIT_THREAD_LOCK_SQL, (thread_id,))
                record = conn.execute(SELECT_THREAD_SQL, (thread_id,))
                start = conn.cursor(binary=True).execute(SELECT_START_SQL, (thread_id, checkpoint_id, thread_id))
        except psycopg.errors.LockNotAvailable:
            _rollback_quietly(conn)
            raise ThreadBusy(
                f"Thread {thread_id!r} stayed busy for {timeout} s; the turn was not run.", thread_id=thread_id
            ) from None
        if not locked.fetchone()["locked"]:
            _rollback_quietly(conn)
            raise ThreadBusy(f"Thread {thread_id!r} is busy with another turn.", thread_id=thread_id)
        record_row, start_row = record.fetchone(), start.fetchone()
        with self.saver.on_connection(conn):
            start_tuple = self.saver._load_checkpoint_tuple(start_row) if start_row else None
        return (ThreadRecord(**record_row) if record_row else None), start_tuple

    # -- reads -------------------------------------------------------------------
    def _read(self, thread_id: str | None, query: str, params: tuple) -> list[dict]:
        """The rows of a read-only query, on the connection of the turn this OS thread holds on
        `thread_id`, else on a pooled one.

        Pooled connections are not checked when taken (see `_begin_turn`); one
        found dead (pg_terminate_backend, a server restart) is dropped, with
        every other dead idle one, and the read runs once more: a read is safe
        to repeat.
        """
        self.setup()
        turn = self.saver.active_turn(thread_id) if thread_id else None
        with self._errors("read from the database"):
            if turn is not None and turn.opened_here():
                return turn.lock.execute(query, params).fetchall()
            for attempt in (1, 2):
                conn = None
                try:
                    with self.pool.connection() as conn:
                        return conn.execute(query, params).fetchall()
                except PoolTimeout:
                    raise
                except psycopg.OperationalError:
                    if attempt == 2 or conn is None or not conn.closed:
                        raise
                    self.pool.check()
        raise AssertionError("unreachable")

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        rows = self._read(thread_id, SELECT_THREAD_SQL, (thread_id,))
        return ThreadRecord(**rows[0]) if rows else None

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        return bool(self._read(thread_id, CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)))

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None) -> list[dict]:
        return self._read(thread_id, LIST_CHECKPOINTS_SQL, (thread_id, before, before, limit))

    def threads_of_user(self, user_id: str) -> list[str]:
        return [row["thread_id"] for row in self._read(None, SELECT_USER_THREADS_SQL, (user_id,))]

    def delete_thread(self, thread_id: str, *, check: Callable[[ThreadRecord | None], object]) -> None:
        with self.turn(thread_id, user_id=None, strategy="enqueue", timeout=self.settings.enqueue_timeout) as turn:
            check(turn.record)
            for statement in DELETE_THREAD_SQL:
                turn.lock.execute(statement, (thread_id,))
        self.saver.message_cache.clear()

    # -- errors --------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str, thread_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except PoolTimeout:
            raise StorageUnavailable(
                f"Could not {action}: no connection to {mask_url(self.url)} within {self.settings.pool_timeout} s; "
                "nothing was written.",
                thread_id=thread_id,
            ) from None
        except psycopg.OperationalError as exc:
            raise StorageUnavailable(
                f"Could not {action} at {mask_url(self.url)}: {_first_line(exc)}; nothing was written.",
                thread_id=thread_id,
            ) from None


def _rollback_quietly(conn: psycopg.Connection) -> None:
    """End an open transaction; a broken connection is left for the pool to discard."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
