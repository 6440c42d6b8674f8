"""The fault-injection TCP proxy (tests/helpers/tcp_proxy.py) does to plain psycopg what its controls say:
queries pass, a stopped proxy refuses and kills connections, a blackholed one hangs connects."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.helpers.reliability import HANG_TIMEOUT


def _backend_pid(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_queries_reach_the_same_database_through_the_proxy(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    with psycopg.connect(url, connect_timeout=5) as conn:
        (database,) = conn.execute("SELECT current_database()").fetchone()
    assert database == psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    assert f":{pg_proxy.port}/" in url


def test_stop_refuses_new_connections_and_kills_open_ones(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    conn = psycopg.connect(url, connect_timeout=5, autocommit=True)
    try:
        conn.execute("SELECT 1")
        pg_proxy.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert conn.closed
    finally:
        conn.close()


def test_start_after_stop_serves_new_connections_on_the_same_port(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    pg_proxy.stop()
    with pytest.raises(psycopg.OperationalError):
        _backend_pid(url)
    pg_proxy.start()
    assert _backend_pid(url) > 0
    assert "mode=forwarding" in pg_proxy.status()


def test_cut_kills_open_connections_but_new_ones_connect(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        conn.execute("SELECT 1")
        pg_proxy.cut()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert _backend_pid(url) > 0


def test_blackhole_makes_a_connect_hang_until_its_connect_timeout(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    pg_proxy.blackhole()
    # The connect runs in a thread so that a proxy that forwarded, or a timeout that never fires,
    # fails this test instead of hanging it.
    outcome: list[BaseException | str] = []

    def connect() -> None:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            outcome.append("connected")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(HANG_TIMEOUT)
    assert not worker.is_alive(), "connect_timeout=2 did not end a connect to a blackholed proxy"
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.OperationalError), outcome
    assert "timeout" in str(outcome[0]).lower()


def test_blackhole_stalls_open_connections_until_start(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        pg_proxy.blackhole()
        done = threading.Event()
        result: list[object] = []

        def query() -> None:
            result.append(conn.execute("SELECT 42").fetchone()[0])
            done.set()

        worker = threading.Thread(target=query, daemon=True)
        worker.start()
        # Not a timing assertion: the query must not have finished while data is held back.
        assert not done.wait(0.5)
        pg_proxy.start()
        worker.join(HANG_TIMEOUT)
        assert result == [42]


def test_stall_holds_open_connections_and_serves_new_ones_until_start(pg_proxy, pg_url):
    url = pg_proxy.url_for(pg_url)
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        conn.execute("SELECT 1")
        pg_proxy.stall()
        outcome: list[BaseException | int] = []

        def query() -> None:
            try:
                outcome.append(conn.execute("SELECT 41 + 1").fetchone()[0])
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        worker = threading.Thread(target=query, daemon=True)
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not outcome, "a query on a stalled connection was answered"
        assert _backend_pid(url) > 0  # a new connection is served meanwhile

        pg_proxy.start()
        worker.join(HANG_TIMEOUT)
        assert outcome == [42]  # held, not lost
