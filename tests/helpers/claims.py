"""Holding a thread as another replica would: an unexpired row in `agent_claims`, written with plain SQL;
and waiting for one, as a turn of another replica would (a ticket in `agent_claim_waiters`).

    with other_replica_holds(url, thread_id):
        ...  # every turn on thread_id from this process finds it busy
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

TOKEN = "other-replica"


@contextmanager
def other_replica_holds(url: str, thread_id: str, *, seconds: float = 600) -> Iterator[None]:
    """Claim `thread_id` in the database at `url` (postgresql:// or sqlite:///path) for the block."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO agent_claims (thread_id, token, fence, expires_at) VALUES (?, ?, 1, ?) "
                "ON CONFLICT (thread_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at",
                (thread_id, TOKEN, time.time() + seconds),
            )
        try:
            yield
        finally:
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE agent_claims SET token = '', expires_at = -1 WHERE thread_id = ? AND token = ?", (thread_id, TOKEN))
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_claims (thread_id, token, fence, expires_at) "
            "VALUES (%s, %s, 1, now() + make_interval(secs => %s)) "
            "ON CONFLICT (thread_id) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at",
            (thread_id, TOKEN, seconds),
        )
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE agent_claims SET token = '', expires_at = '-infinity' WHERE thread_id = %s AND token = %s",
                (thread_id, TOKEN),
            )


def is_claimed(url: str, thread_id: str) -> bool:
    """Whether some turn (in any process) holds an unexpired claim on `thread_id` in the database at `url`."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            row = conn.execute(
                "SELECT 1 FROM agent_claims WHERE thread_id = ? AND token <> '' AND expires_at >= ?", (thread_id, time.time())
            ).fetchone()
        return row is not None
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT 1 FROM agent_claims WHERE thread_id = %s AND token <> '' AND expires_at >= now()", (thread_id,)
        ).fetchone()
    return row is not None


@contextmanager
def other_replica_waits(url: str, thread_id: str, *, seconds: float = 600) -> Iterator[None]:
    """Put a waiter of another replica in `thread_id`'s queue (`agent_claim_waiters`) for the block, as a
    turn waiting for the thread there would be; its ticket lives `seconds` unless the block ends first."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO agent_claim_waiters (thread_id, token, expires_at) VALUES (?, ?, ?)",
                (thread_id, TOKEN, time.time() + seconds),
            )
        try:
            yield
        finally:
            with sqlite3.connect(path) as conn:
                conn.execute("DELETE FROM agent_claim_waiters WHERE thread_id = ? AND token = ?", (thread_id, TOKEN))
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_claim_waiters (thread_id, token, expires_at) "
            "VALUES (%s, %s, now() + make_interval(secs => %s))",
            (thread_id, TOKEN, seconds),
        )
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM agent_claim_waiters WHERE thread_id = %s AND token = %s", (thread_id, TOKEN))
