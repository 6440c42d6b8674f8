"""Start-up benchmark: how long `tt-agent --help`, `--version` and `history` take, against `python -c pass`.

    python -m bench.startup [--quick] [--json FILE]

Each command runs as a whole process, in turn with `python -c pass` (A B A B …,
after one warm-up each), so a machine that slows down slows both; a figure is
the median of the pairwise ratios, of wall time and of CPU time (user + system,
from `resource.getrusage(RUSAGE_CHILDREN)`). `history` reads a thread of three
turns from the SQLite default store (`.agent/checkpoints.sqlite` in a temporary
directory), as after `tt-agent demo`.

Targets (issue: the first ten minutes): `--help` <= 10x and `history` <= 25x
`python -c pass`. What makes them reachable is held by tests/test_startup.py
(no MLflow, LangChain or LangGraph is imported); this script only measures.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report

RUNS, QUICK_RUNS = 15, 3


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
}


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


def paired(command: Sequence[str], baseline: Sequence[str], runs: int, cwd: Path, env: dict[str, str]) -> dict[str, float]:
    """Run `command` and `baseline` in turn `runs` times (after a warm-up each); medians and median ratios."""
    timed(command, cwd, env)
    timed(baseline, cwd, env)
    walls, cpus, base_walls, wall_ratios, cpu_ratios = [], [], [], [], []
    for _ in range(runs):
        wall, cpu = timed(command, cwd, env)
        base_wall, base_cpu = timed(baseline, cwd, env)
        walls.append(wall)
        cpus.append(cpu)
        base_walls.append(base_wall)
        wall_ratios.append(wall / base_wall)
        cpu_ratios.append(cpu / max(base_cpu, 1e-3))
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "baseline_wall_s": statistics.median(base_walls),
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    baseline = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="tt-startup-") as tmp:
        cwd = Path(tmp)
        thread_id = demo_thread(cwd)
        measured = {
            "help": paired([*tt_agent(), "--help"], baseline, runs, cwd, env),
            "version": paired([*tt_agent(), "--version"], baseline, runs, cwd, env),
            "history": paired([*tt_agent(), "history", thread_id], baseline, runs, cwd, env),
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
    }
    return report.build_report(
        FIGURES, values, header=report.environment(None), runs=runs, measurements=measured
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    report.print_report("tt-agent start-up against python -c pass", result)


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
