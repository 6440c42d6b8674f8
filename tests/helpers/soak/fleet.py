"""The soak's processes: the model, the `tt-agent serve` replicas, and the TCP proxies that let faults cut them.

    clients ──> front proxy i ──> tt-agent serve i ──> Postgres proxy ──> the private cluster
                                         └──> OpenAI stub (the model)

* **The model** is the OpenAI-compatible stub (`tests.helpers.openai_stub`) run as a process
  with a small latency, not the offline model: a turn then spends most of its time waiting on
  an HTTP model call outside the agent's process, as in production, so kills and cuts land
  while turns run (between claim and commit), not only between them; and its replies quote the
  user messages, so the checks can find each turn's messages in what was stored.
* **Each server** (`python -m agent serve`, which is `tt-agent serve`) runs in a process group
  of its own, so `kill -9` (`Server.kill`) takes it with everything it started; it is started
  again on the same port, and its output is appended to `server-<i>.log`.
* **Front proxies** (`tests.helpers.tcp_proxy`), one per server: clients talk to the proxy, so
  `cut()` drops every client connection of that server mid-request, and a killed server's port
  answers like a dead host (the proxy accepts, the upstream connect fails, the client sees the
  connection close).
* **One Postgres proxy** in front of the cluster for all servers: `cut()` kills every server's
  database connection at once, `blackhole()` stalls them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.helpers.openai_stub import free_port, openai_stub_server
from tests.helpers.tcp_proxy import Proxy, tcp_proxy

#: Seconds a (re)started server may take to answer /health: imports are slow on a loaded machine.
STARTUP_TIMEOUT = 180.0

#: Settings of every server (`AGENT_*`): short leases so a killed server's threads are free again
#: soon; a sweeper every second; small pools, so that several replicas fit in the cluster.
SERVER_SETTINGS = {
    "AGENT_TRACING": "false",
    "AGENT_LEASE_SECONDS": "3",
    "AGENT_ENQUEUE_TIMEOUT": "10",
    "AGENT_SWEEP_INTERVAL_SECONDS": "1",
    "AGENT_CONNECT_TIMEOUT": "2",
    "AGENT_POOL_MIN_SIZE": "1",
    "AGENT_POOL_MAX_SIZE": "4",
    "AGENT_POOL_TIMEOUT": "10",
}

#: The first line of a log record (uvicorn's format: the level, a colon, spaces).
RECORD_START = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):")

#: An error answer other than 503 (`agent.serving.errors.log_error_answer`: "POST /path -> 500 CODE: ...").
BAD_ANSWER = re.compile(r"-> 5(?!03)\d\d ")


class Server:
    """One `tt-agent serve` process on 127.0.0.1:`port`, behind its front proxy."""

    def __init__(self, index: int, port: int, front: Proxy, env: dict[str, str], root: Path) -> None:
        self.index = index
        self.port = port
        self.front = front
        self.env = env
        self.log_path = root / f"server-{index}.log"
        self.cwd = root
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.starts = 0

    @property
    def url(self) -> str:
        """Where clients send requests: the front proxy."""
        return f"http://127.0.0.1:{self.front.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process and wait until /health answers (at most `STARTUP_TIMEOUT` s).

        Raises:
            RuntimeError: it exited or did not answer in time (the log's end in the message).
        """
        with self.lock:
            if self.alive:
                return
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                    cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
            self.starts += 1
            process = self.process
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server {self.index} exited with {process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"server {self.index} did not answer /health within {STARTUP_TIMEOUT} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """`kill -9` the process group; returns once it is gone."""
        with self.lock:
            process = self.process
            if process is None or process.poll() is not None:
                return
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()

    def stop(self) -> None:
        """SIGTERM (uvicorn finishes its requests and the agent closes), SIGKILL after 20 s."""
        with self.lock:
            process = self.process
            if process is None:
                return
            for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:
                os.killpg(process.pid, signal.SIGKILL)  # what the server started, if it outlived it
            except ProcessLookupError:
                pass

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def bad_log_lines(self) -> list[str]:
        """The records of its log that show a bug: an answer with a 5xx other than 503, and an ERROR
        record with a traceback that is not a 503's (the agent logs every 5xx answer with its
        traceback, and a 503 is the database failing, which the soak does on purpose)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        bad, record, frames, collecting = [], "", [], False
        for line in lines + ["INFO:"]:
            if RECORD_START.match(line):
                if collecting:  # where the traceback ended: its last frames and the error
                    bad.append(f"{record} (traceback: {' | '.join(frames[-5:])})")
                record, frames, collecting = line, [], False
                if BAD_ANSWER.search(line):
                    bad.append(line)
            elif line.startswith("Traceback") and record.startswith("ERROR") and "-> 5" not in record:
                collecting = True
            elif collecting and (line.startswith('  File "') or not line.startswith(" ")):
                frames.append(line.strip())
        return bad


class Fleet:
    """The running processes of one soak (module docstring)."""

    def __init__(self, servers: list[Server], pg_proxy: Proxy, model_url: str) -> None:
        self.servers = servers
        self.pg_proxy = pg_proxy
        self.model_url = model_url

    def urls(self) -> list[str]:
        return [server.url for server in self.servers]


@contextmanager
def fleet(
    root: Path,
    *,
    pg_port: int,
    database_url: str,
    servers: int,
    model_latency: float,
    ttl_strategy: str,
) -> Iterator[Fleet]:
    """Start the stub, the Postgres proxy, the front proxies and `servers` servers (all answering) in `root`;
    yield the `Fleet`; stop everything afterwards, also on errors and Ctrl-C.

    `database_url` is the soak database on the cluster at 127.0.0.1:`pg_port`; the servers reach it through the proxy.

    Raises:
        RuntimeError: a process did not start.
    """
    with ExitStack() as stack:
        model_url = stack.enter_context(openai_stub_server(latency_s=model_latency, chunks=3))
        pg_proxy = stack.enter_context(tcp_proxy("127.0.0.1", pg_port))
        env = {
            **os.environ,
            **SERVER_SETTINGS,
            "AGENT_DATABASE_URL": pg_proxy.url_for(database_url),
            "AGENT_MODEL": "fake",
            "AGENT_THREAD_TTL_STRATEGY": ttl_strategy,
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "soak",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
            "PYTHONUNBUFFERED": "1",
        }
        started: list[Server] = []
        stack.callback(lambda: [server.stop() for server in started])
        for index in range(servers):
            port = free_port()
            front = stack.enter_context(tcp_proxy("127.0.0.1", port))
            started.append(Server(index, port, front, env, root))
        # One at a time: they import the same modules, and a loaded machine starts one faster than three.
        for server in started:
            server.start()
        yield Fleet(started, pg_proxy, model_url)
