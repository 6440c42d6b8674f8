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
user's messages, so answers grow with the thread). That vocabulary is small
(about 130 words), and the index holds only the words new to a branch
(`agent.storage.search`), so the same threads are also written (for another
user) with words drawn from `LARGE_VOCABULARY` synthetic words by Zipf's law
(`large_vocabulary_message`), as real chat keeps bringing new words (Heaps'
law): the index's cost with each vocabulary is reported. Figures:

1. the index's bytes over the bytes of the text it indexes (the text of every
   message of the threads, which the index no longer copies: see
   `agent.storage.search`), on Postgres (the checkpoints' `agent_terms`
   values, `pg_column_size`, and their GIN index `agent_checkpoint_terms_idx`,
   after a `VACUUM`) and on SQLite (`dbstat`, the bytes its pages hold:
   `agent_message_rows`, its index and the FTS5 tables, after a `VACUUM`):
   linear in the messages, with a target;
2. the index's bytes per message, with each vocabulary;
3. `search_threads` p50 for a word of one message, and for two common words,
   over every thread of the user (the small vocabulary's: the hits and
   snippets are read from the candidate threads' checkpoints).

Output: a table `figure | measured | target | pass`; exit code 0 even when a target is missed.
"""

from __future__ import annotations

import functools
import random
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

#: The index (rows of word keys, their keys, the full-text index) may hold at most this many bytes per
#: byte of the text it indexes: it grows linearly with the messages, as the checkpoints do, and must
#: leave room under the storage bound (`bench.storage`: storage growth <= 3x the raw message bytes).
PG_RATIO_TARGET, SQLITE_RATIO_TARGET = 1.5, 0.5
# SQLite: the bytes the pages hold, not whole pages: the files use 16 kB pages, and the index of these
# threads fills a few, so whole pages would measure the page size.
USED_BYTES_SQL = "SELECT name, sum(pgsize - unused) FROM dbstat GROUP BY name"
# The terms are a column of the checkpoints' rows: their values' bytes, and their GIN index.
INDEX_BYTES_SQL = """
SELECT coalesce(sum(pg_column_size(agent_terms)), 0)::bigint + pg_relation_size('agent_checkpoint_terms_idx')
FROM checkpoints WHERE agent_terms IS NOT NULL
"""
SQLITE_INDEX_TABLES = ("agent_message_rows", "sqlite_autoindex_agent_message_rows_1", "agent_message_rows_thread_idx", "agent_message_terms",
                       "agent_message_terms_data", "agent_message_terms_idx", "agent_message_terms_docsize",
                       "agent_message_terms_config")  # fmt: skip


#: Distinct words of the large vocabulary, and the exponent of its Zipf law (rank r drawn with weight r^-s).
LARGE_VOCABULARY, ZIPF_EXPONENT = 4000, 1.0
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]


@functools.cache
def _large_vocabulary() -> tuple[list[str], list[float]]:
    """`LARGE_VOCABULARY` distinct synthetic words (2 to 4 syllables, deterministic) and their cumulative
    Zipf weights."""
    draw, words = random.Random(4000), {}
    while len(words) < LARGE_VOCABULARY:
        words.setdefault("".join(draw.choice(_SYLLABLES) for _ in range(draw.randint(2, 4))), None)
    total, cumulative = 0.0, []
    for rank in range(1, LARGE_VOCABULARY + 1):
        total += rank**-ZIPF_EXPONENT
        cumulative.append(total)
    return list(words), cumulative


def large_vocabulary_message(turn: int) -> str:
    """The user message of turn `turn` with the large vocabulary: `storage.USER_MESSAGE_BYTES` ASCII bytes,
    words drawn by Zipf's law from `LARGE_VOCABULARY` words."""
    from bench.storage import USER_MESSAGE_BYTES

    words, cumulative = _large_vocabulary()
    draw = random.Random(turn)
    text = f"Turn {turn:05d}:"
    while len(text) < USER_MESSAGE_BYTES:
        text += " " + draw.choices(words, cum_weights=cumulative)[0]
    return text[:USER_MESSAGE_BYTES]


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
        "pg_bytes_per_message": report.Figure("Postgres: index bytes per message", fmt=per),
        "sqlite_bytes_per_message": report.Figure("SQLite: index bytes per message", fmt=per),
        "pg_text_per_message": report.Figure("indexed text per message", fmt=per),
        "pg_large_bytes_per_message": report.Figure(f"Postgres: index bytes per message, {LARGE_VOCABULARY} words (Zipf)", fmt=per),
        "sqlite_large_bytes_per_message": report.Figure(f"SQLite: index bytes per message, {LARGE_VOCABULARY} words (Zipf)", fmt=per),
        "pg_large_text_per_message": report.Figure(f"indexed text per message, {LARGE_VOCABULARY} words", fmt=per),
        "pg_search_rare_ms": report.Figure(f"Postgres: search_threads p50, a word of one message, {sizes.threads} threads", fmt=ms),
        "pg_search_common_ms": report.Figure("Postgres: search_threads p50, two common words (limit 20)", fmt=ms),
        "sqlite_search_rare_ms": report.Figure("SQLite: search_threads p50, a word of one message", fmt=ms),
        "sqlite_search_common_ms": report.Figure("SQLite: search_threads p50, two common words (limit 20)", fmt=ms),
    }


