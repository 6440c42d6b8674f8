"""Open streams per process: N streamed conversations at once on one `tt-agent serve` process.

Usage::

    python -m bench.streams [--quick] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it with the other parts.) One server process
(`python -m agent serve`, default settings but `AGENT_TRACING=false` and the
admission bound (below): tracing's
cost is `bench.load`'s figure, and its tracking server would compete for the
same cores), the tests' OpenAI-compatible stub as the model (`bench.load`'s:
replies streamed in 4 chunks), a scratch database dropped at the end.

1. A warm-up stream, then `STREAMS` (1,000) streamed conversations at once on
   new threads with a 0 s model: their wall time (the process's own cost of
   that many turns).
2. The same with a 2 s model: every stream must end with its checkpoint id and
   no error event (errors and their reasons are counted), and the wall time
   must stay within 1.3 x (2 s + the 0 s wall): the streams wait on the model
   together, not in turns.
3. No stream lost: every stream of both bursts ended with a checkpoint id, and
   each of those checkpoints is the head of its thread in the database (the
   turn was saved), read before the scratch database is dropped.
4. Per open stream: the server's peak resident memory during phases 1 and 2
   (every process of its group, sampled every `SAMPLE_INTERVAL_S`) over its
   resident memory after the warm-up stream (Python keeps what it allocated, so
   a baseline taken after phase 1 would hide it), and its CPU time (user +
   system) for phase 2, each over the number of streams.

The server runs at default settings but its admission bound, set to allow every
stream at once (issue "1,000 open streams per process": "the admission bound set to
allow them"): `max_running_turns` to the number of streams, and
`loop_lag_target_seconds` to 0, so that the bound does not shrink while the loop is
busy; by default, 200 at most and fewer while the loop lags, it keeps `/health` fast
under a burst instead (`bench.users`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import report, traffic
from bench.databases import dbname_of, scratch_database, server_version
from bench.processes import ServerProcess, running_servers
from tests.helpers.openai_stub import configure_stub, free_port, openai_stub_server

TITLE = "open streams: {streams} streamed conversations at once on one server process"
#: Streams at once: a full run, and `--quick` (a smoke test of the code path: every phase at a few dozen
#: streams; 100 cost about 9 s more CPU, the server's and this process's, for no other check).
STREAMS, QUICK_STREAMS = 1000, 25
MODEL_LATENCY_S = 2.0
MODEL_CHUNKS = 4
SAMPLE_INTERVAL_S = 0.2
SERVER_STARTUP_TIMEOUT_S = 180.0
#: The target of phase 2's wall time over (model latency + phase 1's wall time).
WALL_RATIO_TARGET = 1.3
#: The repository: the server runs from it (`python -m agent`).
REPO_ROOT = Path(__file__).resolve().parent.parent


def group_rss_bytes(server: ServerProcess) -> int:
    """Resident memory of every process of the server's process group, in bytes."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != server.pid:
                continue
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24, rss in pages
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total


class PeakSampler:
    """The largest `group_rss_bytes` seen, sampled on a thread until `stop()`."""

    def __init__(self, server: ServerProcess) -> None:
        self.server, self.peak = server, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, group_rss_bytes(self.server))
            self._done.wait(SAMPLE_INTERVAL_S)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, group_rss_bytes(self.server))


async def idle_cpu_seconds(server: ServerProcess) -> float:
    """The server's CPU seconds once it has been idle for a moment (its last turns' work included)."""
    previous = server.cpu_seconds()
    while True:
        await asyncio.sleep(0.5)
        now = server.cpu_seconds()
        if now - previous < 0.02:
            return now
        previous = now


