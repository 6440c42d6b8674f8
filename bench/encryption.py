"""Encryption at rest: what it adds per turn to storage and to a turn's time, on Postgres.

Usage::

    python -m bench.encryption [--quick] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it with the other benchmarks.) `--quick` is 12 turns, a smoke test.

Two agents of this project (`bench.storage.Project`, the offline model), one
with `encryption_key` set and one without, each on a fresh scratch database of
the same server (`tt_bench_plain_<hex>`, `tt_bench_sealed_<hex>`, dropped at
the end), run the storage benchmark's thread in lockstep
(`bench.storage.run_threads`: N turns of `USER_MESSAGE_BYTES`-byte user
messages, plus the `WINDOW` turns of a second thread timed beside the last
ones). Figures:

* the encrypted database's growth over the raw bytes of the messages its
  threads hold (the storage benchmark's figure, same target: sealing must not
  break the linear storage of `agent.storage.deltas`);
* the bytes encryption adds per turn, two ways: in the values it changes
  (`VALUE_BYTES_SQL`: the stored size, after TOAST's compression, of every
  blob, checkpoint row's JSON and metadata, and title; a sum over rows, so
  exact), and in the whole database (table, index and TOAST pages, which
  moves by whole 8 kB pages and with dead row versions, so by a few hundred
  bytes per turn either way from one run to the next). Each sealed value
  carries a key id, a nonce, a tag and a format byte (33 bytes) and is
  deflated first when that makes it smaller, which more than pays for the
  blobs (sealed bytes no longer compress in TOAST, deflated ones needed not);
  the previews and the title are base64 text;
* turn p50 over the last `WINDOW` turns, encrypted / plaintext (AES-GCM of a
  few kB is microseconds; the figure shows it is lost in the noise).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg

from agent.encryption import generate_key
from bench import report
from bench.databases import dbname_of, scratch_database, server_version
from bench.storage import WINDOW, Project, database_bytes, message_bytes, run_threads, warm_up

TITLE = "encryption at rest: cost per turn, one thread of {turns} turns on Postgres"

# The stored size (pg_column_size: after TOAST's compression) of every value encryption changes (a turn's
# messages are in its checkpoint's row: `agent.storage.postgres.inline_messages`).
VALUE_BYTES_SQL = """
SELECT (SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_blobs)
     + (SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_writes)
     + (SELECT coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)
                            + coalesce(pg_column_size(agent_messages), 0)), 0) FROM checkpoints)
     + (SELECT coalesce(sum(pg_column_size(title)), 0) FROM agent_threads) AS bytes
"""


def value_bytes(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(VALUE_BYTES_SQL).fetchone()[0])
TURNS, QUICK_TURNS = 200, 12


def figures() -> dict[str, report.Figure]:
    ratio, nbytes = report.fixed(2), report.fixed(0, " B")
    return {
        "sealed_storage_growth": report.Figure("encrypted storage growth / raw message bytes", "<= 3", lambda v: v <= 3, ratio),
        "plain_storage_growth": report.Figure("plaintext storage growth / raw message bytes", fmt=ratio),
        "value_overhead_bytes_per_turn": report.Figure("bytes encryption adds per turn, in the values", fmt=nbytes),
        "overhead_bytes_per_turn": report.Figure("bytes encryption adds per turn, whole database", fmt=nbytes),
        "turn_latency_ratio": report.Figure("turn p50 at N, encrypted / plaintext", fmt=ratio),
    }


def measure(server_url: str, turns: int) -> dict[str, Any]:
    """Both agents' database growth, raw message bytes and turn times (see the module docstring)."""
    with scratch_database(server_url, "tt_bench_plain") as plain_url, scratch_database(server_url, "tt_bench_sealed") as sealed_url:
        designs = {"plain": Project(plain_url), "sealed": Project(sealed_url, encryption_key=generate_key())}
        urls = {"plain": plain_url, "sealed": sealed_url}
        try:
            for design in designs.values():
                warm_up(design)
            before = {name: database_bytes(url) for name, url in urls.items()}
            values_before = {name: value_bytes(url) for name, url in urls.items()}
            found = run_threads(designs, turns)
            out: dict[str, Any] = {"databases": {name: dbname_of(url) for name, url in urls.items()}}
            for name, design in designs.items():
                threads = (found[name]["thread_id"], found[name]["fresh_thread_id"])
                out[name] = {
                    "db_bytes_before": before[name],
                    "db_bytes_after": database_bytes(urls[name]),
                    "value_bytes_before": values_before[name],
                    "value_bytes_after": value_bytes(urls[name]),
                    "raw_message_bytes": sum(message_bytes(design.messages(t)) for t in threads),
                    "turn_p50_ms_last": found[name]["turn_p50_ms_last"],
                }
        finally:
            for design in designs.values():
                design.close()
    out["turns_written"] = turns + WINDOW
    return out


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    """Measure; the report (`bench.report.build_report`), with the raw `measurements`."""
    turns = QUICK_TURNS if quick else TURNS
    started = time.perf_counter()
    print(f"encryption benchmark: {turns} turns, with and without a key, in lockstep", flush=True)
    m = measure(server_url, turns)
    growth = {name: m[name]["db_bytes_after"] - m[name]["db_bytes_before"] for name in ("plain", "sealed")}
    values = {name: m[name]["value_bytes_after"] - m[name]["value_bytes_before"] for name in ("plain", "sealed")}
    figures_ = {
        "sealed_storage_growth": growth["sealed"] / m["sealed"]["raw_message_bytes"],
        "plain_storage_growth": growth["plain"] / m["plain"]["raw_message_bytes"],
        "value_overhead_bytes_per_turn": (values["sealed"] - values["plain"]) / m["turns_written"],
        "overhead_bytes_per_turn": (growth["sealed"] - growth["plain"]) / m["turns_written"],
        "turn_latency_ratio": m["sealed"]["turn_p50_ms_last"] / m["plain"]["turn_p50_ms_last"],
    }
    return report.build_report(
        figures(),
        figures_,
        **report.environment(server_version(server_url)),
        turns=turns,
        measurements=m,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE.format(turns=result["turns"]), result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help=f"{QUICK_TURNS} turns: a smoke test")


if __name__ == "__main__":
    sys.exit(main())
