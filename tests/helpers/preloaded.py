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


def _run(source: str, filename: str, cwd: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """The forked process: streams, environment and directory of the block, the block, then the interpreter's exit."""
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
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
    sys.argv = ["-c", filename]
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


def run_source(source: str, filename: str, *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run `source` (compiled with `filename`) in a process forked from the preloaded server; its exit code and output.

    Returns a `CompletedProcess` (args `["-c", filename]`, text stdout and stderr) as `subprocess.run` would.

    Raises:
        subprocess.TimeoutExpired: the process ran longer than `timeout` seconds (it is killed).
    """
    with tempfile.TemporaryDirectory(prefix="tt-block-") as streams:
        out, err = Path(streams, "stdout"), Path(streams, "stderr")
        process = _forkserver().Process(target=_run, args=(source, filename, str(cwd), env, str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["-c", filename], timeout)
        read = lambda path: path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""  # noqa: E731
        return subprocess.CompletedProcess(["-c", filename], process.exitcode, read(out), read(err))
