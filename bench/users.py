"""A burst of users at default settings: 500 streamed conversations at once on one `tt-agent serve` process.

Usage::

    python -m bench.users [--quick] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it with the other parts.) What a user gets who runs
`tt-agent serve` as installed and points it at Postgres: one server process
(`python -m agent serve`) with every setting at its default (pool, admission,
tracing into the default local store `.agent/mlflow.db` under the run's
temporary directory) but the database URL and the model, which is the tests'
OpenAI-compatible stub: 2 s per reply, streamed in 4 chunks. A scratch database
is dropped at the end.

1. Another user's thread (one turn) and a warm-up stream, before the burst.
2. `USERS` (500) streamed conversations at once, each on a new thread. A
   stream that ends without its checkpoint id, or with an `error` event, or
   any answer but 200, is an error; a 429 that carries `Retry-After` (the
   admission's "come back later", `serving.admission`) is counted apart and is
   not one.
3. During the burst, in their own OS threads (from its first request to its
   last answer): `GET /health` every `HEALTH_INTERVAL_S` (p99 and max, the
   load balancer's view), the other user's `get_checkpoint_history` every
   `HISTORY_INTERVAL_S` (p50 and max), and the server's Postgres connections
   (`pg_stat_activity`) every `SAMPLE_INTERVAL_S` (peak, against the default
   `pool_max_size`).

The load generator runs on the same machine and shares its cores with the
server, Postgres and the stub: the /health and history times include the time
their thread waited for this process's interpreter, so they overstate the
server's part a little, never understate it.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.config import AgentSettings
from bench import report, traffic
from bench.databases import dbname_of, scratch_database, server_version
from bench.processes import running_servers
from tests.helpers.openai_stub import configure_stub, free_port, openai_stub_server

TITLE = "a burst of users at default settings: {users} streamed conversations at once on one server process"
#: Users at once: a full run, and `--quick` (a smoke test: enough for the burst to outlast a few of each
#: poller's reads, since the model takes 2 s).
USERS, QUICK_USERS = 500, 20
MODEL_LATENCY_S = 2.0
MODEL_CHUNKS = 4
HEALTH_INTERVAL_S = 0.05
HISTORY_INTERVAL_S = 0.1
SAMPLE_INTERVAL_S = 0.05
READER_USER_ID = "burst-reader"
SERVER_STARTUP_TIMEOUT_S = 180.0
#: The default pool: the bound of the peak connections.
POOL_MAX_SIZE = AgentSettings.model_fields["pool_max_size"].default


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of `values` (`fraction` 0.99 for p99); None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def refused_with_retry_after(outcome: traffic.Outcome) -> bool:
    """Whether the server said "come back later" as the issue allows: 429 with a `Retry-After`."""
    return outcome.status == 429 and bool(outcome.retry_after)


async def burst(base_url: str, server_url: str, dbname: str, users: int) -> dict[str, Any]:
    async with traffic.new_client(base_url, connections=users + 16) as client:
        reader_thread = traffic.new_thread_id("burst-reader")
        for outcome in (
            await traffic.send_turn(client, "I'm planning a trip.", reader_thread, stream=False, user_id=READER_USER_ID),
            await traffic.send_turn(client, "Warming up.", traffic.new_thread_id("warmup"), stream=True),
        ):
            if not outcome.ok:
                raise RuntimeError(f"the server cannot run a turn: {outcome.error}")
        sampler = traffic.ConnectionSampler(server_url, dbname, SAMPLE_INTERVAL_S).start()
        health = traffic.HealthPoller(base_url, HEALTH_INTERVAL_S).start()
        history = traffic.HistoryPoller(base_url, reader_thread, READER_USER_ID, HISTORY_INTERVAL_S).start()
        try:
            print(f"  {users} streamed conversations at once, {MODEL_LATENCY_S:g} s model ...", flush=True)
            wall, outcomes = await traffic.at_once(client, users, stream=True, label="burst")
        finally:
            health_reads, history_reads, samples = health.stop(), history.stop(), sampler.stop()
    refused = [o for o in outcomes if refused_with_retry_after(o)]
    errors = [o for o in outcomes if not o.ok and not refused_with_retry_after(o)]
    health_times = [o.seconds for o in health_reads]
    return {
        "wall_s": wall,
        "turns": traffic.summarize(outcomes),
        "refused": len(refused),
        "retry_after": sorted({o.retry_after for o in refused}),
        "errors": len(errors),
        "error_reasons": traffic.summarize(errors)["error_reasons"],
        "health": {**traffic.summarize(health_reads), "p99_s": percentile(health_times, 0.99)},
        "history": traffic.summarize(history_reads),
        "peak_connections": max(samples, default=0),
        "connection_samples": len(samples),
    }


def figures(users: int = USERS) -> dict[str, report.Figure]:
    seconds = report.fixed(2, " s")
    return {
        "errors": report.Figure(f"{users} streamed users at once: errors other than 429 with Retry-After", "0",
                                lambda v: v == 0, str),  # fmt: skip
        "health_p99_s": report.Figure("GET /health during the burst: p99", "<= 0.2 s", lambda v: v <= 0.2,
                                      report.fixed(3, " s")),  # fmt: skip
        "history_p50_s": report.Figure("another user's history during the burst: p50", "<= 0.3 s",
                                       lambda v: v <= 0.3, seconds),  # fmt: skip
        "history_max_s": report.Figure("another user's history during the burst: max", "<= 2 s",
                                       lambda v: v <= 2.0, seconds),  # fmt: skip
        "peak_connections": report.Figure("Postgres connections held by the server, peak",
                                          f"<= {POOL_MAX_SIZE} (the default pool)",
                                          lambda v: v <= POOL_MAX_SIZE, str),  # fmt: skip
        # For reference.
        "refused": report.Figure("turns refused with 429 and Retry-After", fmt=str),
        "health_max_s": report.Figure("GET /health during the burst: max", fmt=report.fixed(3, " s")),
        "wall_s": report.Figure(f"wall of the burst, {MODEL_LATENCY_S:g} s model", fmt=seconds),
        "turn_p50_s": report.Figure("streamed turn p50", fmt=seconds),
        "turn_max_s": report.Figure("streamed turn max", fmt=seconds),
    }


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    users = QUICK_USERS if quick else USERS
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-bench-users-") as tmp, \
            openai_stub_server(latency_s=MODEL_LATENCY_S, chunks=MODEL_CHUNKS) as stub_url, \
            scratch_database(server_url, "tt_bench_users") as db:  # fmt: skip
        configure_stub(stub_url, latency_s=MODEL_LATENCY_S, chunks=MODEL_CHUNKS)
        port = free_port()
        # Defaults: no AGENT_* setting but the database and the model, no MLFLOW_* (the default trace store).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_"))}
        env.update(AGENT_DATABASE_URL=db, AGENT_MODEL="fake", OPENAI_BASE_URL=stub_url, OPENAI_API_KEY="unused")
        base_url = f"http://127.0.0.1:{port}"
        args = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with running_servers([("serve", args, env, f"{base_url}/health")], cwd=Path(tmp),
                             timeout=SERVER_STARTUP_TIMEOUT_S):  # fmt: skip
            found = asyncio.run(burst(base_url, server_url, dbname_of(db), users))
        database = dbname_of(db)
    health, history, turns = found["health"], found["history"], found["turns"]
    values = {
        "errors": found["errors"],
        "health_p99_s": health["p99_s"],
        "history_p50_s": history["p50_s"],
        "history_max_s": history["max_s"],
        "peak_connections": found["peak_connections"],
        "refused": found["refused"],
        "health_max_s": health["max_s"],
        "wall_s": found["wall_s"],
        "turn_p50_s": turns["p50_s"],
        "turn_max_s": turns["max_s"],
    }
    notes = {
        "health_p99_s": f"{health['requests']} requests, {health['errors']} failed",
        "history_p50_s": f"{history['requests']} reads, {history['errors']} failed",
        "peak_connections": f"{found['connection_samples']} samples",
    }
    if found["errors"]:
        notes["errors"] = "; ".join(f"{n}x {reason}" for reason, n in found["error_reasons"].items())
    failed = set()
    if health["errors"]:  # a failed health check is not a fast one
        failed.add("health_p99_s")
    if history["errors"]:
        failed.update(("history_p50_s", "history_max_s"))
    return report.build_report(
        figures(users),
        values,
        notes=notes,
        failed=failed,
        **header,
        users=users,
        database=database,
        settings={"model_latency_s": MODEL_LATENCY_S, "model_chunks": MODEL_CHUNKS, "pool_max_size": POOL_MAX_SIZE},
        measurements=found,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE.format(users=result["users"]), result)


if __name__ == "__main__":
    sys.exit(report.standalone_main(__doc__, run, print_result))
