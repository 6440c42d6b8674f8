"""Search benchmark: what the message search index costs per message, and how fast `search_threads` answers.

Usage::

    python -m bench.search [--quick] [--json out.json] [--database-url URL]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; the run uses one scratch
database (`tt_search_<hex>`), dropped at the end, and a SQLite file in a
temporary folder. The agent runs in this process (offline model): the figures
are the storage's, not a model's.

On each backend, `threads` (10) threads of `turns` (20) turns each, user
messages of `storage.USER_MESSAGE_BYTES` (500) bytes drawn from a vocabulary
(`storage.user_message`), each answered by the offline model (which quotes the
user's messages, so answers grow with the thread). Figures:

1. the index's bytes over the bytes of the text it indexes, on Postgres
   (`pg_total_relation_size` of `agent_message_text`: rows, primary key, GIN
   index and TOAST) and on SQLite (`dbstat`: the row table, its unique index
   and the FTS5 tables): linear in the messages, with a target;
2. the same as bytes per message beyond the text, and on Postgres the fixed
   part per turn (one index row per checkpoint: the row and its key, less the text);
3. `search_threads` p50 for a word of one message, and for two common words,
   over every thread of the user.

Output: a table `figure | measured | target | pass`; exit code 0 even when a target is missed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import report
from bench.databases import scratch_database, server_version
from bench.storage import user_message

TITLE = "search: index cost per message and search_threads latency ({threads} threads x {turns} turns)"

#: The index (rows, keys, full-text index) may hold at most this many bytes per byte of the text it
#: indexes: it grows linearly with the messages, as the checkpoints do (`test_properties`' storage bound).
PG_RATIO_TARGET, SQLITE_RATIO_TARGET = 5.0, 3.0
INDEX_BYTES_SQL = """
SELECT pg_total_relation_size('agent_message_text')::bigint AS bytes,
       coalesce(sum(octet_length(body)), 0)::bigint AS text_bytes, count(*) AS rows,
       (pg_relation_size('agent_message_text') + pg_relation_size('agent_message_text_pkey'))::bigint AS row_bytes
FROM agent_message_text
"""
SQLITE_INDEX_TABLES = ("agent_message_text", "agent_message_fts", "agent_message_fts_data", "agent_message_fts_idx",
                       "agent_message_fts_docsize", "agent_message_fts_config")  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    threads: int = 10
    turns: int = 20
    samples: int = 30


QUICK = Sizes(threads=2, turns=5, samples=5)


def figures(sizes: Sizes = Sizes()) -> dict[str, report.Figure]:
    per = report.fixed(0, " B")
    ms = report.fixed(2, " ms")
    ratio = report.fixed(2, " x")
    return {
        "pg_ratio": report.Figure(
            "Postgres: index bytes / indexed text bytes", f"<= {PG_RATIO_TARGET}", lambda v: v <= PG_RATIO_TARGET, ratio
        ),
        "sqlite_ratio": report.Figure(
            "SQLite: index bytes / indexed text bytes", f"<= {SQLITE_RATIO_TARGET}", lambda v: v <= SQLITE_RATIO_TARGET, ratio
        ),
        "pg_overhead_per_message": report.Figure("Postgres: index bytes per message beyond its text", fmt=per),
        "sqlite_overhead_per_message": report.Figure("SQLite: index bytes per message beyond its text", fmt=per),
        "pg_fixed_per_turn": report.Figure("Postgres: row and key bytes per turn beyond its text (no full-text index)", fmt=per),
        "pg_text_per_message": report.Figure("indexed text per message", fmt=per),
        "pg_search_rare_ms": report.Figure(f"Postgres: search_threads p50, a word of one message, {sizes.threads} threads", fmt=ms),
        "pg_search_common_ms": report.Figure("Postgres: search_threads p50, two common words (limit 20)", fmt=ms),
        "sqlite_search_rare_ms": report.Figure("SQLite: search_threads p50, a word of one message", fmt=ms),
        "sqlite_search_common_ms": report.Figure("SQLite: search_threads p50, two common words (limit 20)", fmt=ms),
    }


def converse(agent: Any, sizes: Sizes) -> int:
    """The threads of `sizes` for user "bench"; returns how many turns were written."""
    turn = 0
    for _ in range(sizes.threads):
        thread_id = None
        for _ in range(sizes.turns):
            turn += 1
            response = agent.predict({"input": [{"role": "user", "content": user_message(turn)}],
                                      "custom_inputs": {"thread_id": thread_id, "user_id": "bench"}})  # fmt: skip
            thread_id = response.custom_outputs["thread_id"]
    return turn


def search_p50(agent: Any, query: str, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        agent.search_threads(query, user_id="bench", limit=20)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(agent: Any, sizes: Sizes, index_bytes: Any, prefix: str) -> dict[str, float]:
    turns = converse(agent, sizes)
    total, text, rows, row_bytes = index_bytes()
    messages = 2 * turns
    rare = user_message(1).split()[1]  # "00001:": only in turn 1 and the answers quoting it
    values = {
        f"{prefix}_ratio": total / text,
        f"{prefix}_overhead_per_message": (total - text) / messages,
        f"{prefix}_text_per_message": text / messages,
        f"{prefix}_search_rare_ms": search_p50(agent, rare, sizes.samples),
        f"{prefix}_search_common_ms": search_p50(agent, "turn the", sizes.samples),
    }
    if row_bytes is not None:
        values[f"{prefix}_fixed_per_turn"] = (row_bytes - text) / rows
    return values


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run on a scratch Postgres database and a SQLite file; return the report (`bench.report.build_report`)."""
    from agent import create_agent

    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    values: dict[str, float] = {}
    error = None
    try:
        with scratch_database(server_url, "tt_search") as url, create_agent(url, model="offline", tracing=False) as agent:

            def pg_bytes() -> tuple[int, int, int, int]:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE agent_message_text")  # the GIN pending list merged in
                    row = conn.execute(INDEX_BYTES_SQL).fetchone()
                return int(row[0]), int(row[1]), int(row[2]), int(row[3])

            values.update(measure(agent, sizes, pg_bytes, "pg"))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "search.sqlite"
            with create_agent(f"sqlite:///{path}", model="offline", tracing=False) as agent:

                def sqlite_bytes() -> tuple[int, int, int, None]:
                    conn = agent.storage.saver.conn
                    with agent.storage.saver.lock:
                        sizes_ = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
                        text, rows = conn.execute("SELECT coalesce(sum(length(CAST(body AS BLOB))), 0), count(*) FROM agent_message_text").fetchone()
                    indexes = [name for name in sizes_ if name.startswith("sqlite_autoindex_agent_message_text")]
                    total = sum(sizes_.get(name, 0) for name in (*SQLITE_INDEX_TABLES, *indexes))
                    return total, int(text), int(rows), None

                values.update(measure(agent, sizes, sqlite_bytes, "sqlite"))
        values.pop("sqlite_text_per_message", None)
    except Exception:  # noqa: BLE001 - reported: the figures say "not measured"
        error = traceback.format_exc()
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes)},
        error=error,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    sizes = result["settings"]["sizes"]
    report.print_report(TITLE.format(threads=sizes["threads"], turns=sizes["turns"]), result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="2 threads of 5 turns (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())
