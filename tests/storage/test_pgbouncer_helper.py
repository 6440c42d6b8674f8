"""The PgBouncer the tests start (tests/helpers/pgbouncer.py) really pools by transaction, and shows
with plain psycopg what breaks there: session state, and prepared statements (`prepare_threshold=0`),
which is why the agent must connect with `prepare_threshold=None`."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.helpers.databases import dbname_of, with_dbname

ADVISORY_KEY = 8_000_001
#: What psycopg raises when a client's statement name exists, or is missing, on the server connection.
PREPARED_STATEMENT_ERRORS = (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)


def _connect(url: str, **kwargs) -> psycopg.Connection:
    kwargs.setdefault("prepare_threshold", None)
    return psycopg.connect(url, connect_timeout=5, autocommit=True, **kwargs)


def _admin_url(bounced_url: str) -> str:
    return with_dbname(bounced_url, "pgbouncer")


def test_the_admin_console_reports_transaction_pooling_for_the_database(pgbouncer_url):
    with _connect(pgbouncer_url) as conn:
        conn.execute("SELECT 1")
    with _connect(_admin_url(pgbouncer_url)) as admin:
        cursor = admin.execute("SHOW POOLS")
        columns = [column.name for column in cursor.description]
        pools = {row[columns.index("database")]: row[columns.index("pool_mode")] for row in cursor.fetchall()}
    assert pools[dbname_of(pgbouncer_url)] == "transaction"


def test_the_url_reaches_the_scratch_database_through_pgbouncer(pgbouncer_url, pg_server_url):
    with _connect(pgbouncer_url) as conn:
        conn.execute("CREATE TABLE marker (value int)")
        conn.execute("INSERT INTO marker VALUES (7)")
    with _connect(with_dbname(pg_server_url, dbname_of(pgbouncer_url))) as direct:
        assert direct.execute("SELECT value FROM marker").fetchall() == [(7,)]


def test_one_client_connection_changes_server_backend_between_transactions(pgbouncer_url):
    with _connect(pgbouncer_url) as client, _connect(pgbouncer_url) as other:
        (first,) = client.execute("SELECT pg_backend_pid()").fetchone()
        # `other` takes the only idle server connection, `first`, and keeps it inside a transaction,
        # so the next transaction of `client` must run on another one. In session mode it could not.
        with other.transaction():
            (held,) = other.execute("SELECT pg_backend_pid()").fetchone()
            (second,) = client.execute("SELECT pg_backend_pid()").fetchone()
    assert held == first
    assert second != first


def test_a_session_advisory_lock_stays_on_a_server_connection_another_client_now_uses(pgbouncer_url):
    with _connect(pgbouncer_url) as client, _connect(pgbouncer_url) as other:
        (locker,) = client.execute("SELECT pg_backend_pid() FROM pg_advisory_lock(%s)", [ADVISORY_KEY]).fetchone()
        with other.transaction():
            # `other` lands on the locking session: it can release a lock it never took...
            (holder,) = other.execute("SELECT pg_backend_pid()").fetchone()
            # ...while `client`'s next statement runs elsewhere and does not hold its own lock.
            (elsewhere, holds) = client.execute(
                "SELECT pg_backend_pid(), EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory'"
                " AND objid = %s AND pid = pg_backend_pid() AND granted)",
                [ADVISORY_KEY],
            ).fetchone()
            (released,) = other.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY]).fetchone()
    assert holder == locker
    assert elsewhere != locker and holds is False
    assert released is True


def _run_interleaved(url: str, prepare_threshold: int | None) -> list[int]:
    """Two clients run the same statement; a third pins the server connection the first prepared on."""
    statement = "SELECT %s::int + 1"
    with (
        _connect(url, prepare_threshold=prepare_threshold) as first,
        _connect(url, prepare_threshold=prepare_threshold) as second,
        _connect(url) as pinner,
    ):
        results = [first.execute(statement, [1]).fetchone()[0]]
        # Same server connection (the only idle one); psycopg names both clients' statement `_pg3_0`.
        results.append(second.execute(statement, [2]).fetchone()[0])
        with pinner.transaction():
            pinner.execute("SELECT 1")
            # `first` believes `_pg3_0` is prepared, but now runs on a new server connection.
            results.append(first.execute(statement, [3]).fetchone()[0])
    return results


def test_prepared_statements_break_behind_transaction_pooling(pgbouncer_url):
    with pytest.raises(PREPARED_STATEMENT_ERRORS):
        _run_interleaved(pgbouncer_url, prepare_threshold=0)


def test_unprepared_statements_work_behind_transaction_pooling(pgbouncer_url):
    assert _run_interleaved(pgbouncer_url, prepare_threshold=None) == [2, 3, 4]


def _run_concurrently(
    url: str, prepare_threshold: int | None, clients: int = 8, rounds: int = 25
) -> list[BaseException]:
    """`clients` threads, each on its own client connection, run the same statement `rounds` times;
    returns the errors raised (a wrong result counts as one)."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with _connect(url, prepare_threshold=prepare_threshold) as conn:
                total = sum(conn.execute("SELECT %s::int * 2", [i]).fetchone()[0] for i in range(rounds))
            if total != rounds * (rounds - 1):
                errors.append(AssertionError(f"wrong total {total}"))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_concurrent_clients_preparing_the_same_statement_collide(pgbouncer_url):
    errors = _run_concurrently(pgbouncer_url, prepare_threshold=0)
    assert errors, "no client hit another client's prepared statement"
    assert all(isinstance(e, PREPARED_STATEMENT_ERRORS) for e in errors), errors


def test_concurrent_clients_without_prepared_statements_get_no_errors(pgbouncer_url):
    assert _run_concurrently(pgbouncer_url, prepare_threshold=None) == []
