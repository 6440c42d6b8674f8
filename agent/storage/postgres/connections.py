"""`PostgresConnections`: one storage's pool, its credentials, and how a fault becomes `StorageUnavailable`.

Why the pool needs more than `psycopg_pool` gives it (see "Faults" and
"Managed credentials" in the package docstring):

* **An unreachable server fails after `connect_timeout`, not `pool_timeout`.**
  A checkout that would wait first asks whether a new connection can be opened
  at all (`reachable`), and after a fault every checkout does, until one works.
* **Dead connections are found before anything is sent on them.** A live idle
  connection has nothing to read; one the server ended holds its FATAL message
  or end of file. `checkout_live` polls for that (one `poll()` call), so a
  commit is never sent on a connection a restart or a killed backend left.
* **No round trip waits forever.** Connections are `round_trips.DeadlineConnection`s with libpq's TCP
  keepalives and `tcp_user_timeout` (`round_trips` says why both): a database that stops answering
  fails the request with `NoReply` (as `StorageUnavailable`) after `statement_timeout_ms` +
  `reply_timeout`, and marks the server suspect, so the next checkout first checks that it answers.
* **The reason in the error.** A missing database or role is not a timeout:
  `unreachable` says what the last attempt to connect said.
* **Managed credentials.** With a `credential_provider` the pool's connection
  kwargs are a callable (psycopg_pool >= 3.3) returning a password cached by
  `CachedCredential`, so every new connection gets a fresh or cached token.

`faults` is the one mapping from psycopg's errors to the agent's: pool
timeouts, missing privileges, a read-only server, a missing table and a lost
connection each say what could not be done, where, and that nothing was written.
"""

from __future__ import annotations

import logging
import math
import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from agent.config import AgentSettings, mask_url
from agent.errors import StorageUnavailable
from agent.storage.postgres.round_trips import (
    DeadlineConnection,
    NoReply,
    bounded,
    round_trip_deadline,
    tcp_liveness,
    with_deadline,
)

#: Errors after which the server rolled the transaction back and running it again is safe.
ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)

#: Errors that mean a table or function of the schema is missing (dropped by hand): setup re-creates it.
SCHEMA_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)

logger = logging.getLogger(__name__)


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


