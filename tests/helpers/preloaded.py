"""Run Python source as `python -c` would, or the agent's command line as `python -m agent` would, in a fresh
process forked from one that imported the heavy modules once.

Why: the documentation's Python blocks (tests/docs/test_docs.py) each ran in a
new interpreter, and about 2.5 s of CPU of each went to importing MLflow,
LangGraph and LangChain again (`agent.responses` imports MLflow's
`ResponsesAgent`): over a minute of the suite's CPU on a 2-CPU machine. The
standard library's forkserver (`multiprocessing`, `set_forkserver_preload`)
imports them once per pytest worker and forks a new process for each block.
The same holds for the agent's server, which the serving, operations, storage,
docs, memory and web tests start many times a run (`tests.helpers.servers`):
`python -m agent serve` spent about 4 s of CPU per start on those imports (7.5 s
with tracing on); forked (`start_agent`), about 0.6 s (3.3 s with tracing on,
most of it MLflow creating its tracking store).

What a block still gets of its own, as with `python -c`: its globals (a new
`__main__` dict), environment (replaced as a whole), working directory,
standard streams (stdin is /dev/null; stdout and stderr go to files read back
here, buffered as PYTHONUNBUFFERED says) and `sys.argv` (`["-c", filename]`). What
a fresh interpreter does at exit is done too: non-daemon threads are joined and
`atexit` functions run before the process ends. What differs: modules that the
preload imported read their import-time settings from the worker's environment,
not the block's (none of ours does: `agent.cli` would, its consoles read the
terminal and COLUMNS, so it is not preloaded; MLflow reads its variables when it
is called, except its loggers' level, which `start_agent` sets again).

What a server gets, as with `subprocess.Popen([sys.executable, "-m", "agent", *args],
start_new_session=True)`: a session and process group of its own, made before
`start_agent` returns (tests signal the group); the signal handlers of a new
interpreter (the forkserver puts its own back before running the process), so
uvicorn installs and re-raises them as it would; `sys.path` as `-m` builds it
(the directory, PYTHONPATH, the interpreter's own); `sys.argv`; `agent.__main__`
run as `__main__` by `runpy`, so `--workers N` spawns its workers (uvicorn uses
`multiprocessing`'s spawn) as new interpreters, exactly as from a new process:
those still import everything. What differs: it is the forkserver's child, not
the test process's, so its exit status comes through the forkserver and its CPU
time is counted in the forkserver's; and it holds `multiprocessing`'s pipes (the
forkserver's, the resource tracker's), so the forkserver outlives the worker
until the last server ends.

The preload adds the serving modules (uvicorn, FastAPI and ours: about 8 MB a
worker, on top of about 245 MB). MLflow's tracking store (SQLAlchemy, alembic) is
left out: it would save 1.2 s of each server that traces, but costs 1.25 s and
48 MB in every worker, and most tests' servers do not trace.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

#: Imported once by the forkserver: what nearly every block imports first, and what `tt-agent serve` imports
#: (`start_agent`; not `agent.cli`, whose consoles read the terminal's width and COLUMNS when imported).
PRELOAD = [
    "agent", "agent.responses", "agent.factory", "langgraph.graph", "langchain_openai", "psycopg", "openai",
    "agent.serving.app", "agent.serving.agent_server", "uvicorn.lifespan.on", "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.h11_impl",
]  # fmt: skip

_context: multiprocessing.context.BaseContext | None = None
_context_lock = threading.Lock()


def _forkserver() -> multiprocessing.context.BaseContext:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _context = context
        return _context


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run(
    source: str, filename: str, cwd: str, env: dict[str, str], stdout: str, stderr: str,
    stdin: str = os.devnull, args: tuple[str, ...] | None = None,
) -> None:
    """The forked process: streams, environment and directory of the block, the block, then the interpreter's exit."""
    fds = [os.open(stdin, os.O_RDONLY), os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)]
    fds.append(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    _take_streams(*fds, env)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["-c", filename] if args is None else ["-c", *args]
    _exit_as_interpreter(lambda: exec(compile(source, filename, "exec"), {"__name__": "__main__"}))  # noqa: S102


def _take_streams(stdin: int, stdout: int, stderr: int, env: dict[str, str]) -> None:
    """Make the descriptors (closed here) the process's 0, 1 and 2, and `sys.stdin`/`stdout`/`stderr` text streams
    on them, buffered as an interpreter started with `env` buffers them: written through with PYTHONUNBUFFERED,
    else stdout in blocks and stderr by line (Python 3.9+), since a server's output is read while it runs."""
    for fd, opened in enumerate((stdin, stdout, stderr)):
        if opened != fd:
            os.dup2(opened, fd)
    for opened in {stdin, stdout, stderr} - {0, 1, 2}:
        os.close(opened)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdin until it ends
    sys.stdout = _writer(1, unbuffered=unbuffered, line_buffering=False)
    sys.stderr = _writer(2, unbuffered=unbuffered, line_buffering=True, errors="backslashreplace")


def _writer(fd: int, *, unbuffered: bool, line_buffering: bool, errors: str = "strict") -> io.TextIOWrapper:
    # What CPython's create_stdio builds: with -u / PYTHONUNBUFFERED, no buffer under the text layer.
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115 - the process's own
    return io.TextIOWrapper(
        binary, encoding="utf-8", errors=errors, line_buffering=line_buffering and not unbuffered, write_through=unbuffered
    )


def _exit_as_interpreter(main: Callable[[], object]) -> NoReturn:
    """Run `main`, then end the process as an interpreter ends after its main module: the exit code of a
    `SystemExit`, 1 with the traceback on stderr for another exception, killed by SIGINT for a
    `KeyboardInterrupt` (as CPython 3.8+ does); non-daemon threads joined and `atexit` functions run first."""
    interrupted = False
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined] - what Py_FinalizeEx does first: join non-daemon threads
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def run_source(
    source: str,
    filename: str,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    args: Sequence[str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `source` (compiled with `filename`) in a process forked from the preloaded server; its exit code and output.

    `args` become `sys.argv[1:]` (`python -c source *args`; None: `[filename]`, what a documentation
    block gets); `stdin` is the text the process reads (default: nothing, /dev/null). Returns a
    `CompletedProcess` (args `["-c", filename]`, text stdout and stderr) as
    `subprocess.run(..., input=stdin, capture_output=True, text=True)` would.

    Raises:
        subprocess.TimeoutExpired: the process ran longer than `timeout` seconds (it is killed).
    """
    with tempfile.TemporaryDirectory(prefix="tt-block-") as streams:
        out, err, given = Path(streams, "stdout"), Path(streams, "stderr"), Path(streams, "stdin")
        if stdin is not None:
            given.write_text(stdin, encoding="utf-8")
        process = _forkserver().Process(
            target=_run,
            args=(source, filename, str(cwd), env, str(out), str(err), str(given) if stdin is not None else os.devnull,
                  None if args is None else tuple(args)),
        )  # fmt: skip
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["-c", filename], timeout)
        read = lambda path: path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""  # noqa: E731
        return subprocess.CompletedProcess(["-c", filename], process.exitcode, read(out), read(err))


class _Forked:
    """`Popen`'s process methods (`poll`, `wait`, `send_signal`, `terminate`, `kill`, `returncode`, `args`) over a
    process forked from the preloaded server: a child of the forkserver, whose exit status comes from there."""

    args: list[str]
    returncode: int | None = None
    _process: multiprocessing.process.BaseProcess

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            os.kill(self._process.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class PreloadedProcess(_Forked):
    """`python -c source *args` forked from the preloaded server, talking through named pipes: what
    `subprocess.Popen(..., stdin=PIPE, stdout=PIPE, text=True)` gives, for the tests' interactive children
    (`tests.helpers.reliability.Child`), each of which spent about 3 s of CPU importing the agent.

    `stdin` (write and flush lines) and `stdout` (read lines until the process exits) are text streams;
    `poll`, `wait`, `kill` and `returncode` are `Popen`'s. Its stderr goes to `stderr_path`.
    """

    def __init__(self, source: str, args: Sequence[str], *, cwd: Path, env: dict[str, str], stderr_path: str) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="tt-child-")
        stdin_path, stdout_path = (os.path.join(self._folder.name, name) for name in ("stdin", "stdout"))
        os.mkfifo(stdin_path, 0o600)
        os.mkfifo(stdout_path, 0o600)
        # Read and write: opening never waits for the child, and the child's reads never see an end.
        self.stdin = open(os.open(stdin_path, os.O_RDWR), "w", encoding="utf-8")  # noqa: SIM115 - closed by `close`
        self._stdout_path = stdout_path
        self._process = _forkserver().Process(
            target=_run, args=(source, "<child>", str(cwd), env, stdout_path, stderr_path, stdin_path, tuple(args))
        )
        self._process.start()
        self.args = ["-c", "<child>", *args]

    def lines(self) -> Iterator[str]:
        """The lines the process prints, until it exits (opening waits until it opens its end)."""
        with open(self._stdout_path, encoding="utf-8") as stdout:
            yield from stdout

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self.close()
        return code

    def close(self) -> None:
        self.stdin.close()
        self._folder.cleanup()


#: `python -m agent` as source: `runpy` sets `sys.argv[0]` to the module's file, as the interpreter does; MLflow,
#: imported by the preload, is first set to the level the command line sets before importing it
#: (`_reconfigure_imported`), so the output has no MLflow INFO line a new interpreter would not print.
AGENT_MAIN = (
    "import os, runpy; from tests.helpers.preloaded import _reconfigure_imported; "
    "_reconfigure_imported(dict(os.environ)); runpy.run_module('agent', run_name='__main__', alter_sys=True)"
)


def script_main(path: Path) -> str:
    """`python PATH` as source, for a script that sets MLflow's level before importing it, as
    `scripts/log_model.py` does (what `AGENT_MAIN` does for the command line)."""
    return (
        "import os, runpy; from tests.helpers.preloaded import _reconfigure_imported; "
        f"_reconfigure_imported(dict(os.environ)); runpy.run_path({str(path)!r}, run_name='__main__')"
    )


def run_agent_cli(args: Sequence[str], *, cwd: Path, env: dict[str, str], stdin: str | None, timeout: float) -> subprocess.CompletedProcess:
    """`python -m agent *args` (the `tt-agent` command line) forked from the preloaded server, as `run_source` runs
    a block: what `subprocess.run([sys.executable, "-m", "agent", *args], input=stdin, capture_output=True,
    text=True)` returns, without each command importing the agent again (about 2.5 s of CPU each).

    Raises:
        subprocess.TimeoutExpired: the command ran longer than `timeout` seconds (it is killed).
    """
    return run_source(AGENT_MAIN, "<tt-agent>", cwd=cwd, env=env, timeout=timeout, args=args, stdin=stdin)


def start_source(source: str, args: Sequence[str], *, cwd: Path, env: dict[str, str], stderr_path: str) -> PreloadedProcess:
    """Start `source` as `python -c source *args` would, forked from the preloaded server (see `PreloadedProcess`)."""
    return PreloadedProcess(source, args, cwd=cwd, env=env, stderr_path=stderr_path)


class _SentFd:
    """A descriptor of this process given to the forked one, as `multiprocessing` gives it a pipe: the forked process
    receives its own copy of the descriptor (the same open file, sharing the offset, as a `Popen` child would)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable[[Any], int], tuple[Any]]:
        # DupFd only while the process is being started: that is when it has a process to send the descriptor to.
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(dup: Any) -> int:
    return dup.detach()


@functools.cache
def _interpreter_path() -> tuple[str, ...]:
    """`sys.path` of a new interpreter without PYTHONPATH, after its first entry (the script's directory or the
    current one): the standard library and site-packages, with what their .pth files add (the editable install)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return tuple(json.loads(found.stdout))


def _serve(
    module: str, args: tuple[str, ...], cwd: str, env: dict[str, str], output: int, started: Connection,
    path: tuple[str, ...],
) -> None:
    """The forked process of `start_agent`: a session of its own, the streams, environment, directory, `sys.path`
    and `sys.argv` of `python -m module *args`, the module as `__main__`, then the interpreter's exit."""
    os.setsid()
    started.send(os.getpid())  # the group exists: the parent may signal it from now on
    started.close()
    _take_streams(os.open(os.devnull, os.O_RDONLY), output, output, env)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # What `python -m` gives: the current directory first, then PYTHONPATH, then the interpreter's own path;
    # a process that `multiprocessing` spawns from this one gets the same (spawn sends sys.path and the directory).
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [os.getcwd(), *extra, *path]
    multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # type: ignore[attr-defined] - set on import in a new one
    sys.argv = ["-m", *args]
    sys.orig_argv = [sys.executable, "-m", module, *args]
    _reconfigure_imported(env)
    _exit_as_interpreter(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def _reconfigure_imported(env: dict[str, str]) -> None:
    """Redo what the preloaded modules did at import from the environment, with the process's own.

    MLflow sets its loggers' level from MLFLOW_LOGGING_LEVEL when imported (`mlflow/__init__.py`), which the
    preload did in the pytest worker's environment; `agent.cli.main` and `scripts/log_model.py` set that
    variable (WARNING unless set) before anything imports MLflow, so a new `python -m agent` process has
    MLflow at that level. For the agent's command line and that script only (`start_agent`, `AGENT_MAIN`,
    `script_main`): a documentation block, like `python -c`, gets MLflow's own default.
    """
    from mlflow.environment_variables import MLFLOW_CONFIGURE_LOGGING
    from mlflow.utils.logging_utils import _configure_mlflow_loggers

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # agent.cli.main: the same value, a little earlier
    if MLFLOW_CONFIGURE_LOGGING.get() is True:
        _configure_mlflow_loggers(root_module_name="mlflow")


class PreloadedServer(_Forked):
    """`python -m module *args` forked from the preloaded server (`start_agent`), in a session of its own:
    `args`, `pid`, `returncode`, `poll`, `wait`, `send_signal`, `terminate` and `kill` are those of
    `subprocess.Popen(..., start_new_session=True)`, so `os.killpg(server.pid, sig)` reaches what it started.
    It is a child of the forkserver, not of this process: its exit status comes from the forkserver."""

    def __init__(self, module: str, args: Sequence[str], *, cwd: Path, env: dict[str, str], output: int) -> None:
        self.args = [sys.executable, "-m", module, *args]
        started, sender = _forkserver().Pipe(duplex=False)
        self._process = _forkserver().Process(
            target=_serve,
            args=(module, tuple(args), str(cwd), env, _SentFd(output), sender, _interpreter_path()),
            name=f"python -m {module}",
        )
        self._process.start()
        sender.close()
        try:
            started.recv()  # EOFError: it died before its session was made (its exit code tells)
        except EOFError:
            pass
        finally:
            started.close()
        self.pid: int = self._process.pid


def start_agent(args: Sequence[str], *, cwd: Path, env: dict[str, str], output: int) -> PreloadedServer:
    """Start `python -m agent *args` forked from the preloaded server (see `PreloadedServer`), with the
    environment `env` (as a whole), the directory `cwd`, stdin from /dev/null, and stdout and stderr
    on the descriptor `output` (a file opened by the caller, which keeps it)."""
    return PreloadedServer("agent", args, cwd=cwd, env=env, output=output)
