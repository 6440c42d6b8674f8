"""A deadline on every round trip to Postgres, so that a database that stops answering fails a request instead of hanging it.

Why: a query sent on an open connection waits for the server's answer, and
neither libpq nor psycopg bounds that wait. `statement_timeout` is the
server's: a server that never sees the query (a network partition, a frozen
proxy or host, a paused VM) never cancels it, and a connection that is not
closed never fails. The agent then hung on `/ready`, reads and turns for as
long as the network stayed silent.

Two layers, the kernel's first:

* **TCP liveness, from libpq** (`tcp_liveness`): `keepalives` and
  `tcp_user_timeout`, so that a peer that is gone (no ACK, the host died, the
  route dropped) breaks the connection within about `reply_timeout`, even an
  idle one, which `connections.ended_by_server` then finds before a commit is
  sent on it. They cannot see a peer whose kernel still ACKs (a stopped proxy
  or server process, a hung pooler): the data is acknowledged and never
  answered.
* **A deadline on the wait** (`DeadlineConnection`): psycopg's own
  `Connection.wait(timeout=)` (psycopg >= 3.2), which every query, commit and
  pipeline sync goes through. The deadline of a pooled connection is
  `statement_timeout_ms` + `reply_timeout`: the server ends a statement after
  `statement_timeout_ms` and says so, so an answer that has not come
  `reply_timeout` later will not come. A round trip that carries several
  statements whose each may run that long (a `StatementBatch` of a prune's or a
  deletion's deletes, sent as one query) gets `statement_timeout_ms` more for
  each after the first (`carrying`): the server's limit is per statement. A
  turn's commit does not: its statements are single rows of a thread its claim
  keeps other writers away from, and a commit cut short is settled by taking
  the claim back. Past it the connection is closed
  (its protocol state is mid-query: it cannot be reused) and `NoReply` is
  raised, a `psycopg.OperationalError`, which `connections.faults` words as
  `StorageUnavailable`. No cancel request is sent: it would travel the same
  silent route, and the server has already ended the statement by its own
  timeout if it ever saw it. A statement with no limit (`statement_timeout_ms`
  0, setup's migrations and index builds) has no deadline either: the agent
  does not cut short what it was told may run.

The cost on a round trip is one Python call and a context-variable read
(about 0.3 µs; a turn's claim and commit take about 0.5 ms each), with
psycopg's C wait loop doing the timing.

What a deadline cannot undo: the query was sent, and a proxy or kernel may
still deliver it once the network heals. A read does not care; a commit that
timed out is settled by `PostgresThreadStorage` taking its claim back, so a
late commit fails its fencing check and "nothing was written" stays true.

`bounded(seconds)` and `unbounded()` change the deadline of the round trips
of a block on this thread (`/ready`'s check: `reply_timeout` alone; setup's
migrations: none).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg import errors

#: A block's deadline in seconds (`bounded`); `math.inf` for none (`unbounded`); None: each connection's own.
_OVERRIDE: ContextVar[float | None] = ContextVar("tt_round_trip_deadline", default=None)
#: How many statements the block's round trips carry (`carrying`): a batch of several, sent as one query.
_STATEMENTS: ContextVar[int] = ContextVar("tt_round_trip_statements", default=1)

#: psycopg's interval between checks for KeyboardInterrupt while it waits (`psycopg.connection._WAIT_INTERVAL`).
WAIT_INTERVAL = 0.1


class NoReply(psycopg.OperationalError):
    """The database did not answer a round trip within its deadline; the connection was closed."""


class DeadlineConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server ends after `deadline` seconds (None: never),
    closing the connection and raising `NoReply`. Set `deadline` after connecting (`with_deadline`)."""

    deadline: float | None = None
    #: The server's limit on one statement, seconds (`statement_timeout_ms`): what each further statement of
    #: a round trip adds to `deadline` (`carrying`).
    statement_seconds: float = 0.0

    def wait(self, gen: Any, interval: float = WAIT_INTERVAL, timeout: float | None = None) -> Any:
        if timeout is None:  # psycopg's own timed waits (LISTEN's notifies) keep theirs
            timeout = _OVERRIDE.get()
            if timeout is None and self.deadline is not None:
                timeout = self.deadline + (_STATEMENTS.get() - 1) * self.statement_seconds
            if timeout == math.inf:
                timeout = None
        try:
            return super().wait(gen, interval, timeout)
        except errors._WaitTimeout:  # noqa: SLF001 - psycopg's signal that its wait timed out
            self.close()
            raise NoReply(
                f"the database did not answer within {timeout:g} s (reply_timeout; the network or the server "
                "stopped answering without closing the connection)"
            ) from None


def with_deadline(conn: DeadlineConnection, deadline: float | None, statement_seconds: float = 0.0) -> DeadlineConnection:
    """`conn`, its round trips bounded by `deadline` seconds (None: no bound), and by `statement_seconds` more
    for each further statement a round trip carries (`carrying`)."""
    conn.deadline = deadline
    conn.statement_seconds = statement_seconds
    return conn


def round_trip_deadline(statement_timeout_ms: int, reply_timeout: float) -> float | None:
    """The deadline of a round trip under `statement_timeout_ms`: that long plus `reply_timeout`; None
    when statements have no limit (0), since a long statement must then be let run."""
    return statement_timeout_ms / 1000 + reply_timeout if statement_timeout_ms > 0 else None


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Round trips of the block (on this thread, on any `DeadlineConnection`) end after `seconds`."""
    token = _OVERRIDE.set(seconds)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


@contextmanager
def carrying(statements: int) -> Iterator[None]:
    """Round trips of the block send `statements` statements as one query (`batch.StatementBatch`): the server
    limits each of them to `statement_timeout_ms`, so the deadline grows by that much for each after the first
    (a prune of a long thread is several long deletes in one round trip, each within its limit)."""
    token = _STATEMENTS.set(max(1, statements))
    try:
        yield
    finally:
        _STATEMENTS.reset(token)


@contextmanager
def unbounded() -> Iterator[None]:
    """Round trips of the block have no deadline (setup's migrations and index builds, which
    `statement_timeout_ms` does not limit either)."""
    with bounded(math.inf):
        yield


#: The libpq parameters `tcp_liveness` sets (a connection string that gives one keeps its own).
TCP_LIVENESS_KEYS = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")


def tcp_liveness(conninfo: str, reply_timeout: float) -> dict[str, int]:
    """libpq's TCP liveness parameters for connections on `conninfo`, those it does not set itself: data
    unacknowledged for `reply_timeout` breaks the connection (`tcp_user_timeout`, Linux), and an idle one
    is probed after `reply_timeout` of silence (`keepalives_idle`; Linux ends it when the probes go
    unacknowledged for `tcp_user_timeout`, elsewhere after `keepalives_count` probes `keepalives_interval`
    apart). libpq ignores them on a Unix socket.
    """
    seconds = max(1, math.ceil(reply_timeout))  # libpq takes whole seconds for keepalives
    wanted = {
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": seconds,
        "keepalives_count": 3,
        "tcp_user_timeout": max(1, round(reply_timeout * 1000)),
    }
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:  # a malformed connection string: connecting says what is wrong with it
        given = {}
    return {key: value for key, value in wanted.items() if key not in given}
