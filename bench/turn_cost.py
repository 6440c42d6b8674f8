"""The fixed cost of a turn: storage bytes by message size, and a Postgres turn against an in-memory one.

Usage::

    python -m bench.turn_cost [--quick] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it after `storage`.) Two measurements, each beside the
reference design of `bench.storage` (the Databricks notebooks' `MessagesState`
+ `PostgresSaver`, and `SqliteSaver` for the file):

* **Storage by message size.** For user messages of `MESSAGE_SIZES` bytes
  (short, medium, long), one thread of `TURNS` turns with the offline model on
  this project (`REFERENCE_TURNS` on the reference design), on Postgres (every table of a scratch database with indexes and
  TOAST, `pg_total_relation_size`, less the free space of the heap pages with
  room for another row and of the index pages a VACUUM freed, after the thread minus before it, each read after a plain
  `VACUUM`: see `vacuumed_database_bytes`; the pages allocated, free space
  included, are in the figure's note) and on a
  SQLite file (its size after `VACUUM`, after minus before). The fixed cost of
  a turn is (bytes added - the UTF-8 bytes of the text of every message the
  thread holds) / turns: what a turn costs beyond what was said. Both designs
  ran a warm-up thread first, so the tables' first pages are not counted.
* **A Postgres turn over an in-memory one.** This project on Postgres and on
  `memory://`, a new thread each, `LATENCY_TURNS` turns in lockstep (turn t on
  both before turn t+1, so a busy moment of the machine hits both alike), p50
  of the last `WINDOW` turns of each; `ROUNDS` times, with the default settings
  (tracing as `create_agent` resolves it: on only where an MLflow tracking
  server is configured) and with tracing on into a local MLflow store (what a
  user who traces gets; both designs traced). The figure is the worst round.
  Beside it, for reference, the time each Postgres turn spent waiting for the
  server (`RoundTrips`: the claim's round trip and the durable commit's, as
  psycopg waits for them) and the same ratio with those waits taken out of
  each turn: what the agent's own work on Postgres adds to a turn, and what
  the server's two round trips add.

Beside them, the server's own price of a durable commit: the p50 of
`DURABLE_COMMITS` one-row INSERTs in autocommit (each waits for its WAL flush,
`synchronous_commit = on`, the default) and of the same with
`synchronous_commit = off`. A turn commits once, durably, and an in-memory
turn never waits for a disk, so where the server's flush takes milliseconds
(a shared or network disk) it alone sets a floor under the ratio.

The offline model answers by quoting the user's messages, so its replies grow
with the message size; every figure counts the replies' text as message bytes.
"""

from __future__ import annotations

import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from agent.models import OfflineChatModel
from bench import report
from bench.databases import scratch_database, server_version
from bench.storage import _WORDS, Design, Project, Reference, database_bytes, message_bytes, p50_ms

TITLE = "turn cost: fixed storage bytes per turn by message size, Postgres turn / in-memory turn"
#: User message sizes in bytes (ASCII): short, medium and long chat turns.
MESSAGE_SIZES = {"short": 200, "medium": 700, "long": 5000}
#: Turns of each storage thread of this project (a full run, and `--quick`). A thousand, because over fewer
#: turns the figure measures pages rather than rows: with 100 turns an 8 kB page is 82 bytes a turn, and the
#: B-tree indexes (the checkpoints' primary key and owner index, the blobs' key, the catalogue's) fit the
#: thread's entries into pages the warm-up had already made, so they added nothing: 468 bytes a turn with
#: 200-byte messages over 100 turns, 624 over 1,000 (this release, 2026-12-06).
TURNS, QUICK_TURNS = 1000, 3
#: Turns of the reference design's storage threads: it stores every message again in every checkpoint, so
#: its bytes grow with the square of the turns, and 1,000 turns of 5 kB messages would be gigabytes.
REFERENCE_TURNS = 100
#: Turns of each latency thread, the window whose p50 is compared, and the rounds. A window of 40: over 10
#: turns the p50 moved with a single export of a sampled trace (MLflow's async logging thread takes the GIL
#: for 20 to 30 ms of CPU): two runs of 60 turns gave tracing-on rounds from 0.58 to 1.54, two of 80 turns
#: with this window 1.22 to 1.55, on an idle machine (2026-12-06).
LATENCY_TURNS, QUICK_LATENCY_TURNS = 80, 10
WINDOW = 40  # a quick run times fewer turns, and takes them all
ROUNDS, QUICK_ROUNDS = 3, 1
WARMUP_TURNS = 3
#: The target of the fixed cost of a turn, bytes.
FIXED_BYTES_TARGET = 500
#: One-row commits timed for the server's durable-commit figure.
DURABLE_COMMITS = 200