class PostgresConnections:
    """The connection pool of one storage on `conninfo` (a `postgresql://` URL or a libpq `key=value` string).

    The pool is created closed (`open=False`); the storage's setup opens it. `masked` is `conninfo` with its
    password masked, for messages.
    """

    def __init__(self, conninfo: str, settings: AgentSettings) -> None:
        self.conninfo = conninfo
        self.masked = mask_url(conninfo)
        self.settings = settings
        # libpq reads connect_timeout in whole seconds, and treats values under 2 as 2. Python text is
        # Unicode: a database or role whose default client_encoding is another one (LATIN1) made psycopg
        # fail on text it had just written, or could not write.
        base_kwargs = {
            "autocommit": True,
            "client_encoding": "UTF8",
            "prepare_threshold": settings.prepare_threshold,
            "row_factory": dict_row,
            "connect_timeout": max(2, math.ceil(settings.connect_timeout)),
            "options": with_statement_timeout(conninfo, settings.statement_timeout_ms),
            **tcp_liveness(conninfo, settings.reply_timeout),
        }
        #: How long a round trip on one of these connections may wait for its answer (`round_trips`).
        self.deadline = round_trip_deadline(settings.statement_timeout_ms, settings.reply_timeout)
        self._credential: Callable[[], str] | None = None
        kwargs: Any = base_kwargs
        if settings.credential_provider is not None:
            credential = CachedCredential(settings.credential_provider, settings.credential_cache_seconds)
            self._credential = credential
            kwargs = lambda: {**base_kwargs, "password": credential()}  # noqa: E731 - psycopg_pool calls it per connection
        self._base_kwargs = base_kwargs
        self._kwargs = kwargs
        self.pool = ConnectionPool(
            conninfo,
            kwargs=kwargs,
            connection_class=DeadlineConnection,
            configure=self._configure,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout,
            max_lifetime=settings.pool_max_lifetime,
            open=False,
            name="timetravel-agent",
        )
        #: Set when a connection failed: the next checkout first checks that the server answers at all.
        self.suspect_down = False
        self._connect_error: str | None = None

    def _configure(self, conn: DeadlineConnection) -> None:
        """The pool's hook for each new connection: its round trips get the pool's deadline."""
        with_deadline(conn, self.deadline, self.settings.statement_timeout_ms / 1000)

    def connect(self, *, unlimited: bool = False) -> psycopg.Connection:
        """A new connection outside the pool, with the pool's settings (bounded by `connect_timeout`, its round
        trips by the pool's deadline); with `unlimited`, without `statement_timeout_ms` nor a deadline (for
        setup's index builds, which take as long as the table).

        Raises:
            psycopg.OperationalError: the server cannot be reached, or refused the connection.
        """
        kwargs = dict(self._base_kwargs)
        if unlimited:
            kwargs["options"] = with_statement_timeout(self.conninfo, 0)
        if self._credential is not None:
            kwargs["password"] = self._credential()
        conn = DeadlineConnection.connect(self.conninfo, **kwargs)
        if unlimited:
            return with_deadline(conn, None)
        return with_deadline(conn, self.deadline, self.settings.statement_timeout_ms / 1000)

    def reachable(self) -> bool:
        """Whether a new connection can be opened now (one attempt, bounded by connect_timeout; a second one
        without `statement_timeout_ms` when a pooler refused the option that carries it, see below)."""
        try:
            self.connect().close()
        except psycopg.OperationalError as exc:
            if not (self._refused_timeout_option(exc) and self.reachable()):
                self.suspect_down = True
                self._connect_error = server_reason(exc)
                return False
        self.suspect_down = False
        return True

    def _refused_timeout_option(self, exc: psycopg.OperationalError) -> bool:
        """Whether `exc` is a pooler refusing the `options` startup parameter that only `statement_timeout_ms`
        put there; if so, the pool's connections go without it from now on, with a warning.

        PgBouncer in its default configuration refuses any startup parameter it does not know ("unsupported
        startup parameter: options"), and releases before the timeout existed connected through it: refusing
        to start would break such a deployment on upgrade, for a safeguard. The warning says how to have it
        (`ALTER ROLE ... SET statement_timeout`, which holds behind any pooler).
        """
        reason = server_reason(exc)
        ours = self._base_kwargs.get("options")
        without = with_statement_timeout(self.conninfo, 0)
        if "unsupported startup parameter" not in reason or "options" not in reason or ours == without or without:
            return False
        # The pool's kwargs are this dict (or a function reading it): its next connections see the change.
        self._base_kwargs["options"] = None
        logger.warning(
            "%s refused the connection option -c statement_timeout (a pooler such as PgBouncer); connecting "
            "without it: statement_timeout_ms=%s is not applied. Set it on the role instead "
            "(ALTER ROLE ... SET statement_timeout = '30s'), or set statement_timeout_ms=0 to silence this.",
            self.masked, self.settings.statement_timeout_ms,
        )  # fmt: skip
        return True

    def unreachable(self) -> str:
        """What the last failed connection attempt said, for errors: a missing database or role is not a timeout."""
        reason = self._connect_error or "no connection"
        if "timeout" in reason or reason == "no connection":
            reason += f" (connect_timeout {self.settings.connect_timeout:g} s)"
        elif "unsupported startup parameter" in reason and "options" in reason:
            reason += STARTUP_OPTION_HINT
        return f"Could not connect to {self.masked}: {reason}"

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection for one short piece of work (never across a model call), rolled back after."""
        conn = self.checkout()
        try:
            yield conn
        except NoReply:
            self.suspect_down = True  # the next checkout first checks that the server answers at all
            raise
        finally:
            self.checkin(conn)

    def checkout(self) -> psycopg.Connection:
        """A pooled connection; give it back with `checkin`.

        Raises:
            StorageUnavailable: the server is unreachable (within `connect_timeout`); nothing was written.
            PoolTimeout: no connection was free within `pool_timeout` (`faults` words it).
        """
        # An unreachable server must fail within connect_timeout, not after
        # pool_timeout of the pool retrying in the background.
        if self.suspect_down and not self.reachable():
            raise StorageUnavailable(f"{self.unreachable()}; nothing was written; the request can be retried.")
        wait = min(self.settings.connect_timeout, self.settings.pool_timeout)
        try:
            return self.pool.getconn(timeout=wait)
        except PoolTimeout:
            if not self.reachable():
                raise StorageUnavailable(f"{self.unreachable()}; nothing was written; the request can be retried.") from None
        return self.pool.getconn(timeout=max(0.1, self.settings.pool_timeout - wait))

    def checkout_live(self) -> psycopg.Connection:
        """A pooled connection the server has not already ended; dead ones are discarded (see the module docstring).

        Raises:
            StorageUnavailable, PoolTimeout: no connection could be had (as `checkout`).
        """
        for _ in range(self.settings.pool_max_size + 1):
            conn = self.checkout()
            if not ended_by_server(conn):
                return conn
            conn.close()
            self.pool.putconn(conn)  # the pool drops it and opens another
            self.discard_dead()  # and the other idle connections the same fault ended
        return self.checkout()

    def checkin(self, conn: psycopg.Connection) -> None:
        """Give a checked-out connection back, its open transaction (if any) rolled back."""
        rollback_quietly(conn)
        self.pool.putconn(conn)

    def discard_dead(self) -> None:
        """After a connection was found dead: drop the idle ones the same fault ended, and check the server
        answers before the next checkout."""
        self.suspect_down = True
        with bounded(self.settings.reply_timeout):  # an empty query each: no statement to wait for
            self.pool.check()

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def faults(
        self, action: str, thread_id: str | None = None, *, on_schema_missing: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """Turn psycopg's errors inside the block into `StorageUnavailable` saying what could not be done (`action`).

        `on_schema_missing` is called when a table or function is missing, before the error is raised (the
        storage forgets its setup, so the next request re-creates what is missing).
        """
        try:
            yield
        except PoolTimeout:
            raise StorageUnavailable(
                f"Could not {action}: no free connection to {self.masked} within {self.settings.pool_timeout} s; "
                "nothing was written.",
                thread_id=thread_id,
            ) from None
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
            reason = "the database is read-only" if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) else (
                "the database role lacks a privilege"
            )
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {reason} ({first_line(exc)}); nothing was written.",
                thread_id=thread_id,
            ) from None
        except psycopg.errors.QueryCanceled as exc:
            # statement_timeout_ms (or a cancel): the server ended the statement and rolled its transaction back.
            limit = f" (statement_timeout_ms is {self.settings.statement_timeout_ms})" if "timeout" in str(exc) else ""
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {first_line(exc)}{limit}; nothing was written; "
                "the request can be retried.",
                thread_id=thread_id,
            ) from None
        except SCHEMA_MISSING as exc:
            if on_schema_missing is not None:
                on_schema_missing()
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {first_line(exc)}; nothing was written; "
                "the agent re-creates missing tables on the next request.",
                thread_id=thread_id,
            ) from None
        except psycopg.OperationalError as exc:
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {first_line(exc)}; nothing was written.",
                thread_id=thread_id,
            ) from None


#: Said when a pooler refuses the connection option that carries `statement_timeout_ms`.
STARTUP_OPTION_HINT = (
    " (a pooler such as PgBouncer: add `options` to its ignore_startup_parameters and set statement_timeout on "
    "the role instead, or set statement_timeout_ms=0)"
)


def with_statement_timeout(conninfo: str, timeout_ms: int) -> str | None:
    """The libpq `options` for a connection: `-c statement_timeout=<timeout_ms>` (none when 0), then the
    options the connection string or `PGOPTIONS` already gives (a keyword argument replaces both, so they are
    kept here; later settings win). None when there is nothing to send.

    A connection option, not a `SET`: it holds for every statement of the session, reads in autocommit
    included, costs no round trip, and survives the pool replacing connections.
    """
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo).get("options") or os.environ.get("PGOPTIONS", "")
    except psycopg.Error:  # a malformed connection string: connecting says what is wrong with it
        given = ""
    ours = f"-c statement_timeout={timeout_ms}" if timeout_ms > 0 else ""
    return " ".join(part for part in (ours, str(given).strip()) if part) or None


def ended_by_server(conn: psycopg.Connection) -> bool:
    """Whether the server already ended this idle connection. A live idle connection has nothing to read
    (no LISTEN, no settings reported after use); one the server ended holds its FATAL message or end of file.

    poll(), where there is one: select() cannot watch a descriptor numbered 1024 or more, and a busy server has them.
    """
    if conn.closed:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def rollback_quietly(conn: psycopg.Connection) -> None:
    """End an open transaction; a broken connection is left for the pool to discard."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass


#: The prefixes libpq puts before the reason of a failed connection attempt (its `conn->errorMessage`), e.g.
#: `connection failed: connection to server at "db" (10.0.0.5), port 5432 failed: Connection refused`.
_LIBPQ_ATTEMPT = re.compile(r"^(?:connection failed: )?(?:connection to server (?:at|on) .*? failed: )?")


def server_reason(exc: BaseException) -> str:
    """The reason in a libpq connection error: the server's FATAL message (`database "x" does not exist`,
    `password authentication failed …`) when there is one, else its first line without libpq's prefixes
    (`Connection refused`, `received invalid response to SSL negotiation: H`).

    Only the prefixes go: a reason may hold ": " itself (cutting at the last one left "H" of the line
    above, a server that is no Postgres server answering sslmode=require)."""
    text = str(exc).strip()
    if "FATAL:" in text:
        text = text.rsplit("FATAL:", 1)[1].strip()
    first = text.splitlines()[0] if text else ""
    return _LIBPQ_ATTEMPT.sub("", first, count=1).strip() or type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (psycopg's add context and hints on the lines after)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
