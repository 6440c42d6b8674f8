"""Server processes for benchmarks: started in their own process group, waited for, measured, stopped.

A server may spawn workers (`tt-agent serve --workers N`, uvicorn's process
manager), so each is started in a new session: its process group holds exactly
what it started, stopping the group stops them all, and its CPU time is the
sum over the group (read from `/proc`, Linux only; psutil is not a dependency).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

#: Clock ticks per second, the unit of the CPU times in /proc/<pid>/stat.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """One server process (and its children) in its own process group, output kept in a temporary file."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path, name: str) -> None:
        self.name = name
        self._output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_healthy(self, url: str, timeout: float) -> None:
        """Return once `GET url` answers 200.

        Raises:
            RuntimeError: the process exited, or `url` did not answer within `timeout` seconds;
                the message holds the end of its output.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout} s:\n{self.tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every live process of the group, and of the children they reaped."""
        ticks = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            # The command name (field 2) is in parentheses and may hold spaces: split after it.
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == self.pid:  # field 5, pgrp
                ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        return ticks / CLOCK_TICKS

    def tail(self, limit: int = 4000) -> str:
        """The last `limit` characters of the process's output."""
        self._output.seek(0)
        return self._output.read().decode(errors="replace")[-limit:]

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left after 10 s; idempotent."""
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # Workers may outlive a leader that exited on SIGTERM.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self._output.close()


@contextmanager
def running_servers(specs: Sequence[tuple[str, Sequence[str], Mapping[str, str], str]], *, cwd: Path,
                    timeout: float = 180.0) -> Iterator[list[ServerProcess]]:  # fmt: skip
    """Start servers at once, yield them when every one is healthy, stop them all on exit.

    Each spec is `(name, args, env, health_url)`; `env` is the whole environment.
    Starting several at once overlaps their imports, which take seconds each.

    Raises:
        RuntimeError: a server exited or did not become healthy within `timeout` seconds.
    """
    with ExitStack() as stack:
        servers = []
        for name, args, env, _ in specs:
            server = ServerProcess(args, env=env, cwd=cwd, name=name)
            stack.callback(server.stop)
            servers.append(server)
        for server, (_, _, _, health_url) in zip(servers, specs, strict=True):
            server.wait_healthy(health_url, timeout)
        yield servers