def converse(agent: Any, sizes: Sizes, message: Any = user_message, user_id: str = "bench") -> tuple[int, int]:
    """The threads of `sizes` for `user_id`, user messages `message(turn)`; returns (messages, UTF-8 bytes
    of their searchable text)."""
    from agent.storage.search import message_text

    turn, messages, text = 0, 0, 0
    for _ in range(sizes.threads):
        thread_id = None
        for _ in range(sizes.turns):
            turn += 1
            response = agent.predict({"input": [{"role": "user", "content": message(turn)}],
                                      "custom_inputs": {"thread_id": thread_id, "user_id": user_id}})  # fmt: skip
            thread_id = response.custom_outputs["thread_id"]
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        found = agent.graph.get_state(config).values.get("messages", [])
        messages += len(found)
        text += sum(len(message_text(m).encode("utf-8")) for m in found)
    return messages, text


def search_p50(agent: Any, query: str, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        agent.search_threads(query, user_id="bench", limit=20)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(agent: Any, sizes: Sizes, index_bytes: Any, prefix: str) -> dict[str, float]:
    before = index_bytes()
    messages, text = converse(agent, sizes)
    total = index_bytes() - before
    rare = user_message(1).split()[1]  # "00001:": only in turn 1 and the answers quoting it
    found = {
        f"{prefix}_ratio": total / text,
        f"{prefix}_bytes_per_message": total / messages,
        f"{prefix}_text_per_message": text / messages,
        f"{prefix}_search_rare_ms": search_p50(agent, rare, sizes.samples),
        f"{prefix}_search_common_ms": search_p50(agent, "turn the", sizes.samples),
    }
    before = index_bytes()
    messages, text = converse(agent, sizes, large_vocabulary_message, "bench-large")
    found[f"{prefix}_large_bytes_per_message"] = (index_bytes() - before) / messages
    found[f"{prefix}_large_text_per_message"] = text / messages
    return found


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

            def pg_bytes() -> int:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE checkpoints")
                    return int(conn.execute(INDEX_BYTES_SQL).fetchone()[0])

            values.update(measure(agent, sizes, pg_bytes, "pg"))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "search.sqlite"
            with create_agent(f"sqlite:///{path}", model="offline", tracing=False) as agent:

                def sqlite_bytes() -> int:
                    conn = agent.storage.saver.conn
                    with agent.storage.saver.lock:
                        conn.execute("VACUUM")
                        sizes_ = dict(conn.execute(USED_BYTES_SQL).fetchall())
                    return sum(sizes_.get(name, 0) for name in SQLITE_INDEX_TABLES)

                values.update(measure(agent, sizes, sqlite_bytes, "sqlite"))
        values.pop("sqlite_text_per_message", None)
        values.pop("sqlite_large_text_per_message", None)
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
