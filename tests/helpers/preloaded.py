"""Run Python source as `python -c` would, in a fresh process forked from one that imported the heavy modules once.

Why: the documentation's Python blocks (tests/docs/test_docs.py) each ran in a
new interpreter, and about 2.5 s of CPU of each went to importing MLflow,
LangGraph and LangChain again (`agent.responses` imports MLflow's
`ResponsesAgent`): over a minute of the suite's CPU on a 2-CPU machine. The
standard library's forkserver (`multiprocessing`, `set_forkserver_preload`)
imports them once per pytest worker and forks a new process for each block.

What a block still gets of its own, as with `python -c`: its globals (a new
`__main__` dict), environment (replaced as a whole), working directory,
standard streams (stdin is /dev/null; stdout and stderr go to files read back
here) and `sys.argv` (`["-c", filename]`). What a fresh interpreter does at
exit is done too: non-daemon threads are joined and `atexit` functions run
before the process ends. What differs: modules that the preload imported
read their import-time settings from the worker's environment, not the
block's (none of ours does; MLflow reads its variables when it is called).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

#: Imported once by the forkserver: what nearly every block imports first.
PRELOAD = ["agent", "agent.responses", "agent.factory", "langgraph.graph", "langchain_openai", "psycopg", "openai"]

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
    stdin: str = os.devnull, args: tuple[str, ...] = (),
) -> None:
    """The forked process: streams, environment and directory of the block, the block, then the interpreter's exit."""
    for fd, path, flags in (
        (0, stdin, os.O_RDONLY),
        (1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdin until it ends
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["-c", *args] if args else ["-c", filename]
    try:
        exec(compile(source, filename, "exec"), {"__name__": "__main__"})  # noqa: S102 - running the block is the test
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined] - what Py_FinalizeEx does first: join non-daemon threads
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_source(
    source: str,
    filename: str,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    args: Sequence[str] = (),
    stdin: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `source` (compiled with `filename`) in a process forked from the preloaded server; its exit code and output.

    `args` become `sys.argv[1:]` (`python -c source *args`); `stdin` is the text the process reads
    (default: nothing, /dev/null). Returns a `CompletedProcess` (args `["-c", filename]`, text stdout
    and stderr) as `subprocess.run(..., input=stdin, capture_output=True, text=True)` would.

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
                  tuple(args)),
        )  # fmt: skip
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["-c", filename], timeout)
        read = lambda path: path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""  # noqa: E731
        return subprocess.CompletedProcess(["-c", filename], process.exitcode, read(out), read(err))


class PreloadedProcess:
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
        self.returncode: int | None = None

    def lines(self) -> Iterator[str]:
        """The lines the process prints, until it exits (opening waits until it opens its end)."""
        with open(self._stdout_path, encoding="utf-8") as stdout:
            yield from stdout

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(["-c", "<child>"], timeout or 0)
        self.close()
        return self.returncode

    def kill(self) -> None:
        self._process.kill()

    def close(self) -> None:
        self.stdin.close()
        self._folder.cleanup()


#: `python -m agent` as source: `runpy` sets `sys.argv[0]` to the module's file, as the interpreter does.
AGENT_MAIN = "import runpy; runpy.run_module('agent', run_name='__main__', alter_sys=True)"


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
