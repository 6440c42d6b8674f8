"""The storage's public hooks for code that keeps rows beside the checkpoints (long-term memory does):
statements run through them inside a write transaction commit or roll back with it, and outside one they
run on their own. And the claim keeper that `open_storage` hands each storage serves that storage only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from agent.config import AgentSettings
from agent.storage import ThreadStorage, open_storage
from agent.storage.claims import ClaimKeeper
from agent.storage.postgres import PostgresThreadStorage


class Refused(Exception):
    """Raised inside a transaction to make it roll back."""


@pytest.fixture
def storage(backend_url) -> Iterator[ThreadStorage]:
    opened = open_storage(backend_url, AgentSettings(model="offline"))
    opened.setup()
    yield opened
    opened.close()


def execute(storage: ThreadStorage, statement: str) -> None:
    """One statement through the backend's hook (inside the running write transaction, if any)."""
    if isinstance(storage, PostgresThreadStorage):
        storage.run("run a probe", lambda conn: conn.execute(statement))
    else:
        with storage.cursor() as cur:
            cur.execute(statement)


def rows(storage: ThreadStorage, table: str) -> list[str]:
    query = f"SELECT v FROM {table} ORDER BY v"
    if isinstance(storage, PostgresThreadStorage):
        with storage.cursor() as cur:
            return [row["v"] for row in cur.execute(query).fetchall()]
    with storage.cursor(write=False) as cur:
        return [row[0] for row in cur.execute(query).fetchall()]


@pytest.fixture
def probe(storage) -> Iterator[str]:
    table = f"tt_probe_{uuid.uuid4().hex[:12]}"
    execute(storage, f"CREATE TABLE {table} (v TEXT)")
    yield table
    execute(storage, f"DROP TABLE {table}")


def test_statements_through_the_hook_commit_with_the_write_transaction(storage, probe):
    storage.transaction(lambda tx: execute(storage, f"INSERT INTO {probe} VALUES ('kept')"))
    assert rows(storage, probe) == ["kept"]


def test_statements_through_the_hook_roll_back_with_the_write_transaction(storage, probe):
    def apply(tx) -> None:
        execute(storage, f"INSERT INTO {probe} VALUES ('gone')")
        raise Refused

    with pytest.raises(Refused):
        storage.transaction(apply)
    assert rows(storage, probe) == []


def test_statements_through_the_hook_outside_a_transaction_commit_on_their_own(storage, probe):
    execute(storage, f"INSERT INTO {probe} VALUES ('alone')")
    assert rows(storage, probe) == ["alone"]


def test_each_storage_gets_a_claim_keeper_of_its_own_that_serves_no_other(backend_url):
    settings = AgentSettings(model="offline")
    first, second = open_storage(backend_url, settings), open_storage(backend_url, settings)
    try:
        assert isinstance(first.keeper, ClaimKeeper) and first.keeper is not second.keeper
        with pytest.raises(RuntimeError):
            first.keeper.keep_for(second)
    finally:
        first.close()
        second.close()
