"""`tt-agent serve --workers N`: N worker processes answer on one port, each with its own
connections to the one database, and a thread's turns continue whichever worker serves them.

Which worker served a request is read from outside, as an operator would: each worker's TCP sockets
(`/proc/<pid>/fd` and `/proc/net/tcp`) against the client ports of `pg_stat_activity`, whose
`state_change` says when each connection last ran a statement, or against the port of the HTTP
client's own connection.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.helpers.databases import dbname_of
from tests.helpers.preloaded import start_agent
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
    """The pids of the processes listening on `base_url`'s port: the workers, each on its own socket."""
    port = int(base_url.rsplit(":", 1)[1])
    return sorted(pid for pid, sockets in _tcp_sockets_by_pid().items() if any(s.listens_on(port) for s in sockets))


def busy_workers(base_url: str, server_url: str, dbname: str, since: float) -> set[int]:
    """Workers with a database connection that ran a statement after `since` (epoch seconds)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT client_port FROM pg_stat_activity WHERE datname = %s AND extract(epoch FROM state_change) > %s",
            (dbname, since),
        ).fetchall()
    active_ports = {port for (port,) in rows}
    sockets = _tcp_sockets_by_pid()
    return {pid for pid in worker_pids(base_url) if {s.local_port for s in sockets.get(pid, [])} & active_ports}


def serving_worker(base_url: str, client_port: int) -> int | None:
    """The pid of the worker holding the server end of the HTTP connection from local port `client_port`."""
    port = int(base_url.rsplit(":", 1)[1])
    for pid, sockets in _tcp_sockets_by_pid().items():
        if any(s.local_port == port and s.remote_port == client_port for s in sockets):
            return pid
    return None


def test_each_worker_listens_on_a_socket_of_its_own_and_the_parent_on_none(served):
    # With one shared socket (uvicorn's process manager), the worker whose event loop wakes first
    # takes the waiting connections; with one socket each, the kernel spreads them (SO_REUSEPORT).
    base, _, _ = served
    port = int(base.rsplit(":", 1)[1])
    workers = worker_pids(base)
    assert len(workers) == WORKERS, workers
    sockets = _tcp_sockets_by_pid()
    listening = {pid: {s.inode for s in sockets[pid] if s.listens_on(port)} for pid in workers}
    assert all(len(inodes) == 1 for inodes in listening.values()), listening
    assert len(set.union(*listening.values())) == WORKERS, listening
    parents = {_ppid(pid) for pid in workers}
    assert len(parents) == 1
    assert not any(s.listens_on(port) for s in sockets.get(parents.pop(), []))


def test_keep_alive_clients_are_served_by_every_worker(served):
    # 16 clients, each on one keep-alive connection opened at the same moment: every worker serves
    # some of them (all on one of two workers by chance: 2 in 2**16).
    base, _, _ = served
    workers = worker_pids(base)
    clients = [httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=1)) for _ in range(16)]

    def conversation(client: httpx.Client) -> tuple[set[int], list[str]]:
        ports, checkpoints, thread_id = set(), [], None
        for n in range(3):
            response = client.post("/responses", json=request(f"keep-alive turn {n}", thread_id=thread_id))
            out = response.json()["custom_outputs"]
            thread_id = out["thread_id"]
            checkpoints.append(out["checkpoint_id"])
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
        return ports, checkpoints

    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            results = list(pool.map(conversation, clients))
        ports = [port for client_ports, _ in results for port in client_ports]
        assert len(ports) == len(clients)  # each client kept its one connection for its three turns
        assert all(all(checkpoints) for _, checkpoints in results)
        serving = [serving_worker(base, port) for port in ports]  # while the connections are still open
    finally:
        for client in clients:
            client.close()
    assert set(serving) == set(workers), serving


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


def test_a_second_server_on_a_workers_port_fails_instead_of_sharing_it(served, tmp_path):
    # SO_REUSEPORT lets any socket of the same user with the option join the port's group: without
    # the plain bind first, this second server would silently take part of the first one's traffic.
    base, _, _ = served
    port = base.rsplit(":", 1)[1]
    command = [sys.executable, "-m", "agent", "serve", "--port", port, "--workers", "2", "--model", "offline"]
    env = {**os.environ, "AGENT_TRACING": "false"}
    env.pop("AGENT_DATABASE_URL", None)  # an embedded SQLite file in tmp_path
    with tempfile.TemporaryFile() as output:
        second = start_agent(command[3:], cwd=tmp_path, env=env, output=output.fileno())  # python -m agent, forked
        try:
            second.wait(timeout=120)
        finally:  # had it joined the port, its workers must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(second.pid, signal.SIGKILL)
            second.wait()
        output.seek(0)
        stderr = output.read().decode(errors="replace")
    assert second.returncode == 3, stderr[-2000:]
    assert "address already in use" in stderr.lower()
    assert len(worker_pids(base)) == WORKERS


def test_workers_on_an_in_memory_store_are_refused_before_the_port_is_bound(tmp_path):
    # Each worker would have a memory:// store of its own: one thread would split into two conversations.
    port = str(free_port())
    command = [sys.executable, "-m", "agent", "serve", "--port", port, "--workers", "2", "--database-url", "memory://"]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "AGENT_TRACING": "false"}, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "memory://" in done.stderr and "--workers" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@dataclass(frozen=True)
class _Socket:
    """One TCP socket of a process, as `/proc/net/tcp` shows it."""

    local_port: int
    remote_port: int
    state: str  # hex, "0A" is LISTEN
    inode: str

    def listens_on(self, port: int) -> bool:
        return self.state == "0A" and self.local_port == port


def _tcp_sockets_by_pid() -> dict[int, list[_Socket]]:
    """The TCP sockets of every process we can read, by pid."""
    by_inode: dict[str, _Socket] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                    by_inode[fields[9]] = _Socket(local, remote, fields[3], fields[9])
    out: dict[int, list[_Socket]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(f"{entry.path}/fd/{fd}") for fd in os.listdir(f"{entry.path}/fd")]
        except OSError:
            continue
        sockets = [by_inode[link[8:-1]] for link in links if link.startswith("socket:[") and link[8:-1] in by_inode]
        if sockets:
            out[int(entry.name)] = sockets
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0
