#!/usr/bin/env python
"""Every benchmark of the project, one after the other, with one summary of the targets met.

Usage::

    python scripts/bench.py [--quick] [--only NAME ...] [--json FILE] [--database-url URL]

The parts are the modules `bench.<name>` listed in `PARTS`, in that order. Each
has `run(server_url, *, quick) -> report` (`bench.report.build_report`) and
`print_result(report)`; each can also run alone (`python -m bench.<name>`),
and its docstring says what it measures and how.

`--quick` runs every part at a reduced size (a smoke test: its figures are not
the project's figures). `--json FILE` saves `{"parts": {name: report},
"targets_met", "targets_total", "broken_parts"}`. The Postgres server comes
from `--database-url`, else `AGENT_TEST_DATABASE_URL`, else the local server;
every part creates and drops its own scratch databases.

Exit code: 0 when every part ran (missed targets included), 1 when a part or
one of its phases could not run (its traceback or error is on stderr, the other
parts still run), 2 when Postgres is not reachable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Runnable as `python scripts/bench.py` from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report  # noqa: E402

#: The benchmarks, `bench.<name>`, in the order they run.
PARTS = [
    "storage", "turn_cost", "encryption", "branches", "search", "export", "catalogue", "context", "memory",
    "memory_eval", "runs", "startup", "load", "web", "streams", "users",
]  # fmt: skip


def run_parts(names: list[str], server_url: str, *, quick: bool) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Run and print each part; (reports by name, names of the parts that could not run)."""
    reports: dict[str, dict[str, Any]] = {}
    broken: list[str] = []
    for name in names:
        print(f"\n=== bench.{name}{' (quick)' if quick else ''} ===", flush=True)
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
            result = module.run(server_url, quick=quick)
            module.print_result(result)
        except Exception:  # noqa: BLE001 - one broken part must not hide the others' figures
            traceback.print_exc()
            broken.append(name)
            continue
        reports[name] = result
        if any(result.get(key) for key in report.INNER_FAILURES):
            broken.append(name)
        print(f"bench.{name}: {time.perf_counter() - started:.0f} s", flush=True)
    return reports, broken


def summary(reports: dict[str, dict[str, Any]], broken: list[str]) -> dict[str, Any]:
    """Targets met per part and in total."""
    return {
        "parts": {name: {"targets_met": r["targets_met"], "targets_total": r["targets_total"]} for name, r in reports.items()},
        "targets_met": sum(r["targets_met"] for r in reports.values()),
        "targets_total": sum(r["targets_total"] for r in reports.values()),
        "broken_parts": broken,
    }


def print_summary(totals: dict[str, Any], reports: dict[str, dict[str, Any]]) -> None:
    print("\n=== summary ===")
    for name, result in reports.items():
        print(f"bench.{name}: {report.summary_line(result)}")
    for name in totals["broken_parts"]:
        print(f"bench.{name}: could not run, in whole or in part (see above)")
    print(f"all parts: targets met: {totals['targets_met']}/{totals['targets_total']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    report.add_common_options(parser, quick_help="every part at a reduced size (a smoke test)",
                              json_help="also write every part's report to this JSON file")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="NAME", help=f"run only these parts: {', '.join(PARTS)}")
    args = parser.parse_args(argv)
    if not report.postgres_reachable(args.database_url):
        return 2
    names = [name for name in PARTS if name in (args.only or PARTS)]
    reports, broken = run_parts(names, args.database_url, quick=args.quick)
    totals = summary(reports, broken)
    print_summary(totals, reports)
    if args.json is not None:
        args.json.write_text(json.dumps({**totals, "parts": reports}, indent=2, allow_nan=False, default=str) + "\n")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
