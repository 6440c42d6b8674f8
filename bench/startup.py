"""Start-up benchmark: the command line against `python -c pass`, and a cold agent against its libraries.

    python -m bench.startup [--quick] [--json FILE]

Each command runs as a whole process, in turn with its baseline (A B A B …,
after one warm-up each, none with `--quick`), so a machine that slows down slows both; a figure is
the median of the pairwise ratios, of wall time and of CPU time (user + system,
from `resource.getrusage(RUSAGE_CHILDREN)`, or summed over a server's process
group from `/proc` while it runs).

Two groups of figures:

* **The command line** against `python -c pass`: `tt-agent --help`, `--version`
  and `history` (a thread of three turns read from the SQLite default store,
  `.agent/checkpoints.sqlite` in a temporary directory, as after `tt-agent demo`).
  Targets: `--help` <= 10x and `history` <= 25x.
* **A cold agent** against the libraries it cannot do without: `create_agent(
  'memory://', model='offline').close()` against `import langgraph.graph`, and
  `tt-agent serve` on `memory://` (offline model, tracing at its default: on)
  until `GET /ready` answers 200, against `import langgraph.graph,
  mlflow.genai.agent_server`. Targets: <= 1.5x, of CPU and of wall time.
  `create_agent` imports MLflow only when MLflow's side of the agent is first
  used (`agent.deferred`), so the figure holds no MLflow. The
  server is measured until it answers, not through its shutdown, so its
  baseline ends with `os._exit(0)` once imported: a normal exit after importing
  MLflow costs a further 0.7 to 0.8 s of CPU on this project's machines, which
  would flatter the server. They
  hold when nothing is imported before it is used (no `langchain_openai` nor
  tiktoken for the offline model, MLflow only where a path needs it).

Every process runs with Python's bytecode cache on, where Python keeps it (the
`__pycache__` folders beside the sources), whatever `PYTHONDONTWRITEBYTECODE` or
`PYTHONPYCACHEPREFIX` say: an installed package starts from compiled bytecode,
and compiling sources again on every run (about 0.3 s of CPU for this package's)
is not part of its start-up. The warm-up runs fill what is missing. (A cache
of the run's own, in a temporary folder, made every run compile MLflow,
LangGraph and LangChain again first: about 10 s of CPU in the suite's quick run.)

What makes the targets reachable is held by tests/cli/test_startup.py (which modules
each path imports); this script only measures.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.processes import ServerProcess

RUNS, QUICK_RUNS = 15, 1
#: Whole-agent runs take seconds each: fewer pairs.
AGENT_RUNS, QUICK_AGENT_RUNS = 7, 1

#: The cold agent, and the library import it is measured against.
CREATE_AGENT = "from agent import create_agent; create_agent('memory://', model='offline').close()"
LANGGRAPH_IMPORT = "import langgraph.graph"
#: What `tt-agent serve` cannot start without: the graph and MLflow's Agent Server (no shutdown: see above).
SERVER_IMPORT = "import langgraph.graph, mlflow.genai.agent_server"
SERVER_BASELINE = SERVER_IMPORT + "; import os; os._exit(0)"
#: Seconds a server may take to answer /ready.
READY_TIMEOUT = 180.0


def _ratio(value: float) -> str:
    return f"{value:.1f}x"


FIGURES = {
    "help_wall_ratio": report.Figure("tt-agent --help / python -c pass, wall", "<= 10", lambda v: v <= 10, _ratio),
    "history_wall_ratio": report.Figure(
        "tt-agent history THREAD_ID (SQLite default) / python -c pass, wall", "<= 25", lambda v: v <= 25, _ratio
    ),
    "version_wall_ratio": report.Figure("tt-agent --version / python -c pass, wall", fmt=_ratio),
    "help_cpu_ratio": report.Figure("tt-agent --help / python -c pass, CPU", fmt=_ratio),
    "history_cpu_ratio": report.Figure("tt-agent history / python -c pass, CPU", fmt=_ratio),
    "baseline_wall_s": report.Figure("python -c pass, wall (median)", fmt=report.fixed(3, " s")),
    "help_wall_s": report.Figure("tt-agent --help, wall (median)", fmt=report.fixed(3, " s")),
    "history_wall_s": report.Figure("tt-agent history, wall (median)", fmt=report.fixed(3, " s")),
    "create_agent_cpu_ratio": report.Figure(
        "create_agent('memory://', model='offline').close() / import langgraph.graph, CPU",
        "<= 1.5", lambda v: v <= 1.5, _ratio,
    ),
    "create_agent_wall_ratio": report.Figure(
        "create_agent('memory://', model='offline').close() / import langgraph.graph, wall",
        "<= 1.5", lambda v: v <= 1.5, _ratio,
    ),
    "serve_cpu_ratio": report.Figure(
        "tt-agent serve (memory://) until /ready / import langgraph.graph, mlflow.genai.agent_server, CPU",
        "<= 1.5", lambda v: v <= 1.5, _ratio,
    ),
    "serve_wall_ratio": report.Figure(
        "tt-agent serve (memory://) until /ready / import langgraph.graph, mlflow.genai.agent_server, wall",
        "<= 1.5", lambda v: v <= 1.5, _ratio,
    ),
    "create_agent_cpu_s": report.Figure("create_agent(...).close(), CPU (median)", fmt=report.fixed(2, " s")),
    "langgraph_cpu_s": report.Figure("import langgraph.graph, CPU (median)", fmt=report.fixed(2, " s")),
    "serve_cpu_s": report.Figure("tt-agent serve until /ready, CPU (median)", fmt=report.fixed(2, " s")),
    "server_import_cpu_s": report.Figure(
        "import langgraph.graph, mlflow.genai.agent_server, CPU (median)", fmt=report.fixed(2, " s")
    ),
}


def measured_environment() -> dict[str, str]:
    """This process's environment without AGENT_*, MLFLOW_* and OPENAI_* settings, with bytecode
    cached where Python keeps it (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def tt_agent() -> list[str]:
    """The `tt-agent` console script next to this interpreter, else `python -m agent`."""
    script = Path(sys.executable).parent / "tt-agent"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


def timed(args: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `args`; its output is discarded. Raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def served_until_ready(cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `tt-agent serve` on `memory://` from its start until `GET /ready`
    answers 200 (CPU summed over its process group at that moment); the server is then stopped.

    Raises:
        RuntimeError: the server exited or did not answer within `READY_TIMEOUT` seconds.
    """
    port = _free_port()
    url = f"http://127.0.0.1:{port}/ready"
    started = time.perf_counter()
    server = ServerProcess(
        [*tt_agent(), "serve", "--port", str(port), "--database-url", "memory://", "--model", "offline"],
        env=env, cwd=cwd, name="tt-agent serve",
    )
    try:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"tt-agent serve exited with {server.process.returncode}:\n{server.tail()}")
            if time.perf_counter() - started > READY_TIMEOUT:
                raise RuntimeError(f"tt-agent serve did not answer {url} within {READY_TIMEOUT} s:\n{server.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return time.perf_counter() - started, server.cpu_seconds()
            except OSError:
                time.sleep(0.02)  # short: the poll's granularity is part of the wall time
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def paired(command: Sequence[str], baseline: Sequence[str], runs: int, cwd: Path, env: dict[str, str], *,
           warm_up: bool = True) -> dict[str, float]:  # fmt: skip
    """Run `command` and `baseline` in turn `runs` times (after a warm-up each); medians and median ratios."""
    return paired_runs(lambda: timed(command, cwd, env), lambda: timed(baseline, cwd, env), runs, warm_up=warm_up)


def paired_runs(
    command: Callable[[], tuple[float, float]], baseline: Callable[[], tuple[float, float]], runs: int, *,
    warm_up: bool = True,
) -> dict[str, float]:  # fmt: skip
    """Call `command` and `baseline` (each returns wall and CPU seconds) in turn `runs` times, after a
    warm-up each unless `warm_up` is false (the quick run: a smoke test, whose figures are not to be
    trusted, and the warm-ups were half its time); the medians of each and of the pairwise ratios."""
    if warm_up:
        command()
        baseline()
    walls, cpus, base_walls, base_cpus, wall_ratios, cpu_ratios = [], [], [], [], [], []
    for _ in range(runs):
        wall, cpu = command()
        base_wall, base_cpu = baseline()
        walls.append(wall)
        cpus.append(cpu)
        base_walls.append(base_wall)
        base_cpus.append(base_cpu)
        wall_ratios.append(wall / base_wall)
        cpu_ratios.append(cpu / max(base_cpu, 1e-3))
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "baseline_wall_s": statistics.median(base_walls),
        "baseline_cpu_s": statistics.median(base_cpus),
        "wall_ratio": statistics.median(wall_ratios),
        "cpu_ratio": statistics.median(cpu_ratios),
    }


def demo_thread(cwd: Path) -> str:
    """A thread of three turns in `cwd`'s default store; its id."""
    from agent import create_agent

    with create_agent(f"sqlite:///{cwd / '.agent' / 'checkpoints.sqlite'}", model="offline", tracing=False) as agent:
        thread_id = None
        for text in ("I'm planning for an upcoming trip!", "I'm headed to SF!", "Where did I say I'm going?"):
            custom = {"thread_id": thread_id} if thread_id else {}
            out = agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom})
            thread_id = out.custom_outputs["thread_id"]
    return thread_id


def run(server_url: str | None = None, *, quick: bool = False) -> dict[str, Any]:
    """Measure every figure; `server_url` is unused (start-up needs no server). Returns the report."""
    runs = QUICK_RUNS if quick else RUNS
    agent_runs = QUICK_AGENT_RUNS if quick else AGENT_RUNS
    baseline = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="tt-startup-") as tmp:
        cwd = Path(tmp)
        env = measured_environment()
        thread_id = demo_thread(cwd)
        warm = not quick
        measured = {
            "help": paired([*tt_agent(), "--help"], baseline, runs, cwd, env, warm_up=warm),
            "version": paired([*tt_agent(), "--version"], baseline, runs, cwd, env, warm_up=warm),
            "history": paired([*tt_agent(), "history", thread_id], baseline, runs, cwd, env, warm_up=warm),
            "create_agent": paired(
                [sys.executable, "-c", CREATE_AGENT], [sys.executable, "-c", LANGGRAPH_IMPORT], agent_runs, cwd, env,
                warm_up=warm,
            ),
            # The warm-up run also creates the tracing store (.agent/mlflow.db), which later runs reuse.
            "serve": paired_runs(
                lambda: served_until_ready(cwd, env),
                lambda: timed([sys.executable, "-c", SERVER_BASELINE], cwd, env),
                agent_runs,
                warm_up=warm,
            ),
        }
    values = {
        "help_wall_ratio": measured["help"]["wall_ratio"],
        "history_wall_ratio": measured["history"]["wall_ratio"],
        "version_wall_ratio": measured["version"]["wall_ratio"],
        "help_cpu_ratio": measured["help"]["cpu_ratio"],
        "history_cpu_ratio": measured["history"]["cpu_ratio"],
        "baseline_wall_s": measured["help"]["baseline_wall_s"],
        "help_wall_s": measured["help"]["wall_s"],
        "history_wall_s": measured["history"]["wall_s"],
        "create_agent_cpu_ratio": measured["create_agent"]["cpu_ratio"],
        "create_agent_wall_ratio": measured["create_agent"]["wall_ratio"],
        "serve_cpu_ratio": measured["serve"]["cpu_ratio"],
        "serve_wall_ratio": measured["serve"]["wall_ratio"],
        "create_agent_cpu_s": measured["create_agent"]["cpu_s"],
        "langgraph_cpu_s": measured["create_agent"]["baseline_cpu_s"],
        "serve_cpu_s": measured["serve"]["cpu_s"],
        "server_import_cpu_s": measured["serve"]["baseline_cpu_s"],
    }
    return report.build_report(
        FIGURES, values, header=report.environment(None), runs=runs, measurements=measured
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    report.print_report("tt-agent start-up against python -c pass, a cold agent against its libraries", result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs of each command instead of {RUNS}")
    parser.add_argument("--json", type=Path, help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    print_result(result)
    if args.json:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