async def phases(server: ServerProcess, base_url: str, stub_url: str, streams: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with traffic.new_client(base_url, connections=streams + 16) as client:
        configure_stub(stub_url, latency_s=0.0, chunks=MODEL_CHUNKS)
        warm = await traffic.send_turn(client, "Warming up.", traffic.new_thread_id("warmup"), stream=True)
        if not warm.ok:
            raise RuntimeError(f"the server cannot run a turn: {warm.error}")
        await idle_cpu_seconds(server)
        rss_before = group_rss_bytes(server)
        with PeakSampler(server) as sampler:
            print(f"  {streams} streams at once, 0 s model ...", flush=True)
            wall, zero_outcomes = await traffic.at_once(client, streams, stream=True, label="zero")
            out["zero_model"] = {"wall_s": wall, **traffic.summarize(zero_outcomes)}
            configure_stub(stub_url, latency_s=MODEL_LATENCY_S, chunks=MODEL_CHUNKS)
            cpu_before = await idle_cpu_seconds(server)
            print(f"  {streams} streams at once, {MODEL_LATENCY_S:.0f} s model ...", flush=True)
            wall, outcomes = await traffic.at_once(client, streams, stream=True, label="slow")
            cpu_after = await idle_cpu_seconds(server)
        out["slow_model"] = {"wall_s": wall, **traffic.summarize(outcomes)}
        out["rss_idle_bytes"], out["rss_peak_bytes"] = rss_before, sampler.peak
        out["checkpoint_ids"] = [o.checkpoint_id for o in outcomes + zero_outcomes if o.checkpoint_id]
        out["cpu_seconds"] = cpu_after - cpu_before
    return out


def saved_heads(url: str, checkpoint_ids: list[str]) -> int:
    """How many threads of the database have one of `checkpoint_ids` as their head."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM agent_threads WHERE head_checkpoint_id = ANY(%s)", (checkpoint_ids,))
        return int(row.fetchone()[0])


def figures(streams: int = STREAMS) -> dict[str, report.Figure]:
    return {
        "lost": report.Figure(
            f"streams lost of 2 x {streams} (no checkpoint id at the end, or not saved as the thread's head)",
            "0", lambda v: v == 0, str,
        ),
        "errors": report.Figure(f"{streams} streams, {MODEL_LATENCY_S:.0f} s model: errors", "0", lambda v: v == 0, str),
        "wall_ratio": report.Figure(
            f"wall / ({MODEL_LATENCY_S:.0f} s + wall with a 0 s model)",
            f"<= {WALL_RATIO_TARGET}",
            lambda v: v <= WALL_RATIO_TARGET,
            report.fixed(2),
        ),
        "kb_per_stream": report.Figure("server memory per open stream (peak - after warm-up)", fmt=report.fixed(1, " kB")),
        "cpu_ms_per_stream": report.Figure("server CPU per streamed turn", fmt=report.fixed(1, " ms")),
        "wall_s": report.Figure(f"wall, {MODEL_LATENCY_S:.0f} s model", fmt=report.fixed(2, " s")),
        "zero_wall_s": report.Figure("wall, 0 s model", fmt=report.fixed(2, " s")),
        "turn_max_s": report.Figure(f"slowest stream, {MODEL_LATENCY_S:.0f} s model", fmt=report.fixed(2, " s")),
    }


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    streams = QUICK_STREAMS if quick else STREAMS
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-bench-streams-") as tmp, \
            openai_stub_server(latency_s=0.0, chunks=MODEL_CHUNKS) as stub_url, \
            scratch_database(server_url, "tt_bench_streams") as db:  # fmt: skip
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        # The admission bound set to admit every stream at once (the default keeps /health fast instead).
        env.update(AGENT_DATABASE_URL=db, AGENT_MODEL="fake", AGENT_TRACING="false",
                   AGENT_MAX_RUNNING_TURNS=str(streams), AGENT_LOOP_LAG_TARGET_SECONDS="0",
                   OPENAI_BASE_URL=stub_url, OPENAI_API_KEY="unused")  # fmt: skip
        base_url = f"http://127.0.0.1:{port}"
        args = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with running_servers([("serve", args, env, f"{base_url}/health")], cwd=REPO_ROOT,
                             timeout=SERVER_STARTUP_TIMEOUT_S) as (server,):  # fmt: skip
            del tmp
            found = asyncio.run(phases(server, base_url, stub_url, streams))
        found["saved_heads"] = saved_heads(db, found.pop("checkpoint_ids"))
        database = dbname_of(db)
    slow, zero = found["slow_model"], found["zero_model"]
    values = {
        "lost": 2 * streams - found["saved_heads"],
        "errors": slow["errors"] + zero["errors"],
        "wall_ratio": slow["wall_s"] / (MODEL_LATENCY_S + zero["wall_s"]),
        "kb_per_stream": (found["rss_peak_bytes"] - found["rss_idle_bytes"]) / streams / 1024,
        "cpu_ms_per_stream": found["cpu_seconds"] / streams * 1000,
        "wall_s": slow["wall_s"],
        "zero_wall_s": zero["wall_s"],
        "turn_max_s": slow["max_s"],
    }
    notes = {}
    if values["errors"]:
        notes["errors"] = f"2 s: {slow['error_reasons']}; 0 s: {zero['error_reasons']}"
    return report.build_report(
        figures(streams),
        values,
        notes=notes,
        failed={"wall_ratio"} if values["errors"] else set(),
        **header,
        streams=streams,
        database=database,
        measurements=found,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE.format(streams=result["streams"]), result)


if __name__ == "__main__":
    sys.exit(report.standalone_main(__doc__, run, print_result))