def user_message(turn: int, size: int) -> str:
    """Deterministic ASCII text of exactly `size` bytes, drawn from a vocabulary (so TOAST cannot hide copies)."""
    draw = random.Random(turn * 7919 + size)
    text = f"Turn {turn:05d}:"
    while len(text) < size:
        text += " " + draw.choice(_WORDS)
    return text[:size]


def new_thread_id(label: str) -> str:
    return f"cost-{label}-{uuid.uuid4().hex[:8]}"


def run_thread(design: Design, size: int, turns: int, label: str) -> tuple[str, int]:
    """One new thread of `turns` turns; (its id, the text bytes of its messages at the end)."""
    thread_id = new_thread_id(label)
    for turn in range(1, turns + 1):
        design.turn(thread_id, user_message(turn, size))
    return thread_id, message_bytes(design.messages(thread_id))


def warm_up(design: Design, size: int) -> None:
    run_thread(design, size, WARMUP_TURNS, "warmup")


# -- storage ------------------------------------------------------------------------------
# The bytes of every table's rows and index entries: the main fork of each table, of its TOAST table and of
# their indexes, less the free space its heaps hold in pages with room for another row, and its indexes' free
# pages, as the free-space maps record them after a VACUUM (pg_freespacemap). The maps themselves (the
# free-space and visibility forks, a few pages per relation whatever its size, made when a VACUUM first records
# something in them) are left out: the catalogue's indexes first record a free page during the measured thread,
# and their two new maps (48 kB) would be counted as 49 bytes a turn of 1,000 (2026-12-06). A heap row is at
# most about 2 kB (Postgres compresses or moves a longer one to TOAST: TOAST_TUPLE_THRESHOLD), so a page with
# `REUSABLE_BYTES` free takes another row of any table here; less than that can be the gap at the end of a full
# page, which rows do cost, and stays counted. An index's map records only whole pages its VACUUM emptied and
# deleted, which the index's next page splits reuse (see `vacuumed_database_bytes`).
REUSABLE_BYTES = 2048
USED_BYTES_SQL = f"""
WITH tables AS (
    SELECT c.oid, c.reltoastrelid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
      AND n.nspname NOT LIKE 'pg_toast%'
), heaps AS (
    SELECT oid FROM tables UNION ALL SELECT reltoastrelid FROM tables WHERE reltoastrelid <> 0
), relations AS (
    SELECT oid FROM heaps UNION ALL SELECT i.indexrelid FROM pg_index i JOIN heaps h ON h.oid = i.indrelid
)
SELECT coalesce(sum(pg_relation_size(r.oid)
    - (SELECT coalesce(sum(f.avail) FILTER (WHERE f.avail >= {REUSABLE_BYTES}), 0) FROM pg_freespace(r.oid) f)), 0)::bigint
FROM relations r
"""


def vacuumed_database_bytes(url: str) -> tuple[int, int]:
    """(used, allocated) bytes of every table of the database, after a plain `VACUUM` (two: see below): allocated
    is `database_bytes`, used is that less the free space the heaps and indexes hold (`USED_BYTES_SQL`).

    After the VACUUM the dead row versions of the rows every turn updates (the thread's record, its claim)
    are free space, and every table has its free-space and visibility maps already, so neither
    autovacuum's timing nor those maps' first pages land in one design's figure.

    Why used bytes are the figure: a table's pages fill from several places at once. Each connection
    that inserts keeps its own target page (Postgres' relation extension), and the pool hands a
    sequence of turns to its connections in turn, so a thread of 100 turns leaves up to one partly
    filled page per connection in each table. Those pages are free space that later inserts fill (the
    VACUUM records it), not bytes a turn stores, but at 100 turns each of them is 82 bytes a turn: three
    identical runs of 200-byte messages measured 533, 697 and 943 allocated bytes a turn, and 459, 460
    and 461 used.

    The same holds for an index whose entries a turn replaces: every turn moves the thread's catalogue row
    to a new `updated_at`, which two indexes order, and the VACUUM deletes the pages left holding only
    dead entries. A deleted B-tree page is recycled (and recorded in the index's free-space map) only
    once no transaction could still be reading it: after a transaction id newer than its deletion,
    hence the second VACUUM after `txid_current()` (Postgres' nbtree README, "Page deletion and
    recycling"). One thread of 1,000 turns of 200-byte messages left 57 such bytes a turn in the two
    indexes (2026-12-06); counted as used before, they are free space here as the heaps' is.
    """
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        conn.execute("SELECT txid_current()")
        conn.execute("VACUUM")
        used = int(conn.execute(USED_BYTES_SQL).fetchone()[0])
    return used, database_bytes(url)


