"""Server processes for tests: start one on a free local port, wait until it answers, stop it and its children.

    with server_process([sys.executable, "-m", "agent", "serve", "--port", str(port)], port=port,
                        health_path="/health", env={"AGENT_DATABASE_URL": url}, cwd=tmp) as base_url:
        httpx.get(f"{base_url}/health")

`python -m agent serve` (the agent's own server, `AGENT_SERVE`) is forked from the
pytest worker's preloaded server (`tests.helpers.preloaded.start_agent`) instead of
starting a new interpreter that imports MLflow, LangGraph and LangChain again
(4 to 7 s of CPU a start); it behaves as the new process would. Any other command
(`mlflow models serve`) runs as a new process.

Also: `in_process_server(app)` serves an ASGI app with uvicorn in a thread of the
test process (for apps built around a stand-in chat model), and
`log_model_with_script(...)` runs `scripts/log_model.py` and returns the URI it printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from tests.helpers import REPO_ROOT
from tests.helpers.openai_stub import free_port
from tests.helpers.preloaded import PreloadedServer, run_source, script_main, start_agent

#: A server's process: a new one, or one forked from the preloaded server; both have `Popen`'s methods.
Process = subprocess.Popen | PreloadedServer

LOG_MODEL_SCRIPT = REPO_ROOT / "scripts" / "log_model.py"

__all__ = [
    "REPO_ROOT",
    "RunningServer",
    "free_port",
    "in_process_server",
    "log_model_with_script",
    "running_server",
    "server_process",
]


@contextmanager
def server_process(
    args: Sequence[str],
    *,
    port: int,
    health_path: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[str]:
    """Run `args` (a server that binds 127.0.0.1:`port`); yield `http://127.0.0.1:<port>` once `health_path` answers 200.

    The process gets this process's environment plus `env`, and its own
    process group, so stopping it (SIGTERM, then SIGKILL after 10 s) also
    stops the workers it spawned (`mlflow models serve` runs uvicorn as a child).

    Raises:
        RuntimeError: the process exited, or did not answer within `startup_timeout`
            seconds; the message holds the end of its output.
    """
    with running_server(args, port=port, health_path=health_path, env=env, cwd=cwd, startup_timeout=startup_timeout) as server:
        yield server.base_url


@dataclass
class RunningServer:
    """A server process started by `running_server`: its URL, the process (to signal it), and its output so far."""

    base_url: str
    process: Process
    _output: Any

    def output(self, limit: int = 4000) -> str:
        """The last `limit` characters the process printed so far (stdout and stderr)."""
        # pread: seeking the file would move the offset the process writes at (they share it).
        fd = self._output.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)).decode(errors="replace")


@contextmanager
def running_server(
    args: Sequence[str],
    *,
    port: int,
    health_path: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[RunningServer]:
    """`server_process`, yielding the `RunningServer` (for a test that signals the process itself). Stopped
    on exit as `server_process` stops it, unless it already exited.

    Raises:
        RuntimeError: as `server_process`.
    """
    base_url = f"http://127.0.0.1:{port}"
    # Output goes to a file, not a pipe nobody reads, so a chatty server never blocks.
    with tempfile.TemporaryFile() as output:
        process = _start(list(args), cwd=cwd or REPO_ROOT, env={**os.environ, **(env or {})}, output=output)
        try:
            _wait_until_healthy(process, base_url + health_path, startup_timeout, output)
            yield RunningServer(base_url, process, output)
        finally:
            _stop(process)


#: The command line of the agent's own server, which `running_server` forks from the preloaded server.
AGENT_SERVE = [sys.executable, "-m", "agent", "serve"]


def _start(args: list[str], *, cwd: Path, env: dict[str, str], output: Any) -> Process:
    # The module docstring says why `python -m agent serve` is forked; `start_agent` keeps what the tests rely on.
    if args[: len(AGENT_SERVE)] == AGENT_SERVE:
        return start_agent(args[3:], cwd=cwd, env=env, output=output.fileno())
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_until_healthy(process: Process, url: str, timeout: float, output: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:4]} exited with {process.returncode}:\n{_tail(output)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{process.args[:4]} did not answer {url} within {timeout} s:\n{_tail(output)}")


def _tail(output: Any, limit: int = 4000) -> str:
    output.seek(0)
    return output.read().decode(errors="replace")[-limit:]


def _stop(process: Process) -> None:
    # The group id is the process's id (start_new_session); it holds only what this process started.
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # Children may outlive a parent that exited on SIGTERM; end the rest of the group.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@contextmanager
def in_process_server(app: Any) -> Iterator[str]:
    """Serve the ASGI `app` with uvicorn on a free port in a thread; yield its base URL; shut it down after."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def log_model_with_script(cwd: Path, env: Mapping[str, str | None], *args: str) -> str:
    """Run `scripts/log_model.py` in `cwd`; return the model URI from its last output line.

    `env` is added to this process's environment; a None value removes that variable.

    Raises:
        RuntimeError: the script failed (the message holds its output).
    """
    child_env = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for key in [k for k, v in env.items() if v is None]:
        child_env.pop(key, None)
    # `python scripts/log_model.py *args`, forked from the preloaded interpreter (it imports MLflow and the agent);
    # what the script prints in a new interpreter (MLflow's logging) is tests/cli/test_quiet.py's.
    done = run_source(script_main(LOG_MODEL_SCRIPT), str(LOG_MODEL_SCRIPT), cwd=cwd, env=child_env, timeout=300,
                      args=list(args))  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"log_model.py failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]
