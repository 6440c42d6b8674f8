"""Catalogue benchmark: a page of `list_threads` for a user with 10,000 threads against one with 100.

Usage::

    python -m bench.catalogue [--quick] [--json out.json] [--database-url URL]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; the run uses one scratch
database (`tt_catalogue_<hex>`), dropped at the end whatever happens. The agent
runs in this process (`create_agent(url, model="offline", tracing=False)`), so
the figures are the catalogue's own cost: one query and the thread dicts.

Rows are written straight into `agent_threads` with one `INSERT ... SELECT
generate_series` per user (a page reads thread records only, never
checkpoints), each thread with a distinct `updated_at`, a title and two
metadata pairs; then `ANALYZE`, as autovacuum would have by then. Users:
`large` (`large` threads, 10,000), `small` (`small`, 100), and `others` (20)
users with `large / 10` threads each, so the table is not one user's.

Figures (p50 over `samples` calls, the users' calls interleaved so a busy
moment of the machine hits both alike):

1. the first page (20 threads) of `large` over that of `small` (the issue's
   target: <= 1.5; a page must be one index range scan, not a sort of the
   user's threads);
2. the first page of each user, in ms;
3. for reference: a page deep in `large`'s list (the cursor of its middle
   thread), and a first page filtered by a metadata pair that one thread in 10
   holds (the filter is checked along the index scan, so it reads ~10 x the page).

Output: a table `figure | measured | target | pass`, the machine, versions, and
`targets met: X/Y`; `--json` also saves every figure and measurement. Exit code
0 even when the target is missed; 1 when the benchmark failed; 2 when Postgres
cannot be reached.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from bench import report
from bench.databases import scratch_database, server_version

#: The issue's target: a page at 10,000 threads over a page at 100.
PAGE_RATIO_TARGET = 1.5
#: Threads per page (list_threads' default).
PAGE = 20
TITLE = "list_threads on Postgres: a page at {large} threads / at {small} threads (in-process)"

# One user's threads: ids `<user>-<n>`, one second apart (newest: n = 1), a title, and
# metadata {"app": "web" | "cli", "tag": "t<n mod 10>"}.
INSERT_THREADS_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, title, metadata, message_count, created_at, updated_at)
SELECT %(user)s || '-' || n, %(user)s, 'no-checkpoint', 'Thread number ' || n,
    jsonb_build_object('app', CASE WHEN n %% 2 = 0 THEN 'web' ELSE 'cli' END, 'tag', 't' || (n %% 10)),
    2 * (n %% 50), now() - make_interval(secs => n * 2), now() - make_interval(secs => n)
FROM generate_series(1, %(count)s) AS n
"""


@dataclass(frozen=True)
class Sizes:
    large: int = 10_000
    small: int = 100
    others: int = 20
    samples: int = 300


QUICK = Sizes(large=1_000, small=100, others=3, samples=20)


def figures(sizes: Sizes) -> dict[str, report.Figure]:
    """Every figure of the report, in table order: the target first, then reference figures."""
    ms = report.fixed(3, " ms")
    return {
        "page_ratio": report.Figure(
            f"list_threads first page p50, {sizes.large:,} threads / {sizes.small:,} threads",
            f"<= {PAGE_RATIO_TARGET:g}",
            lambda v: v <= PAGE_RATIO_TARGET,
            report.fixed(2),
        ),
        "page_large_ms": report.Figure(f"list_threads first page ({PAGE}) p50, user with {sizes.large:,} threads", fmt=ms),
        "page_small_ms": report.Figure(f"list_threads first page ({PAGE}) p50, user with {sizes.small:,} threads", fmt=ms),
        "page_deep_ms": report.Figure(
            f"list_threads page after thread {sizes.large // 2:,} p50, user with {sizes.large:,} threads", fmt=ms
        ),
        "page_filtered_ms": report.Figure(
            f"list_threads first page, metadata filter held by 1 in 10, p50, {sizes.large:,} threads", fmt=ms
        ),
    }


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def populate(database_url: str, sizes: Sizes) -> dict[str, int]:
    """Write every user's threads (one statement per user) and ANALYZE; returns the thread count per user."""
    counts = {"large": sizes.large, "small": sizes.small}
    counts.update({f"other{i}": sizes.large // 10 for i in range(sizes.others)})
    with psycopg.connect(database_url, autocommit=True) as conn:
        for user, count in counts.items():
            conn.execute(INSERT_THREADS_SQL, {"user": user, "count": count})
        conn.execute("ANALYZE agent_threads")
    return counts


def measure(agent: Any, sizes: Sizes) -> tuple[dict[str, float], dict[str, list[float]]]:
    def page(user: str, **kwargs: Any) -> Callable[[], list]:
        return lambda: agent.list_threads(user_id=user, limit=PAGE, **kwargs)

    first_large, first_small = page("large")(), page("small")()
    # Correctness before timing: newest first, the user's own, full pages.
    assert [t["thread_id"] for t in first_large] == [f"large-{n}" for n in range(1, PAGE + 1)], first_large[:2]
    assert {t["user_id"] for t in first_small} == {"small"} and len(first_small) == PAGE
    middle = agent.list_threads(user_id="large", limit=1, before=f"large-{sizes.large // 2 - 1}")[0]
    deep = page("large", before=middle["cursor"])
    assert deep()[0]["thread_id"] == f"large-{sizes.large // 2 + 1}"
    filtered = page("large", metadata={"tag": "t3"})
    assert all(t["metadata"]["tag"] == "t3" for t in filtered())
    for call in (page("large"), page("small"), deep, filtered):  # warm-up: plans, connections
        call()
    samples: dict[str, list[float]] = {"large_s": [], "small_s": [], "deep_s": [], "filtered_s": []}
    for _ in range(sizes.samples):
        samples["large_s"].append(timed(page("large")))
        samples["small_s"].append(timed(page("small")))
        samples["deep_s"].append(timed(deep))
        samples["filtered_s"].append(timed(filtered))
    values = {
        "page_large_ms": p50_ms(samples["large_s"]),
        "page_small_ms": p50_ms(samples["small_s"]),
        "page_deep_ms": p50_ms(samples["deep_s"]),
        "page_filtered_ms": p50_ms(samples["filtered_s"]),
    }
    values["page_ratio"] = values["page_large_ms"] / values["page_small_ms"]
    return values, samples


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run the benchmark on a scratch database of the Postgres server at `server_url`; return the report.

    The report is `bench.report.build_report`'s, with `settings`, `threads` (the thread count per
    user), `measurements` (every sample, in seconds) and `error` (None, or the failure's traceback;
    its figures are then None).
    """
    from agent import create_agent

    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    values: dict[str, float] = {}
    samples: dict[str, Any] = {}
    counts: dict[str, int] = {}
    error = None
    try:
        with scratch_database(server_url, "tt_catalogue") as url, create_agent(url, model="offline", tracing=False) as agent:
            agent.storage.setup()
            counts = populate(url, sizes)
            values, samples = measure(agent, sizes)
    except Exception:  # noqa: BLE001 - reported: the figures say "not measured"
        error = traceback.format_exc()
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes), "page": PAGE},
        threads=counts,
        measurements=samples,
        error=error,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    """The table, header lines and summary line (`bench.report.print_report`)."""
    sizes = result["settings"]["sizes"]
    report.print_report(TITLE.format(large=f"{sizes['large']:,}", small=f"{sizes['small']:,}"), result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="1,000 threads and few samples (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())