def postgres_storage(server_url: str, design_name: str, turns: int) -> dict[str, dict[str, float]]:
    """For each message size, one thread on the design in one scratch database (bytes after - before)."""
    out = {}
    with scratch_database(server_url, "tt_bench_cost") as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_freespacemap")
        design = Reference.on_postgres(url, OfflineChatModel()) if design_name == "reference" else Project(url)
        try:
            for label, size in MESSAGE_SIZES.items():
                print(f"  storage: {design_name}, {label} messages ({size} B), Postgres ...", flush=True)
                warm_up(design, size)
                used_before, allocated_before = vacuumed_database_bytes(url)
                _, raw = run_thread(design, size, turns, design_name)
                used_after, allocated_after = vacuumed_database_bytes(url)
                added, allocated = used_after - used_before, allocated_after - allocated_before
                out[label] = {
                    "bytes": added,
                    "allocated_bytes": allocated,
                    "message_bytes": raw,
                    "fixed_per_turn": (added - raw) / turns,
                    "fixed_allocated_per_turn": (allocated - raw) / turns,
                }
        finally:
            design.close()
    return out


def vacuumed_size(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    conn.close()
    return path.stat().st_size


def sqlite_storage(workdir: Path, design_name: str, size: int, turns: int) -> dict[str, float]:
    path = workdir / f"{design_name}-{size}-{uuid.uuid4().hex[:6]}.sqlite"

    def open_design() -> Design:
        if design_name == "reference":
            return Reference.on_sqlite(str(path), OfflineChatModel())
        return Project(f"sqlite:///{path}")

    design = open_design()
    try:
        warm_up(design, size)
    finally:
        design.close()
    before = vacuumed_size(path)
    design = open_design()
    try:
        _, raw = run_thread(design, size, turns, design_name)
    finally:
        design.close()
    added = vacuumed_size(path) - before
    return {"bytes": added, "message_bytes": raw, "fixed_per_turn": (added - raw) / turns}


def measure_storage(server_url: str, turns: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for design_name in ("project", "reference"):
        design_turns = min(turns, REFERENCE_TURNS) if design_name == "reference" else turns
        for label, found in postgres_storage(server_url, design_name, design_turns).items():
            out[f"{design_name}_postgres_{label}"] = {**found, "turns": design_turns}
        for label, size in MESSAGE_SIZES.items():
            print(f"  storage: {design_name}, {label} messages ({size} B), SQLite ...", flush=True)
            out[f"{design_name}_sqlite_{label}"] = {**sqlite_storage(workdir, design_name, size, design_turns), "turns": design_turns}
    return out


# -- latency --------------------------------------------------------------------------------
def commit_p50_ms(server_url: str) -> dict[str, float]:
    """p50 (ms) of a one-row INSERT in autocommit, with `synchronous_commit` on and off, in a scratch database."""
    import psycopg

    out = {}
    with scratch_database(server_url, "tt_bench_cost") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE commits (n integer)")
        for setting in ("on", "off"):
            conn.execute(f"SET synchronous_commit = {setting}")
            times = []
            for n in range(DURABLE_COMMITS):
                start = time.perf_counter()
                conn.execute("INSERT INTO commits VALUES (%s)", (n,))
                times.append(time.perf_counter() - start)
            out[setting] = p50_ms(times)
    return out


class RoundTrips:
    """The seconds this process spends in psycopg's waits for the server (sending a query and waiting for
    its answer), summed over every Postgres connection of the agent while `timing()` is open: it wraps
    `DeadlineConnection.wait`, the one wait every query and commit of the agent goes through
    (`agent.storage.postgres.round_trips`)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timing(self) -> Iterator[RoundTrips]:
        from agent.storage.postgres.round_trips import DeadlineConnection

        wait = DeadlineConnection.wait

        def timed(conn: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return wait(conn, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        DeadlineConnection.wait = timed  # type: ignore[method-assign]
        try:
            yield self
        finally:
            DeadlineConnection.wait = wait  # type: ignore[method-assign]


def lockstep_round(designs: dict[str, Design], turns: int) -> dict[str, float]:
    """One new thread per design, in lockstep; p50 (ms) of each design's last `WINDOW` turns, and as
    `postgres_less_round_trips` the p50 of the Postgres turns' wall less their round trips' waits
    (`RoundTrips`), and as `round_trips` the p50 of those waits."""
    threads = {name: new_thread_id(name) for name in designs}
    times: dict[str, list[float]] = {name: [] for name in designs}
    waits: list[float] = []
    with RoundTrips().timing() as round_trips:
        for turn in range(1, turns + 1):
            text = user_message(turn, MESSAGE_SIZES["short"])
            for name, design in designs.items():
                before = round_trips.seconds
                start = time.perf_counter()
                design.turn(threads[name], text)
                times[name].append(time.perf_counter() - start)
                if name == "postgres":
                    waits.append(round_trips.seconds - before)
    out = {name: p50_ms(values[-WINDOW:]) for name, values in times.items()}
    if waits:
        out["round_trips"] = p50_ms(waits[-WINDOW:])
        out["postgres_less_round_trips"] = p50_ms([t - w for t, w in zip(times["postgres"], waits)][-WINDOW:])
    return out


class DefaultProject(Project):
    """This project with `create_agent`'s default settings (tracing resolved as it resolves it)."""

    def __init__(self, url: str, **settings: Any) -> None:
        from agent import create_agent

        self.agent = create_agent(url, model="offline", **settings)


def measure_latency(server_url: str, turns: int, rounds: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, settings in (("default", {}), ("tracing_on", {"tracing": True}), ("tracing_off", {"tracing": False})):
        print(f"  latency: Postgres / memory://, {mode}, {rounds} round(s) of {turns} turns ...", flush=True)
        restore = None
        if mode == "tracing_on":
            import mlflow

            restore = os.environ.get("MLFLOW_TRACKING_URI")
            mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
        try:
            with scratch_database(server_url, "tt_bench_cost") as url:
                postgres, memory = DefaultProject(url, **settings), DefaultProject("memory://", **settings)
                try:
                    for design in (postgres, memory):
                        warm_up(design, MESSAGE_SIZES["short"])
                    found = [lockstep_round({"postgres": postgres, "memory": memory}, turns) for _ in range(rounds)]
                    out[mode] = {
                        "tracing": bool(postgres.agent.settings.tracing),
                        "rounds": found,
                        "ratios": [r["postgres"] / r["memory"] for r in found],
                        "ratios_less_round_trips": [r["postgres_less_round_trips"] / r["memory"] for r in found],
                    }
                finally:
                    postgres.close()
                    memory.close()
        finally:
            if restore is not None or mode == "tracing_on":
                import mlflow

                mlflow.set_tracking_uri(restore or "")
    return out


# -- figures ---------------------------------------------------------------------------------
def figures() -> dict[str, report.Figure]:
    bytes_, ratio, ms = report.fixed(0, " B"), report.fixed(2), report.fixed(2, " ms")
    table: dict[str, report.Figure] = {}
    for backend in ("postgres", "sqlite"):
        for label, size in MESSAGE_SIZES.items():
            table[f"fixed_{backend}_{label}"] = report.Figure(
                f"{backend}: fixed bytes per turn beyond message bytes, {size} B messages",
                f"<= {FIXED_BYTES_TARGET}",
                lambda v: v <= FIXED_BYTES_TARGET,
                bytes_,
            )
    table["postgres_vs_memory_default"] = report.Figure(
        "turn p50 Postgres / memory://, default settings (worst round)", "<= 1.3", lambda v: v <= 1.3, ratio
    )
    table["postgres_vs_memory_traced"] = report.Figure(
        "turn p50 Postgres / memory://, tracing on (worst round)", "<= 1.3", lambda v: v <= 1.3, ratio
    )
    table["postgres_vs_memory_untraced"] = report.Figure("turn p50 Postgres / memory://, tracing off (worst round)", fmt=ratio)
    table["postgres_less_round_trips"] = report.Figure(
        "turn p50 Postgres less its waits for the server / memory://, default settings (worst round)", fmt=ratio
    )
    table["round_trips_ms"] = report.Figure("a Postgres turn's waits for the server, p50, default settings", fmt=ms)
    table["turn_ms_postgres_default"] = report.Figure("Postgres turn p50, default settings (last round)", fmt=ms)
    table["turn_ms_postgres_traced"] = report.Figure("Postgres turn p50, tracing on (last round)", fmt=ms)
    table["durable_commit_ms"] = report.Figure("the server's durable one-row commit p50 (its WAL flush)", fmt=ms)
    return table


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    """Measure both parts; the report (`bench.report.build_report`), with `measurements` holding every number."""
    turns = QUICK_TURNS if quick else TURNS
    latency_turns, rounds = (QUICK_LATENCY_TURNS, QUICK_ROUNDS) if quick else (LATENCY_TURNS, ROUNDS)
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-bench-cost-") as tmp:
        storage = measure_storage(server_url, turns, Path(tmp))
        latency = measure_latency(server_url, latency_turns, rounds, Path(tmp))
        commits = commit_p50_ms(server_url)
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for backend in ("postgres", "sqlite"):
        for label in MESSAGE_SIZES:
            ours, ref = storage[f"project_{backend}_{label}"], storage[f"reference_{backend}_{label}"]
            values[f"fixed_{backend}_{label}"] = ours["fixed_per_turn"]
            notes[f"fixed_{backend}_{label}"] = (
                f"{ours['bytes'] / ours['message_bytes']:.2f}x message bytes; reference {ref['fixed_per_turn']:.0f} B, "
                f"{ref['bytes'] / ref['message_bytes']:.1f}x ({ref['turns']} turns)"
            )
            if "fixed_allocated_per_turn" in ours:
                notes[f"fixed_{backend}_{label}"] += f"; pages allocated {ours['fixed_allocated_per_turn']:.0f} B"
    for mode, key in (("default", "postgres_vs_memory_default"), ("tracing_on", "postgres_vs_memory_traced"),
                      ("tracing_off", "postgres_vs_memory_untraced")):  # fmt: skip
        values[key] = max(latency[mode]["ratios"])
        notes[key] = "rounds " + ", ".join(f"{r:.2f}" for r in latency[mode]["ratios"])
        if mode == "default":
            notes[key] += f"; tracing {'on' if latency[mode]['tracing'] else 'off'}"
    default_rounds = latency["default"]["rounds"]
    values["postgres_less_round_trips"] = max(latency["default"]["ratios_less_round_trips"])
    notes["postgres_less_round_trips"] = "rounds " + ", ".join(
        f"{r:.2f}" for r in latency["default"]["ratios_less_round_trips"]
    ) + "; what the agent's own work on Postgres adds: the claim's and the commit's round trips taken out"
    values["round_trips_ms"] = default_rounds[-1]["round_trips"]
    notes["round_trips_ms"] = (
        "the claim and the durable commit, in psycopg's waits (last round): "
        f"{default_rounds[-1]['round_trips'] / default_rounds[-1]['memory']:.2f} of a memory:// turn"
    )
    values["turn_ms_postgres_default"] = latency["default"]["rounds"][-1]["postgres"]
    notes["turn_ms_postgres_default"] = f"memory:// {latency['default']['rounds'][-1]['memory']:.2f} ms"
    values["turn_ms_postgres_traced"] = latency["tracing_on"]["rounds"][-1]["postgres"]
    notes["turn_ms_postgres_traced"] = f"memory:// {latency['tracing_on']['rounds'][-1]['memory']:.2f} ms"
    values["durable_commit_ms"] = commits["on"]
    notes["durable_commit_ms"] = f"{commits['off']:.2f} ms with synchronous_commit = off"
    return report.build_report(
        figures(),
        values,
        notes=notes,
        **header,
        turns=turns,
        latency_turns=latency_turns,
        rounds=rounds,
        message_sizes=MESSAGE_SIZES,
        measurements={"storage": storage, "latency": latency, "commit_p50_ms": commits},
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE, result)


if __name__ == "__main__":
    sys.exit(report.standalone_main(__doc__, run, print_result))
