"""What every benchmark prints and saves: its figures against their targets, the machine, versions, JSON.

A benchmark declares its figures once (`Figure`: label, target, check,
format), measures values, and hands both to `build_report`; `print_report`
draws the table `figure | measured | target | pass` and the line
`targets met: X/Y`, and `write_json` saves everything. A figure that could not
be measured has the value None: shown as "not measured", and its target
counts as missed. The header records what skews timings: the machine, its
load average at the start, and the versions of the libraries measured.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The libraries whose versions a report records.
DEFAULT_PACKAGES = (
    "timetravel-agent",
    "langgraph",
    "langgraph-checkpoint-postgres",
    "langchain-openai",
    "mlflow",
    "psycopg",
    "psycopg-pool",
    "uvicorn",
    "httpx",
)


def fixed(digits: int, unit: str = "") -> Callable[[Any], str]:
    """A formatter: a number with `digits` decimals and an optional unit (`fixed(2, " s")(1.5)` is `1.50 s`)."""
    return lambda value: f"{value:.{digits}f}{unit}"


def yes_no(value: Any) -> str:
    return "yes" if value else "NO"


@dataclass(frozen=True)
class Figure:
    """One line of a report: what is measured and, for a targeted figure, what it must reach."""

    label: str
    target: str = ""
    """The target as shown, e.g. `<= 1.3`; empty for a figure reported for reference."""
    check: Callable[[Any], bool] | None = None
    """Whether a measured value meets the target; None for a figure without target."""
    fmt: Callable[[Any], str] = str


def build_report(
    figures: Mapping[str, Figure],
    values: Mapping[str, Any],
    *,
    notes: Mapping[str, str] | None = None,
    failed: Iterable[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The report of one run: a row per figure, the count of targets met, and `extra` (header, measurements).

    Args:
        figures: the benchmark's figures by key, in table order.
        values: the measured value by key; a missing key or None is "not measured".
        notes: a short remark shown after a value (e.g. "3 of 200 turns failed").
        failed: keys whose target is missed whatever the value (a time measured over failed turns).

    Returns:
        `{"figures": {key: {"figure", "measured", "shown", "note", "target", "pass"}},
        "targets_met", "targets_total", **extra}`; `pass` is None for a figure without target.
    """
    notes, failed = notes or {}, set(failed)
    rows: dict[str, dict[str, Any]] = {}
    for key, figure in figures.items():
        value = values.get(key)
        passed = None
        if figure.check is not None:
            passed = value is not None and key not in failed and bool(figure.check(value))
        rows[key] = {
            "figure": figure.label,
            "measured": value,
            "shown": "not measured" if value is None else figure.fmt(value),
            "note": notes.get(key, ""),
            "target": figure.target,
            "pass": passed,
        }
    targeted = [row for row in rows.values() if row["pass"] is not None]
    return {
        "figures": rows,
        "targets_met": sum(row["pass"] for row in targeted),
        "targets_total": len(targeted),
        **extra,
    }


def environment(postgres_version: str | None, packages: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, Any]:
    """The report header: date (UTC), machine, load average now (1, 5, 15 min) and package versions."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "postgres": postgres_version,
            # Other work on the machine skews timings.
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": package_versions(packages),
    }


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """The installed version of each distribution, None where it is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def peak_rss_mb() -> float:
    """The peak resident memory of this process, in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def summary_line(report: Mapping[str, Any]) -> str:
    """`targets met: X/Y`, with the missed figures' labels: one line scripts can grep."""
    missed = [row["figure"] for row in report["figures"].values() if row["pass"] is False]
    line = f"targets met: {report['targets_met']}/{report['targets_total']}"
    return line + (f" (missed: {'; '.join(missed)})" if missed else "")


def print_report(
    title: str, report: Mapping[str, Any], *, width: int = 140, details: Callable[[], None] | None = None
) -> None:
    """Print the figures table, the header lines, `details()` (a benchmark's own lines) and the summary line."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, markup=False, highlight=False)
    table = Table(title=title)
    for column in ("figure", "measured", "target", "pass"):
        table.add_column(column, justify="left" if column in ("figure", "measured") else "right")
    for row in report["figures"].values():
        verdict = "" if row["pass"] is None else ("yes" if row["pass"] else "NO")
        measured = row["shown"] + (f" ({row['note']})" if row["note"] else "")
        table.add_row(row["figure"], measured, row["target"], verdict)
    console.print(table)
    machine = report.get("machine")
    if machine:
        console.print(f"date: {report.get('date')}")
        console.print(
            f"machine: {machine['platform']}, {machine['cpu_count']} CPUs, Python {machine['python']}, "
            f"PostgreSQL {machine['postgres']}, load average at start {machine['load_average']}"
        )
    if report.get("versions"):
        console.print("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    if details is not None:
        details()
    # Plain print: one unwrapped line.
    print(summary_line(report), flush=True)


def write_json(path: Path, report: Mapping[str, Any]) -> None:
    """Write the report as JSON (no NaN or infinity: a value that is not a finite number must be None)."""
    path.write_text(json.dumps(report, indent=2, allow_nan=False, default=str) + "\n")


#: Report keys in which a benchmark names what of it could not run (its figures are then "not measured").
INNER_FAILURES = ("error", "broken_phases", "broken_configurations")


def add_common_options(parser: Any, *, quick_help: str, json_help: str) -> None:
    """`--quick`, `--json FILE` and `--database-url URL` (default: AGENT_TEST_DATABASE_URL, else the local server)."""
    from bench.databases import DEFAULT_SERVER_URL

    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, help=json_help)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("AGENT_TEST_DATABASE_URL", DEFAULT_SERVER_URL),
        help="a Postgres server URL (default: AGENT_TEST_DATABASE_URL, else the local server)",
    )


def postgres_reachable(url: str) -> bool:
    """Whether a Postgres server answers at `url`; if not, says so on stderr."""
    import sys

    from bench.databases import server_version

    try:
        server_version(url)
    except Exception as exc:  # psycopg.Error, ValueError for a malformed URL
        print(f"error: Postgres is not reachable at --database-url: {type(exc).__name__}", file=sys.stderr)
        return False
    return True


def standalone_main(
    doc: str,
    run: Callable[..., dict[str, Any]],
    print_result: Callable[[dict[str, Any]], None],
    argv: list[str] | None = None,
    *,
    quick_help: str = "a reduced size (a smoke test)",
) -> int:
    """`python -m bench.<name>`: parse `--quick`, `--json FILE`, `--database-url URL`, run, print, save.

    `doc` is the module docstring (its first paragraph is the description). Returns the exit code: 0, 1 when
    the report names a part that could not run (`INNER_FAILURES`), 2 when Postgres is not reachable.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_common_options(parser, quick_help=quick_help, json_help="also write every figure and measurement to this JSON file")
    args = parser.parse_args(argv)
    if not postgres_reachable(args.database_url):
        return 2
    result = run(args.database_url, quick=args.quick)
    print_result(result)
    failures = [f"{key}: {result[key]}" for key in INNER_FAILURES if result.get(key)]
    for failure in failures:
        print(failure, file=sys.stderr)
    if args.json is not None:
        write_json(args.json, result)
    return 1 if failures else 0
