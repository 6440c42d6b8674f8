"""Where a turn's bytes go: storage added per turn, table by table, on Postgres and SQLite.

Usage::

    python -m bench.turn_bytes [--quick] [--json out.json] [--database-url URL]

`bench.turn_cost` gives one figure per message size (the fixed cost of a
turn); this part splits it. One thread of `TURNS` turns of this project per
message size (`turn_cost.MESSAGE_SIZES`), after a warm-up thread, and for each
table (with its indexes and TOAST on Postgres, `pg_total_relation_size` after a
plain `VACUUM`; each table and index separately on SQLite, `dbstat` after
`VACUUM`) the bytes added / turns. Beside them, the message text bytes per turn
(what the fixed cost is measured beyond). Only measurements: no target.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import report
from bench.databases import scratch_database, server_version
from bench.storage import Project
from bench.turn_cost import MESSAGE_SIZES, run_thread, warm_up

TITLE = "turn bytes: storage added per turn, table by table"
TURNS, QUICK_TURNS = 100, 3

RELATION_BYTES_SQL = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname = 'public'
"""


def postgres_tables(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        return {name: int(size) for name, size in conn.execute(RELATION_BYTES_SQL).fetchall()}


def sqlite_tables(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        found = {name: int(size) for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")}
    conn.close()
    found["(file)"] = path.stat().st_size
    return found


def added(before: dict[str, int], after: dict[str, int], turns: int) -> dict[str, float]:
    names = sorted(set(before) | set(after))
    out = {name: (after.get(name, 0) - before.get(name, 0)) / turns for name in names}
    return {name: value for name, value in out.items() if value}


def measure(server_url: str, turns: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with scratch_database(server_url, "tt_bench_bytes") as url:
        design = Project(url)
        try:
            for label, size in MESSAGE_SIZES.items():
                print(f"  postgres, {label} messages ({size} B) ...", flush=True)
                warm_up(design, size)
                before = postgres_tables(url)
                _, raw = run_thread(design, size, turns, "bytes")
                out[f"postgres_{label}"] = {"tables": added(before, postgres_tables(url), turns), "message_bytes": raw / turns}
        finally:
            design.close()
    for label, size in MESSAGE_SIZES.items():
        print(f"  sqlite, {label} messages ({size} B) ...", flush=True)
        path = workdir / f"bytes-{size}-{uuid.uuid4().hex[:6]}.sqlite"
        design = Project(f"sqlite:///{path}")
        try:
            warm_up(design, size)
        finally:
            design.close()
        before = sqlite_tables(path)
        design = Project(f"sqlite:///{path}")
        try:
            _, raw = run_thread(design, size, turns, "bytes")
        finally:
            design.close()
        out[f"sqlite_{label}"] = {"tables": added(before, sqlite_tables(path), turns), "message_bytes": raw / turns}
    return out


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    """The report (`bench.report.build_report`), with `measurements` holding every table's bytes per turn."""
    turns = QUICK_TURNS if quick else TURNS
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-bench-bytes-") as tmp:
        found = measure(server_url, turns, Path(tmp))
    return report.build_report(
        {}, {}, **header, turns=turns, measurements=found, elapsed_seconds=time.perf_counter() - started
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE, result)
    found = result["measurements"]
    for key, entry in found.items():
        tables = entry["tables"]
        total = tables.get("(file)", sum(tables.values()))
        print(f"\n{key}: message text {entry['message_bytes']:.0f} B/turn, stored {total:.0f} B/turn, "
              f"fixed {total - entry['message_bytes']:.0f} B/turn")
        for name, value in sorted(tables.items(), key=lambda kv: -kv[1]):
            print(f"  {name:40s} {value:9.0f}")


if __name__ == "__main__":
    sys.exit(report.standalone_main(__doc__, run, print_result))
