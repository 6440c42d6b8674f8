"""Managed Postgres credentials: a credential provider, cached, and pool connections
renewed after `pool_max_lifetime`, across a real `ALTER ROLE ... PASSWORD` rotation.

What the test server can and cannot show: it uses `trust` authentication on
127.0.0.1, so it never checks a password at connect time. These tests therefore
prove, on a real role, that (1) each connection the pool opens carries the
password the provider issued (`conn.info.password`, what libpq sent), (2) after
a rotation and `pool_max_lifetime`, every connection to the server was opened
after the rotation with the new password, which matches the role's SCRAM
verifier in `pg_authid` while the old one no longer does, (3) the provider is
called once per `credential_cache_seconds`, and (4) the conversation goes on
across the rotation. That the server *refuses* an old password needs a
`scram-sha-256` line in pg_hba.conf, which these tests cannot assume.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import sql

from tests.helpers.scenario import TRIP, outputs, say, text_of

MAX_LIFETIME = 1.0  # seconds; psycopg_pool retires a connection up to 5% earlier
CACHE_SECONDS = 0.2


@pytest.fixture
def role(pg_server_url):
    """A login role with a password, owning a database of its own; both dropped afterwards."""
    name = f"tt_cred_{uuid.uuid4().hex[:8]}"
    info = psycopg.conninfo.conninfo_to_dict(pg_server_url)
    url = f"postgresql://{name}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{name}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(_token())))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
    yield SimpleNamespace(name=name, url=url, admin_url=pg_server_url)
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


class TokenService:
    """Stands in for a cloud token API (Lakebase, RDS IAM): hands out the role's current password.

    `rotate()` issues a new one and sets it on the real server with ALTER ROLE.
    """

    def __init__(self, role) -> None:
        self.role = role
        self.issued: list[str] = []
        self.current = ""
        self.rotate()

    def __call__(self) -> str:
        self.issued.append(self.current)
        return self.current

    def rotate(self) -> None:
        self.current = _token()
        with psycopg.connect(self.role.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(self.role.name), sql.Literal(self.current)))


def _token() -> str:
    return "token-" + secrets.token_urlsafe(16)


def scram_accepts(role, password: str) -> bool:
    """Whether `password` matches the role's stored SCRAM-SHA-256 verifier (RFC 5802: H(HMAC(SaltedPassword, "Client Key")))."""
    with psycopg.connect(role.admin_url) as admin:
        stored = admin.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role.name,)).fetchone()[0]
    # SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
    _, iterations_salt, keys = stored.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), base64.b64decode(stored_key))


def backends(role) -> list[dict]:
    """The role's open server connections: pid and backend_start (server clock)."""
    with psycopg.connect(role.admin_url, row_factory=psycopg.rows.dict_row) as admin:
        return admin.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE usename = %s AND datname = %s", (role.name, role.name)
        ).fetchall()


def server_now(role):
    with psycopg.connect(role.admin_url) as admin:
        return admin.execute("SELECT clock_timestamp()").fetchone()[0]


def test_conversation_continues_across_a_password_rotation_and_new_connections_use_the_new_password(role, make_agent):
    tokens = TokenService(role)
    agent = make_agent(
        role.url,
        credential_provider=tokens,
        credential_cache_seconds=CACHE_SECONDS,
        pool_max_lifetime=MAX_LIFETIME,
        pool_min_size=1,
        pool_max_size=2,
    )
    first = say(agent, TRIP[0])
    thread = outputs(first)["thread_id"]
    old_password = tokens.current
    with agent.storage.pool.connection() as conn:
        assert conn.info.password == old_password

    rotated_at = server_now(role)
    tokens.rotate()
    assert scram_accepts(role, tokens.current) and not scram_accepts(role, old_password)
    issued_before = len(tokens.issued)

    # Open connections outlive the rotation (Postgres checks a password only at
    # connect). Once older than max_lifetime the pool retires them: when returned
    # after use, or, idle ones, at its maintenance `check()`.
    time.sleep(MAX_LIFETIME + CACHE_SECONDS)
    second = say(agent, TRIP[1], thread_id=thread)
    agent.storage.pool.check()
    third = say(agent, TRIP[2], thread_id=thread)

    assert outputs(second)["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert outputs(third)["parent_checkpoint_id"] == outputs(second)["checkpoint_id"]
    assert "SF" in text_of(third) and TRIP[0] in text_of(third)
    assert tokens.issued[issued_before:] and set(tokens.issued[issued_before:]) == {tokens.current}
    with agent.storage.pool.connection() as conn:
        assert conn.info.password == tokens.current
    assert _wait_for(lambda: all(b["backend_start"] > rotated_at for b in backends(role)))


def test_provider_is_called_once_per_cache_lifetime_not_per_connection(role, make_agent):
    tokens = TokenService(role)
    agent = make_agent(role.url, credential_provider=tokens, credential_cache_seconds=600, pool_min_size=3, pool_max_size=3)
    say(agent, TRIP[1])
    drained_at = server_now(role)
    agent.storage.pool.drain()  # three new connections, inside the cache lifetime
    assert _wait_for(lambda: len(new := backends(role)) == 3 and all(b["backend_start"] > drained_at for b in new))
    assert tokens.issued == [tokens.current]


def test_provider_is_called_for_every_connection_without_a_cache(role, make_agent):
    tokens = TokenService(role)
    agent = make_agent(role.url, credential_provider=tokens, credential_cache_seconds=0, pool_min_size=3, pool_max_size=3)
    say(agent, TRIP[1])
    issued_before = len(tokens.issued)
    agent.storage.pool.drain()  # the pool replaces its three connections
    assert _wait_for(lambda: len(tokens.issued) - issued_before >= 3)
    assert len(tokens.issued) - issued_before == 3
    assert _wait_for(lambda: len(backends(role)) == 3)


def _wait_for(condition, timeout: float = 20.0) -> bool:
    # Closed connections leave pg_stat_activity a moment after the client hangs up.
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
