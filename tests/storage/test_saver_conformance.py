"""LangGraph's checkpointer conformance suite (`langgraph-checkpoint-conformance`) on our savers and on LangGraph's.

The suite runs a saver's async API only and detects an optional capability
(`delete_thread`, `delete_for_runs`, `copy_thread`, `prune`) by whether the async
method is overridden. Our savers (Postgres, a SQLite file, `memory://`) must have
every capability detected and pass every test, with no database call on the
event loop thread (each async method runs its I/O in a worker thread). LangGraph's
own savers run through the same suite, so that a fault of the suite is told apart
from ours: they must pass what they implement.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES

from agent.config import AgentSettings
from agent.storage import open_storage
from agent.storage.postgres import PostgresThreadStorage
from tests.helpers.databases import fresh_database


class EventLoopIO(AssertionError):
    """A database call was made on the thread running the event loop."""


def _refuse_on_event_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # a worker thread (asyncio.to_thread): no loop runs here
    raise EventLoopIO(f"{what} was called on the event loop thread")


class _GuardedConnection:
    """A sqlite3 connection whose every use off a worker thread fails (`EventLoopIO`)."""

    def __init__(self, conn) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name):
        _refuse_on_event_loop(f"sqlite3.Connection.{name}")
        return getattr(self._conn, name)


def _guard(storage) -> Callable[[], None]:
    """Make every database call of `storage` on the event loop thread fail; returns the undo."""
    if isinstance(storage, PostgresThreadStorage):
        connection = storage.connection

        @contextmanager
        def guarded() -> Iterator:
            _refuse_on_event_loop("PostgresThreadStorage.connection")
            with connection() as conn:
                yield conn

        storage.connection = guarded
        return lambda: setattr(storage, "connection", connection)
    conn = storage.saver.conn
    storage.saver.conn = _GuardedConnection(conn)
    return lambda: setattr(storage.saver, "conn", conn)


def run_suite(name: str, factory: Callable[[], AsyncIterator]) -> dict:
    """Run the whole suite on the saver `factory` yields; per capability (detected, passed, failed, failures)."""
    registered = checkpointer_test(name=name)(factory)
    report = asyncio.run(validate(registered))
    return {
        capability: (result.detected, result.tests_passed, result.tests_failed, list(result.failures))
        for capability, result in report.results.items()
    }


def totals(results: dict) -> tuple[int, int]:
    passed = sum(r[1] for r in results.values())
    return passed, passed + sum(r[2] for r in results.values())


def our_saver_factory(url: str):
    async def factory():
        storage = open_storage(url, AgentSettings(model="offline"))
        storage.setup()  # before the guard: the suite's own set-up, not a saver call
        unguard = _guard(storage)
        try:
            yield storage.saver
        finally:
            unguard()  # closing is the suite's tear-down, not a saver call
            storage.close()

    return factory


@pytest.fixture(params=["postgres", "sqlite", "memory"])
def our_url(request, pg_server_url, tmp_path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_database(pg_server_url) as url:
            yield url
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'conformance.sqlite'}"
    else:
        yield "memory://"


def test_our_savers_pass_every_conformance_test_with_every_capability_detected(our_url, record_property):
    results = run_suite(f"ours:{our_url.split(':')[0]}", our_saver_factory(our_url))
    passed, total = totals(results)
    record_property("conformance", f"{passed}/{total}")
    print(f"\nconformance ours {our_url.split(':')[0]}: {passed}/{total}")
    failures = [f for r in results.values() for f in r[3]]
    assert not failures, failures
    assert {c for c, r in results.items() if r[0]} == {c.value for c in ALL_CAPABILITIES}
    assert passed == total > 0


def _langgraph_factories(pg_server_url: str):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def memory():
        yield InMemorySaver()

    async def sqlite():
        async with AsyncSqliteSaver.from_conn_string(":memory:") as saver:
            yield saver

    async def postgres():
        with fresh_database(pg_server_url, prefix="tt_lg") as url:
            async with AsyncPostgresSaver.from_conn_string(url) as saver:
                await saver.setup()
                yield saver

    return {"InMemorySaver": memory, "AsyncSqliteSaver": sqlite, "AsyncPostgresSaver": postgres}


@pytest.mark.parametrize("name", ["InMemorySaver", "AsyncSqliteSaver", "AsyncPostgresSaver"])
def test_langgraph_savers_pass_what_they_implement(name, pg_server_url, record_property):
    results = run_suite(f"langgraph:{name}", _langgraph_factories(pg_server_url)[name])
    passed, total = totals(results)
    record_property("conformance", f"{passed}/{total}")
    print(f"\nconformance langgraph {name}: {passed}/{total}")
    failures = [f for r in results.values() for f in r[3]]
    assert not failures, failures
    # The base capabilities are what every saver implements; a suite that found fewer would test less.
    assert {c.value for c in BASE_CAPABILITIES} <= {c for c, r in results.items() if r[0]}
    assert passed == total > 0


def test_the_event_loop_guard_catches_a_blocking_call(tmp_path):
    """The guard above is what makes "no blocking call on the event loop" a tested property."""
    storage = open_storage(f"sqlite:///{tmp_path / 'guard.sqlite'}", AgentSettings(model="offline"))
    storage.setup()
    unguard = _guard(storage)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    async def blocking_then_async():
        with pytest.raises(EventLoopIO):
            storage.saver.get_tuple(config)  # the sync method, called on the loop
        return await storage.saver.aget_tuple(config)

    try:
        assert asyncio.run(blocking_then_async()) is None
    finally:
        unguard()
        storage.close()
