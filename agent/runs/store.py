"""Where runs and their events are kept: `RunStore`, one implementation per backend, on the thread storage's
own connections (Postgres pool; SQLite's one connection, also for `memory://`).

Two tables, created by the agent's migrations like every other (`agent.storage.postgres.migrations`,
`agent.storage.sqlite.schema`), so that setup creates them once, under its own lock, and re-creates them
with the rest when one was dropped (a statement that finds a table missing makes the storage run its
setup again and retries). They hold short-lived data (kept `response_events_seconds` after a turn ends,
then swept), never a thread's history. (They were first created by this store on first use, which kept
them out of that repair; nothing else depended on it.)

* `agent_runs`: one row per streamed or background turn, keyed by its response id: owner, status, why it
  ended (`reason`), whether a cancel was asked, its lease (`expires_at`, renewed by the process that runs it;
  a run whose lease passed was on a process that died: it reads `failed`), and what its response objects
  need (`request`: instructions, previous_response_id; `checkpoint_id` once committed).
* `agent_run_events`: the run's event log, in rows numbered from 0 (`seq`), each a compact batch of the turn's
  events (`agent.runs.log`), written as the turn runs.

Times are the database's clock on Postgres (`clock_timestamp()`: replicas' clocks may differ) and the
machine's on SQLite (one machine).
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: The statuses of a run, as OpenAI's `Response.status`.
FINAL = frozenset({"completed", "failed", "cancelled", "incomplete"})
LIVE = frozenset({"queued", "in_progress"})


@dataclass(frozen=True)
class Run:
    """One run (a streamed or background turn) as stored. `expired`: its lease passed while it was live."""

    response_id: str
    user_id: str | None
    status: str
    background: bool
    thread_id: str | None = None
    checkpoint_id: str | None = None
    reason: str | None = None
    code: str | None = None
    cancel_requested: bool = False
    request: dict[str, Any] = field(default_factory=dict)
    expired: bool = False

    @property
    def final(self) -> bool:
        return self.status in FINAL or self.expired

    def seen(self) -> Run:
        """The run as a reader reports it: a live run whose lease passed `failed`, saying why."""
        if self.status in LIVE and self.expired:
            return Run(**{**self.__dict__, "status": "failed", "code": "lease_expired",
                          "reason": "The server running this turn stopped (its lease expired); nothing was written."})  # fmt: skip
        return self


class RunStore(ABC):
    """Runs and their event logs on one database. Every method is a short blocking call; errors propagate
    as the storage's (`StorageUnavailable`)."""

    def __init__(self, lease_seconds: float, keep_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self.keep_seconds = keep_seconds
        self._ready = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    self.setup()
                    self._ready = True

    @abstractmethod
    def setup(self) -> None:
        """Make sure the storage's setup ran (it creates the run tables). Idempotent; safe from several processes."""

    @abstractmethod
    def create(self, run: Run) -> None:
        """Insert `run` (its thread too, when known: deleting the thread deletes it) with a lease of `lease_seconds`."""

    @abstractmethod
    def get(self, response_id: str) -> Run | None:
        """The run, None when unknown (or swept)."""

    @abstractmethod
    def start(self, response_id: str) -> bool:
        """queued -> in_progress; False when the run is no longer queued (it was cancelled meanwhile)."""

    @abstractmethod
    def finish(self, response_id: str, status: str, *, reason: str | None = None, code: str | None = None,
               thread_id: str | None = None, checkpoint_id: str | None = None, whole: bytes | None = None,
               last_seq: int = -1) -> None:  # fmt: skip
        """Record the run's end (`status` one of FINAL); it then expires `keep_seconds` later. With `whole`, in
        the same transaction, the rows up to `last_seq` are replaced by row `last_seq + 1` holding `whole`
        (the whole log compacted: `agent.runs.log`)."""

    @abstractmethod
    def cancel_queued(self, response_id: str) -> bool:
        """queued -> cancelled, atomically; whether it was queued."""

    @abstractmethod
    def request_cancel(self, response_id: str) -> bool:
        """Flag a running run for cancelling (its process stops it); whether it was in progress."""

    @abstractmethod
    def renew(self, response_ids: Sequence[str]) -> dict[str, bool]:
        """Extend the leases of these runs that are live; each live one's id -> whether its cancel was asked (the
        ids missing are no longer live: ended, cancelled while queued, deleted)."""

    @abstractmethod
    def append(self, response_id: str, seq: int, payload: bytes) -> None:
        """Add the event log's row `seq` (0, 1, 2, ... in order)."""

    @abstractmethod
    def rows(self, response_id: str, after: int) -> list[tuple[int, bytes]]:
        """The event log's rows with `seq > after`, in order."""

    @abstractmethod
    def delete(self, response_id: str) -> bool:
        """Delete the run and its events; whether there was one."""

    @abstractmethod
    def forget(self, *, user_id: str | None = None, thread_id: str | None = None) -> int:
        """Delete every run of `user_id` (when given) or of `thread_id` (when given), with its events: a run's
        events hold its turn's text, which `delete_thread` and `delete_user_data` promise to remove. How many runs.

        Raises:
            ValueError: neither is given."""

    @abstractmethod
    def sweep(self) -> int:
        """Delete runs that ended more than `keep_seconds` ago (and live runs whose lease passed that long
        ago), with their events; how many runs."""


# -- Postgres -----------------------------------------------------------------------------------------
PG_CREATE_SQL = """
INSERT INTO agent_runs (response_id, user_id, status, background, thread_id, request, expires_at)
VALUES (%(response_id)s, %(user_id)s, %(status)s, %(background)s, %(thread_id)s, %(request)s,
        clock_timestamp() + make_interval(secs => %(lease)s))
ON CONFLICT DO NOTHING
"""
PG_GET_SQL = """
SELECT response_id, user_id, status, background, thread_id, checkpoint_id, reason, code, cancel_requested, request,
       expires_at < clock_timestamp() AS expired
FROM agent_runs WHERE response_id = %s
"""
PG_START_SQL = "UPDATE agent_runs SET status = 'in_progress' WHERE response_id = %s AND status = 'queued'"
PG_FINISH_SQL = """
UPDATE agent_runs SET status = %(status)s, reason = %(reason)s, code = %(code)s,
    thread_id = coalesce(%(thread_id)s, thread_id), checkpoint_id = coalesce(%(checkpoint_id)s, checkpoint_id),
    expires_at = clock_timestamp() + make_interval(secs => %(keep)s)
WHERE response_id = %(response_id)s AND status IN ('queued', 'in_progress')
"""
PG_CANCEL_QUEUED_SQL = """
UPDATE agent_runs SET status = 'cancelled', reason = %s, code = 'cancelled',
    expires_at = clock_timestamp() + make_interval(secs => %s)
WHERE response_id = %s AND status = 'queued' AND expires_at >= clock_timestamp()
"""
PG_REQUEST_CANCEL_SQL = """
UPDATE agent_runs SET cancel_requested = true
WHERE response_id = %s AND status = 'in_progress' AND expires_at >= clock_timestamp()
"""
PG_RENEW_SQL = """
UPDATE agent_runs SET expires_at = clock_timestamp() + make_interval(secs => %s)
WHERE response_id = ANY(%s::text[]) AND status IN ('queued', 'in_progress')
RETURNING response_id, cancel_requested
"""
PG_COMPACT_SQL = "DELETE FROM agent_run_events WHERE response_id = %s AND seq <= %s"
# A retry after a connection lost with the insert committed (`storage.run` retries once) inserts nothing.
PG_APPEND_SQL = "INSERT INTO agent_run_events (response_id, seq, payload) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
PG_ROWS_SQL = "SELECT seq, payload FROM agent_run_events WHERE response_id = %s AND seq > %s ORDER BY seq"
PG_DELETE_SQL = """
WITH events AS (DELETE FROM agent_run_events WHERE response_id = %(id)s)
DELETE FROM agent_runs WHERE response_id = %(id)s
"""
#: `forget`: the runs of a user (`column` user_id) or of a thread (thread_id), with their events.
PG_FORGET_SQL = """
WITH gone AS (DELETE FROM agent_runs WHERE {column} = %s RETURNING response_id),
events AS (DELETE FROM agent_run_events WHERE response_id IN (SELECT response_id FROM gone))
SELECT count(*) AS n FROM gone
"""
PG_SWEEP_SQL = """
WITH gone AS (
    DELETE FROM agent_runs WHERE expires_at < clock_timestamp() - make_interval(secs => %s) RETURNING response_id
), events AS (DELETE FROM agent_run_events WHERE response_id IN (SELECT response_id FROM gone))
SELECT count(*) AS n FROM gone
"""
# A finished run's expiry is its end + keep_seconds; a live run's is its lease, kept as long again after it passed.
PG_SWEEP_FINISHED_SQL = """
WITH gone AS (
    DELETE FROM agent_runs WHERE status IN ('completed', 'failed', 'cancelled', 'incomplete')
        AND expires_at < clock_timestamp() RETURNING response_id
), events AS (DELETE FROM agent_run_events WHERE response_id IN (SELECT response_id FROM gone))
SELECT count(*) AS n FROM gone
"""


class PostgresRunStore(RunStore):
    """`RunStore` on a `PostgresThreadStorage`'s pool (`storage.run`: a dead connection is retried once, so
    every statement here is safe to repeat or is one whose repetition fails harmlessly)."""

    def __init__(self, storage: Any, lease_seconds: float, keep_seconds: float) -> None:
        super().__init__(lease_seconds, keep_seconds)
        self.storage = storage

    def _run(self, action: str, work: Any) -> Any:
        self.ensure()
        return self.storage.run(action, work)  # on the storage pool's threads: never inside a commit

    def setup(self) -> None:
        self.storage.setup()  # the run tables are among the agent's migrations

    def create(self, run: Run) -> None:
        params = {"response_id": run.response_id, "user_id": run.user_id, "status": run.status, "background": run.background,
                  "thread_id": run.thread_id, "request": json.dumps(run.request), "lease": self.lease_seconds}  # fmt: skip
        self._run("record the run", lambda conn: conn.execute(PG_CREATE_SQL, params))

    def get(self, response_id: str) -> Run | None:
        row = self._run("read the run", lambda conn: conn.execute(PG_GET_SQL, (response_id,)).fetchone())
        return None if row is None else Run(**row)

    def start(self, response_id: str) -> bool:
        return self._run("start the run", lambda conn: conn.execute(PG_START_SQL, (response_id,)).rowcount) == 1

    def finish(self, response_id, status, *, reason=None, code=None, thread_id=None, checkpoint_id=None, whole=None, last_seq=-1) -> None:
        params = {"response_id": response_id, "status": status, "reason": reason, "code": code,
                  "thread_id": thread_id, "checkpoint_id": checkpoint_id, "keep": self.keep_seconds}  # fmt: skip

        def finish(conn: Any) -> None:
            with conn.transaction():
                conn.execute(PG_FINISH_SQL, params)
                if whole is not None:
                    conn.execute(PG_COMPACT_SQL, (response_id, last_seq))
                    conn.execute(PG_APPEND_SQL, (response_id, last_seq + 1, whole))

        self._run("record the run's end", finish)

    def cancel_queued(self, response_id: str) -> bool:
        params = ("Cancelled (POST /responses/{id}/cancel) before it started; nothing was written.", self.keep_seconds, response_id)
        return self._run("cancel the run", lambda conn: conn.execute(PG_CANCEL_QUEUED_SQL, params).rowcount) == 1

    def request_cancel(self, response_id: str) -> bool:
        return self._run("cancel the run", lambda conn: conn.execute(PG_REQUEST_CANCEL_SQL, (response_id,)).rowcount) == 1

    def renew(self, response_ids: Sequence[str]) -> dict[str, bool]:
        rows = self._run("renew runs", lambda conn: conn.execute(PG_RENEW_SQL, (self.lease_seconds, list(response_ids))).fetchall())
        return {row["response_id"]: row["cancel_requested"] for row in rows}

    def append(self, response_id: str, seq: int, payload: bytes) -> None:
        self._run("record the run's events", lambda conn: conn.execute(PG_APPEND_SQL, (response_id, seq, payload)))

    def rows(self, response_id: str, after: int) -> list[tuple[int, bytes]]:
        rows = self._run("read the run's events", lambda conn: conn.execute(PG_ROWS_SQL, (response_id, after)).fetchall())
        return [(row["seq"], bytes(row["payload"])) for row in rows]

    def delete(self, response_id: str) -> bool:
        return self._run("delete the run", lambda conn: conn.execute(PG_DELETE_SQL, {"id": response_id}).rowcount) == 1

    def forget(self, *, user_id: str | None = None, thread_id: str | None = None) -> int:
        column, value = _forget_key(user_id, thread_id)
        statement = PG_FORGET_SQL.format(column=column)
        return self._run("delete the runs", lambda conn: conn.execute(statement, (value,)).fetchone()["n"])

    def sweep(self) -> int:
        def sweep(conn: Any) -> int:
            return conn.execute(PG_SWEEP_FINISHED_SQL).fetchone()["n"] + conn.execute(PG_SWEEP_SQL, (self.keep_seconds,)).fetchone()["n"]

        return self._run("sweep ended runs", sweep)


# -- SQLite -------------------------------------------------------------------------------------------
SQLITE_COLUMNS = "response_id, user_id, status, background, thread_id, checkpoint_id, reason, code, cancel_requested, request"
LIVE_IN = "('queued', 'in_progress')"
FINAL_IN = "('completed', 'failed', 'cancelled', 'incomplete')"


class SqliteRunStore(RunStore):
    """`RunStore` on a `SqliteThreadStorage`'s one connection (its saver's lock; a short transaction per write)."""

    def __init__(self, storage: Any, lease_seconds: float, keep_seconds: float) -> None:
        super().__init__(lease_seconds, keep_seconds)
        self.storage = storage

    def _transaction(self, work: Any) -> Any:
        """`work(cursor)` in one write transaction, run again once if setup had to re-create a dropped table."""

        def attempt() -> Any:
            with self.storage.saver.transaction() as cur:
                return work(cur)

        return self.storage._repairing(attempt)  # the storage's errors (`StorageUnavailable`), after its setup

    def _write(self, statement: str, params: Sequence[Any]) -> int:
        return self._transaction(lambda cur: cur.execute(statement, params).rowcount)

    def _read(self, statement: str, params: Sequence[Any]) -> list[tuple]:
        def attempt() -> list[tuple]:
            with self.storage.saver.cursor(transaction=False) as cur:
                return cur.execute(statement, params).fetchall()

        return self.storage._repairing(attempt)

    def setup(self) -> None:
        self.storage.setup()  # the run tables are among the agent's migrations

    def create(self, run: Run) -> None:
        self._write(f"INSERT OR IGNORE INTO agent_runs ({SQLITE_COLUMNS}, expires_at) VALUES (?, ?, ?, ?, ?, NULL, NULL, NULL, 0, ?, ?)",
                    (run.response_id, run.user_id, run.status, int(run.background), run.thread_id, json.dumps(run.request),
                     time.time() + self.lease_seconds))  # fmt: skip

    def get(self, response_id: str) -> Run | None:
        rows = self._read(f"SELECT {SQLITE_COLUMNS}, expires_at < ? FROM agent_runs WHERE response_id = ?", (time.time(), response_id))
        if not rows:
            return None
        (rid, user, status, background, thread, checkpoint, reason, code, cancel, request, expired) = rows[0]
        return Run(rid, user, status, bool(background), thread, checkpoint, reason, code, bool(cancel), json.loads(request), bool(expired))

    def start(self, response_id: str) -> bool:
        return self._write("UPDATE agent_runs SET status = 'in_progress' WHERE response_id = ? AND status = 'queued'", (response_id,)) == 1

    def finish(self, response_id, status, *, reason=None, code=None, thread_id=None, checkpoint_id=None, whole=None, last_seq=-1) -> None:
        def work(cur: Any) -> None:
            cur.execute(
                f"""UPDATE agent_runs SET status = ?, reason = ?, code = ?, thread_id = coalesce(?, thread_id),
                    checkpoint_id = coalesce(?, checkpoint_id), expires_at = ? WHERE response_id = ? AND status IN {LIVE_IN}""",
                (status, reason, code, thread_id, checkpoint_id, time.time() + self.keep_seconds, response_id),
            )
            if whole is not None:
                cur.execute("DELETE FROM agent_run_events WHERE response_id = ? AND seq <= ?", (response_id, last_seq))
                cur.execute("INSERT INTO agent_run_events (response_id, seq, payload) VALUES (?, ?, ?)", (response_id, last_seq + 1, whole))

        self._transaction(work)

    def cancel_queued(self, response_id: str) -> bool:
        reason = "Cancelled (POST /responses/{id}/cancel) before it started; nothing was written."
        return self._write(
            "UPDATE agent_runs SET status = 'cancelled', reason = ?, code = 'cancelled', expires_at = ? "
            "WHERE response_id = ? AND status = 'queued' AND expires_at >= ?",
            (reason, time.time() + self.keep_seconds, response_id, time.time()),
        ) == 1

    def request_cancel(self, response_id: str) -> bool:
        return self._write(
            "UPDATE agent_runs SET cancel_requested = 1 WHERE response_id = ? AND status = 'in_progress' AND expires_at >= ?",
            (response_id, time.time()),
        ) == 1

    def renew(self, response_ids: Sequence[str]) -> dict[str, bool]:
        ids = json.dumps(list(response_ids))
        self._write(f"UPDATE agent_runs SET expires_at = ? WHERE response_id IN (SELECT value FROM json_each(?)) AND status IN {LIVE_IN}",
                    (time.time() + self.lease_seconds, ids))  # fmt: skip
        rows = self._read(f"SELECT response_id, cancel_requested FROM agent_runs WHERE response_id IN (SELECT value FROM json_each(?)) "
                          f"AND status IN {LIVE_IN}", (ids,))  # fmt: skip
        return {row[0]: bool(row[1]) for row in rows}

    def append(self, response_id: str, seq: int, payload: bytes) -> None:
        self._write("INSERT OR IGNORE INTO agent_run_events (response_id, seq, payload) VALUES (?, ?, ?)", (response_id, seq, payload))

    def rows(self, response_id: str, after: int) -> list[tuple[int, bytes]]:
        rows = self._read("SELECT seq, payload FROM agent_run_events WHERE response_id = ? AND seq > ? ORDER BY seq", (response_id, after))
        return [(seq, bytes(payload)) for seq, payload in rows]

    def delete(self, response_id: str) -> bool:
        def work(cur: Any) -> bool:
            cur.execute("DELETE FROM agent_run_events WHERE response_id = ?", (response_id,))
            return cur.execute("DELETE FROM agent_runs WHERE response_id = ?", (response_id,)).rowcount == 1

        return self._transaction(work)

    def forget(self, *, user_id: str | None = None, thread_id: str | None = None) -> int:
        column, value = _forget_key(user_id, thread_id)
        gone = f"SELECT response_id FROM agent_runs WHERE {column} = ?"

        def work(cur: Any) -> int:
            cur.execute(f"DELETE FROM agent_run_events WHERE response_id IN ({gone})", (value,))
            return cur.execute(f"DELETE FROM agent_runs WHERE {column} = ?", (value,)).rowcount

        return self._transaction(work)

    def sweep(self) -> int:
        now = time.time()
        gone = (f"SELECT response_id FROM agent_runs WHERE (status IN {FINAL_IN} AND expires_at < ?) "
                "OR (expires_at < ?)")  # fmt: skip

        def work(cur: Any) -> int:
            cur.execute(f"DELETE FROM agent_run_events WHERE response_id IN ({gone})", (now, now - self.keep_seconds))
            return cur.execute(f"DELETE FROM agent_runs WHERE response_id IN ({gone})", (now, now - self.keep_seconds)).rowcount

        return self._transaction(work)


def _forget_key(user_id: str | None, thread_id: str | None) -> tuple[str, str]:
    """The column and value `forget` deletes by (a fixed column name: never caller text in the SQL)."""
    if user_id is not None:
        return "user_id", user_id
    if thread_id is not None:
        return "thread_id", thread_id
    raise ValueError("forget needs a user_id or a thread_id")


#: Seconds a run's lease outlasts its thread's claim. Both are renewed by the process that runs the turn, the
#: run every half second and the claim every `lease_seconds / 3`, so when that process dies the claim may
#: have been renewed a moment after the run; with the same lease the run could read `failed` (lease
#: expired) while its thread still refused a new turn as busy (seen in a suite run under load).
RUN_LEASE_MARGIN_SECONDS = 1.0


def open_run_store(storage: Any, settings: Any) -> RunStore:
    """The `RunStore` for the thread storage's backend; runs' leases are `lease_seconds` + `RUN_LEASE_MARGIN_SECONDS`."""
    postgres = type(storage).__module__.startswith("agent.storage.postgres")  # without importing psycopg for SQLite
    cls = PostgresRunStore if postgres else SqliteRunStore
    return cls(storage, settings.lease_seconds + RUN_LEASE_MARGIN_SECONDS, settings.response_events_seconds)
