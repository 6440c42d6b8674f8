"""`tt-agent serve --workers N` (issue 8, item 2): N worker processes answer on one port, each with its own
connections to the one database, and a thread's turns continue whichever worker serves them.

Which worker served a request is read from outside, as an operator would: each worker's TCP sockets
(`/proc/<pid>/fd` and `/proc/net/tcp`) against the client ports of `pg_stat_activity`, whose
`state_change` says when each connection last ran a statement.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.helpers.databases import dbname_of
from tests.helpers.scenario import request
from tests.helpers.servers import free_port, server_process

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")]

WORKERS = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory, pg_server_url):
    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url, prefix="tt_workers") as url:
        port = free_port()
        command = [sys.executable, "-m", "agent", "serve", "--port", str(port), "--workers", str(WORKERS),
                   "--database-url", url, "--model", "offline"]  # fmt: skip
        env = {"AGENT_TRACING": "false", "AGENT_POOL_MIN_SIZE": "1"}
        cwd = tmp_path_factory.mktemp("workers")
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd, startup_timeout=180) as base:
            yield base, url, pg_server_url


def worker_pids(base_url: str) -> list[int]:
    """The pids of the worker processes of the server listening on `base_url`'s port."""
    port = int(base_url.rsplit(":", 1)[1])
    listeners = {pid for pid, ports in _tcp_ports_by_pid().items() if port in ports}
    # The parent holds the listening socket too; the workers are its children.
    return sorted(pid for pid in listeners if _ppid(pid) in listeners)


def busy_workers(base_url: str, server_url: str, dbname: str, since: float) -> set[int]:
    """Workers with a database connection that ran a statement after `since` (epoch seconds)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT client_port FROM pg_stat_activity WHERE datname = %s AND extract(epoch FROM state_change) > %s",
            (dbname, since),
        ).fetchall()
    active_ports = {port for (port,) in rows}
    ports = _tcp_ports_by_pid()
    return {pid for pid in worker_pids(base_url) if ports.get(pid, set()) & active_ports}


def test_workers_answer_on_one_port_from_distinct_processes_and_share_threads(served):
    base, url, server_url = served
    workers = worker_pids(base)
    assert len(workers) == WORKERS, workers
    since = time.time()
    with httpx.Client(base_url=base, timeout=60) as http:
        thread_id = http.post("/responses", json=request("I'm headed to SF!")).json()["custom_outputs"]["thread_id"]

    def turn(n: int) -> dict:
        # A new connection per request: the kernel hands each to whichever worker accepts first.
        with httpx.Client(base_url=base, timeout=60) as client:
            body = request(f"other conversation {n}")
            return client.post("/responses", json=body).json()["custom_outputs"]

    seen: set[int] = set()
    for _ in range(10):  # until both workers have served a turn (each round sends 16 at once)
        with ThreadPoolExecutor(16) as pool:
            assert all(out["checkpoint_id"] for out in pool.map(turn, range(16)))
        seen = busy_workers(base, server_url, dbname_of(url), since)
        if seen == set(workers):
            break
    assert seen == set(workers)

    # One thread, its turns sent on new connections: it continues whichever worker answers.
    parents = []
    for n in range(8):
        with httpx.Client(base_url=base, timeout=60) as client:
            out = client.post("/responses", json=request(f"turn {n}", thread_id=thread_id)).json()["custom_outputs"]
        parents.append((out["parent_checkpoint_id"], out["checkpoint_id"]))
    assert all(parent == previous for (parent, _), (_, previous) in zip(parents[1:], parents[:-1], strict=True))
    with httpx.Client(base_url=base, timeout=60) as http:
        history = http.post(
            "/invocations", json=request(action="get_checkpoint_history", thread_id=thread_id, limit=100)
        ).json()["custom_outputs"]["history"]
    assert [entry["message_count"] for entry in history] == list(range(18, -1, -2))


def _tcp_ports_by_pid() -> dict[int, set[int]]:
    """Local TCP ports of every process we can read, by pid."""
    inode_port: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    inode_port[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    out: dict[int, set[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(f"{entry.path}/fd/{fd}") for fd in os.listdir(f"{entry.path}/fd")]
        except OSError:
            continue
        ports = {inode_port[link[8:-1]] for link in links if link.startswith("socket:[") and link[8:-1] in inode_port}
        if ports:
            out[int(entry.name)] = ports
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0
