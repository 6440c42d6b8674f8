"""Load benchmark: one `tt-agent serve` process under hundreds of conversations with a slow model.

Usage::

    python -m bench.load [--quick] [--json out.json] [--database-url URL] [--load-tracing on|off]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; every phase gets its own
scratch database (`tt_load_<phase>_<hex>`), dropped at the end whatever
happens. The model is the OpenAI-compatible stub (`tests.helpers.openai_stub`, one
process for the whole run, reconfigured between phases): 2.0 s per reply,
streamed as 4 chunks 0.5 s apart, the shape of a real LLM. Servers are real
processes (`python -m agent serve`) with `AGENT_POOL_MAX_SIZE=10`, each in its
own process group, stopped at the end of their phase. (`--quick` shares them
instead: one server per setting, on one database, until the run ends; see
`Sizes.shared_servers`.) Servers with tracing on
send their traces to an MLflow tracking server (`mlflow server` on a temporary
SQLite store, one process for the whole run), as deployments do; phase 8's
target is measured as a user runs `tt-agent serve` out of the box: tracing on,
no tracking URI, traces into the default local store `.agent/mlflow.db` (where
`trace_sample_ratio`'s default keeps a share of the turns: MLflow's SQLAlchemy
store costs 20 to 30 ms of CPU per trace in the writing process, whatever the
trace holds).

Phases (all figures from one run; `--quick` shrinks every size for a smoke test):

1. The stub and one server (tracing as `--load-tracing`, default on like
   `tt-agent serve`); a reader's thread is created before the load.
2. N (200) streamed conversations at once, each on a new thread: errors
   (non-200, an `error` event, no final `custom_outputs.checkpoint_id`), wall time.
3. The same N unstreamed.
4. M (300) in-process `predict` calls from M OS threads of this process
   (`create_agent(db, model="fake", pool_max_size=10, tracing=False)`): errors.
5. Peak connections to the server's database during 2-3 (`pg_stat_activity`
   every 50 ms): at most `pool_max_size`.
6. Wall time of phase 2 over (2 s + the wall time of N streamed turns with a
   0 s model on the same server): what the load adds beyond one model call.
7. During phase 2 (and, for reference, 3) another user's
   `get_checkpoint_history` over HTTP every 100 ms: p50 and max.
8. Server CPU per turn, tracing at its default over off: servers with a 0 s
   model, turns in symmetric rounds; CPU is utime+stime of each server's
   process group (`/proc`), read once the server is idle again. The target's
   server has the default settings (no `MLFLOW_TRACKING_URI`, no sample
   ratio: the local store). For reference, a server sending every trace to the
   tracking server, and one writing every trace into its own SQLite file
   (`AGENT_TRACE_SAMPLE_RATIO=1`), run their rounds in between.
9. In-process turn p50, last 40 over first 40 turns of a T-turn (200) thread
   (`bench.turn_growth.WINDOW`),
   tracing on (the Python default) and off, each in a child process
   (`bench.turn_growth`) so tracing settings do not leak. (`--quick` runs both
   in this process instead, off then on: see `Sizes.growth_in_process`.)
10. Three servers on one database; threads driven through all of them (each
    turn to a random server, 3 turns of a thread in flight at once, a 0.5 s
    model, each turn sent after a random 0-1 s pause), under `reject` and
    `enqueue`; then each thread's history must be
    one linear chain with every acknowledged turn once (`traffic.check_chain`).
11. `--workers 2` over `--workers 1`, unstreamed turns per second with a 0 s
    model, rounds 1-2-2-1, tracing off (tracing's cost is phase 8's figure; here
    the run's tracking server would compete for the same two cores). Not
    measurable while `tt-agent serve` has no `--workers`.

Output: a table `figure | measured | target | pass`, the machine, versions,
and `targets met: X/Y`; `--json` also saves every figure and measurement.
Exit code 0 even when targets are missed; 1 when a phase could not run (its
figures say "not measured" and stderr has the traceback); 2 when the
benchmark cannot start (no Postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, closing, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from agent.tracing import DEFAULT_TRACKING_DB
from bench import report, traffic
from bench.databases import DEFAULT_SERVER_URL, dbname_of, scratch_database, server_version
from bench.processes import ServerProcess, running_servers
from bench.turn_growth import WINDOW as GROWTH_WINDOW
from tests.helpers.openai_stub import configure_stub, free_port, openai_stub_server

#: The model of the load phases: seconds per reply and streamed chunks.
MODEL_LATENCY_S = 2.0
MODEL_CHUNKS = 4
#: `pool_max_size` of every server and of the in-process agent.
POOL_MAX_SIZE = 10
#: The other user's history reads (phase 7) and the connection samples (phase 5).
HISTORY_INTERVAL_S = 0.1
SAMPLE_INTERVAL_S = 0.05
READER_USER_ID = "load-reader"
#: Phase 8: conversations at once, and the turns each server runs before measuring.
CPU_CONCURRENCY = 8
WARMUP_TURNS = 4
#: Phase 10: the model is shorter, so that overlapping turns are many but the phase is short.
CHAIN_MODEL_LATENCY_S = 0.5
CHAIN_SERVERS = 3
CHAIN_IN_FLIGHT = 3
#: Each turn waits a random 0 to CHAIN_STAGGER model latencies before it is sent.
CHAIN_STAGGER = 2.0
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Worker processes of the run's MLflow tracking server.
TRACKING_SERVER_WORKERS = 2
#: Seconds a server may take to answer /health after it is started.
SERVER_STARTUP_TIMEOUT_S = 180.0
#: Seconds a server's CPU time must stay unchanged before it counts as idle (phase 8).
IDLE_PROBE_S = 0.3
IDLE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Sizes:
    """How much each phase does."""

    conversations: int = 200
    in_process_calls: int = 300
    cpu_turns: int = 100
    growth_turns: int = 200
    chain_threads: int = 8
    chain_turns: int = 12
    workers_turns: int = 400
    workers_concurrency: int = 32
    tracking_server: bool = True
    """Whether the run starts an MLflow tracking server: the servers of phases 1-7 send it their traces, and
    phase 8 measures a server sending it every trace, for reference. Without it (the quick run) phases 1-7
    trace into the default local store and phase 8 has no tracking-server reference: starting `mlflow
    server` was a third of the quick run's time, and tests/test_tracing.py covers that destination."""
    shared_servers: bool = False
    """Whether the phases share their servers (`LoadBenchmark.phase_servers`): one process per setting (tracing
    at its default, tracing off, tracing into a SQLite file, `--workers 2`), all on one scratch database, each
    started when a phase first needs it and stopped when the run ends. The full run gives each phase servers
    and databases of its own, so that a figure measures its own servers only. The quick run is a smoke test of
    the code, run by the test suite: without sharing it started 11 servers, each importing MLflow (seconds of
    CPU each), and took about 2 minutes of one test worker; with it, 4. What writes every trace into a SQLite
    file (phase 8's "local" server, phase 9 with tracing on) writes it into the run's default store
    (`.agent/mlflow.db` of the run's directory) when a server already made it, not into a new file each:
    MLflow's migrations of a new store are seconds of CPU (`LoadBenchmark.trace_file`)."""
    growth_in_process: bool = False
    """Whether phase 9 measures in this process (`bench.turn_growth.measure`), tracing off and then on, the
    last thing the run does, so that tracing left on reaches no other measurement. The full run starts a
    child process for each, so that neither inherits the other's (or this process's) tracing state; in the
    quick run those two interpreters, each importing the agent and one MLflow too, were most of the
    phase's CPU (about 14 s), and the smoke test needs the measurement's code path, not that isolation."""


#: The smoke test's sizes (tests/bench): enough for every figure to be computed, not to be trusted.
QUICK = Sizes(
    conversations=10,
    in_process_calls=15,
    cpu_turns=10,
    growth_turns=10,  # fewer than bench.turn_growth.WINDOW: both windows are every turn
    chain_threads=3,
    chain_turns=4,
    workers_turns=16,
    workers_concurrency=4,
    tracking_server=False,
    shared_servers=True,
    growth_in_process=True,
)


@dataclass(frozen=True)
class Setting:
    """How a server is run, besides its name and database: `LoadBenchmark.server_spec`'s options."""

    tracing: bool
    traces: str | None = None
    workers: int | None = None


class PhaseServer(NamedTuple):
    """A running server of a phase: its process, base URL, and the database it serves."""

    process: ServerProcess
    url: str
    database: str


def figures(sizes: Sizes) -> dict[str, report.Figure]:
    """Every figure of the report, in table order: the issue's targets first, then reference figures."""
    n, seconds, ratio, count = sizes.conversations, report.fixed(2, " s"), report.fixed(2), str
    model = f"{MODEL_LATENCY_S:g} s"
    return {
        "streamed_errors": report.Figure(f"{n} concurrent streamed conversations: errors", "0", _zero, count),
        "unstreamed_errors": report.Figure(f"{n} concurrent unstreamed conversations: errors", "0", _zero, count),
        "in_process_errors": report.Figure(
            f"{sizes.in_process_calls} in-process predict calls from threads: errors", "0", _zero, count
        ),
        "peak_connections": report.Figure(
            "Postgres connections held by the server, peak", f"<= {POOL_MAX_SIZE}", lambda v: v <= POOL_MAX_SIZE, count
        ),
        "streaming_wall_ratio": report.Figure(
            f"wall of {n} streamed turns / ({model} + wall with a 0 s model)", "<= 1.3", lambda v: v <= 1.3, ratio
        ),
        "history_p50_s": report.Figure("another user's history during streamed load: p50", "<= 0.3 s",
                                       lambda v: v <= 0.3, seconds),  # fmt: skip
        "history_max_s": report.Figure("another user's history during streamed load: max", "<= 2 s",
                                       lambda v: v <= 2.0, seconds),  # fmt: skip
        "tracing_cpu_ratio": report.Figure("server CPU per turn, tracing at its default (local store) / off", "<= 2",
                                           lambda v: v <= 2, ratio),  # fmt: skip
        "traced_turn_growth": report.Figure(
            f"in-process turn p50 with tracing, last {GROWTH_WINDOW} / first {GROWTH_WINDOW} of "
            f"{sizes.growth_turns} turns",
            "<= 1.3",
            lambda v: v <= 1.3,
            ratio,
        ),
        "reject_chains": report.Figure(f"{CHAIN_SERVERS} processes, one database, reject: linear chains, no lost "
                                       "or duplicated turn", "yes", bool, report.yes_no),  # fmt: skip
        "enqueue_chains": report.Figure(f"{CHAIN_SERVERS} processes, one database, enqueue: linear chains, no lost "
                                        "or duplicated turn", "yes", bool, report.yes_no),  # fmt: skip
        "workers_speedup": report.Figure("--workers 2 / --workers 1, turns/s with a 0 s model", ">= 1.4",
                                         lambda v: v >= 1.4, ratio),  # fmt: skip
        # For reference: what the targets are made of.
        "streamed_wall_s": report.Figure(f"wall of {n} streamed turns, {model} model", fmt=seconds),
        "streamed_turn_p50_s": report.Figure(f"streamed turn p50, {model} model", fmt=seconds),
        "streamed_turn_max_s": report.Figure(f"streamed turn max, {model} model", fmt=seconds),
        "zero_model_wall_s": report.Figure(f"wall of {n} streamed turns, 0 s model", fmt=seconds),
        "unstreamed_wall_s": report.Figure(f"wall of {n} unstreamed turns, {model} model", fmt=seconds),
        "unstreamed_turn_p50_s": report.Figure(f"unstreamed turn p50, {model} model", fmt=seconds),
        "history_unstreamed_p50_s": report.Figure("another user's history during unstreamed load: p50", fmt=seconds),
        "history_unstreamed_max_s": report.Figure("another user's history during unstreamed load: max", fmt=seconds),
        "in_process_wall_s": report.Figure(f"wall of {sizes.in_process_calls} in-process predict calls", fmt=seconds),
        "cpu_ms_per_turn_traced": report.Figure("server CPU per turn, tracing at its default (local store)",
                                                fmt=report.fixed(1, " ms")),  # fmt: skip
        "cpu_ms_per_turn_untraced": report.Figure("server CPU per turn, tracing off", fmt=report.fixed(1, " ms")),
        **({"cpu_ms_per_turn_traced_server": report.Figure("server CPU per turn, every turn to a tracking server",
                                                           fmt=report.fixed(1, " ms")),
            "tracing_server_cpu_ratio": report.Figure("server CPU per turn, every turn to a tracking server / off",
                                                      fmt=ratio)} if sizes.tracking_server else {}),  # fmt: skip
        "cpu_ms_per_turn_traced_local": report.Figure("server CPU per turn, every turn into its own SQLite file",
                                                      fmt=report.fixed(1, " ms")),  # fmt: skip
        "tracing_local_cpu_ratio": report.Figure("server CPU per turn, every turn into its own SQLite file / off",
                                                 fmt=ratio),  # fmt: skip
        "traced_turn_ms_first": report.Figure(f"in-process turn p50 with tracing, first {GROWTH_WINDOW} turns",
                                              fmt=report.fixed(1, " ms")),  # fmt: skip
        "traced_turn_ms_last": report.Figure(f"in-process turn p50 with tracing, last {GROWTH_WINDOW} turns",
                                             fmt=report.fixed(1, " ms")),  # fmt: skip
        "untraced_turn_growth": report.Figure(
            f"in-process turn p50 without tracing, last {GROWTH_WINDOW} / first {GROWTH_WINDOW}", fmt=ratio
        ),
        "untraced_turn_ms_first": report.Figure(f"in-process turn p50 without tracing, first {GROWTH_WINDOW} turns",
                                                fmt=report.fixed(1, " ms")),  # fmt: skip
        "untraced_turn_ms_last": report.Figure(f"in-process turn p50 without tracing, last {GROWTH_WINDOW} turns",
                                               fmt=report.fixed(1, " ms")),  # fmt: skip
        "workers_1_turns_per_s": report.Figure("--workers 1, turns/s with a 0 s model", fmt=report.fixed(1)),
        "workers_2_turns_per_s": report.Figure("--workers 2, turns/s with a 0 s model", fmt=report.fixed(1)),
    }


def _zero(value: int) -> bool:
    return value == 0


class LoadBenchmark:
    """The phases of one run. Each phase returns its measurements and adds its figures to `values`/`notes`."""

    def __init__(self, server_url: str, stub_url: str, workdir: Path, sizes: Sizes, load_tracing: bool,
                 tracking_uri: str | None) -> None:  # fmt: skip
        self.server_url = server_url
        self.stub_url = stub_url
        self.tracking_uri = tracking_uri
        self.workdir = workdir
        self.sizes = sizes
        self.load_tracing = load_tracing
        self.databases: list[str] = []
        """Names of the scratch databases the run created (each dropped at the end of its phase)."""
        self.values: dict[str, Any] = {}
        self.notes: dict[str, str] = {}
        self.failed: set[str] = set()
        self.started: list[str] = []
        """Names of the servers the run started, in order."""
        # With `sizes.shared_servers`: the run's one database and its servers (by setting), kept until `close()`.
        self._shared = ExitStack()
        self._shared_database: str | None = None
        self._shared_servers: dict[tuple, tuple[ServerProcess, str]] = {}

    def close(self) -> None:
        """Stop the shared servers and drop the shared database (nothing without `sizes.shared_servers`)."""
        self._shared.close()

    # -- servers -----------------------------------------------------------------------------
    def server_spec(self, name: str, database_url: str, *, tracing: bool, workers: int | None = None,
                    traces: str | None = None):  # fmt: skip
        """A `running_servers` spec for `python -m agent serve` on a free port, and its base URL.

        `traces`: "server" sends every trace to the run's tracking server; "local" writes every trace into a
        SQLite file of the server's own; "default" sets nothing (the default store under the run's directory,
        and the default sample ratio), as a user who runs `tt-agent serve` as installed. None: "server" when
        the run has a tracking server, else "default".
        """
        if traces is None:
            traces = "server" if self.tracking_uri else "default"
        port = free_port()
        args = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        if workers is not None:
            args += ["--workers", str(workers)]
        # The benchmark decides every agent setting: none leaks in from the caller's AGENT_* variables.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        env.update(
            AGENT_DATABASE_URL=database_url,
            AGENT_POOL_MAX_SIZE=str(POOL_MAX_SIZE),
            AGENT_MODEL="fake",
            AGENT_TRACING="true" if tracing else "false",
            OPENAI_BASE_URL=self.stub_url,
            OPENAI_API_KEY="unused",
        )
        if traces == "server":
            env.update(MLFLOW_TRACKING_URI=self.tracking_uri, AGENT_TRACE_SAMPLE_RATIO="1")
        elif traces == "local":
            env.update(MLFLOW_TRACKING_URI=f"sqlite:///{self.trace_file(name)}", AGENT_TRACE_SAMPLE_RATIO="1")
        else:
            env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
        base_url = f"http://127.0.0.1:{port}"
        return (name, args, env, f"{base_url}/health"), base_url

    def trace_file(self, name: str) -> Path:
        """The SQLite file a server or measurement `name` writes every trace into: one of its own, or with
        `sizes.shared_servers` the run's default store once a server has made it (a store is only there once
        it is whole: a server answers /health after making it)."""
        default = self.workdir / DEFAULT_TRACKING_DB
        if self.sizes.shared_servers and default.exists():
            return default
        return self.workdir / f"{name}-mlflow.db"

    def servers(self, specs):
        self.started += [name for name, *_ in specs]
        return running_servers(specs, cwd=self.workdir, timeout=SERVER_STARTUP_TIMEOUT_S)

    @contextmanager
    def phase_servers(self, wanted: Mapping[str, tuple[str, Setting]]) -> Iterator[dict[str, PhaseServer]]:
        """A phase's servers by name, each asked for as (database prefix, setting); yields them once all answer.

        Each prefix is a scratch database of the phase (names with one prefix share it); the servers start
        together, and are stopped and their databases dropped when the block ends. With `sizes.shared_servers`,
        every server is on the run's one scratch database (`tt_load_shared`), and a setting that an earlier
        phase started gets that server: new ones start now and stay up until `close()`.

        Raises:
            RuntimeError: a server exited or did not answer in time (`bench.processes.running_servers`).
        """
        if self.sizes.shared_servers:
            yield self._shared_phase_servers(wanted)
            return
        with ExitStack() as stack:
            databases: dict[str, str] = {}
            for prefix, _ in wanted.values():
                if prefix not in databases:
                    databases[prefix] = stack.enter_context(self.scratch_database(prefix))
            specs = {name: self.server_spec(name, databases[prefix], **asdict(setting))
                     for name, (prefix, setting) in wanted.items()}  # fmt: skip
            processes = stack.enter_context(self.servers([spec for spec, _ in specs.values()]))
            yield {name: PhaseServer(process, url, databases[wanted[name][0]])
                   for (name, (_, url)), process in zip(specs.items(), processes, strict=True)}  # fmt: skip

    def _shared_phase_servers(self, wanted: Mapping[str, tuple[str, Setting]]) -> dict[str, PhaseServer]:
        if self._shared_database is None:
            self._shared_database = self._shared.enter_context(self.scratch_database("tt_load_shared"))
        db = self._shared_database
        keys = {name: self._setting_key(setting) for name, (_, setting) in wanted.items()}
        missing = {key: name for name, key in keys.items() if key not in self._shared_servers}
        specs = {key: self.server_spec(name, db, **asdict(wanted[name][1])) for key, name in missing.items()}
        processes = self._shared.enter_context(self.servers([spec for spec, _ in specs.values()]))
        for (key, (_, url)), process in zip(specs.items(), processes, strict=True):
            self._shared_servers[key] = (process, url)
        return {name: PhaseServer(*self._shared_servers[key], db) for name, key in keys.items()}

    def _setting_key(self, setting: Setting) -> tuple:
        """Settings that run the same server: `traces` resolved as `server_spec` does, no `--workers` is 1."""
        traces = setting.traces or ("server" if self.tracking_uri else "default")
        return setting.tracing, traces, setting.workers or 1

    def scratch_database(self, prefix: str):
        """`bench.databases.scratch_database` on the run's server, its name kept in `self.databases`."""
        return _recorded(scratch_database(self.server_url, prefix), self.databases)

    def model(self, latency_s: float) -> None:
        configure_stub(self.stub_url, latency_s=latency_s, chunks=MODEL_CHUNKS)

    # -- phases 1-3, 5-7 ---------------------------------------------------------------------
    def serving_under_load(self) -> dict[str, Any]:
        self.model(MODEL_LATENCY_S)
        with self.phase_servers({"serve": ("tt_load_serve", Setting(tracing=self.load_tracing))}) as servers:
            out = asyncio.run(self._serve(servers["serve"].url, dbname_of(servers["serve"].database)))
        streamed, unstreamed, zero = out["streamed"], out["unstreamed"], out["zero_model_streamed"]
        reads, reads_unstreamed = out["history_during_streamed"], out["history_during_unstreamed"]
        self.values.update(
            streamed_errors=streamed["errors"],
            unstreamed_errors=unstreamed["errors"],
            peak_connections=out["peak_connections"],
            streaming_wall_ratio=out["streamed_wall_s"] / (MODEL_LATENCY_S + out["zero_model_wall_s"]),
            history_p50_s=reads["p50_s"],
            history_max_s=reads["max_s"],
            streamed_wall_s=out["streamed_wall_s"],
            streamed_turn_p50_s=streamed["p50_s"],
            streamed_turn_max_s=streamed["max_s"],
            zero_model_wall_s=out["zero_model_wall_s"],
            unstreamed_wall_s=out["unstreamed_wall_s"],
            unstreamed_turn_p50_s=unstreamed["p50_s"],
            history_unstreamed_p50_s=reads_unstreamed["p50_s"],
            history_unstreamed_max_s=reads_unstreamed["max_s"],
        )
        for key, summary in (("streamed_errors", streamed), ("unstreamed_errors", unstreamed)):
            self.notes[key] = _reasons(summary)
        if streamed["errors"] or zero["errors"]:
            self.failed.add("streaming_wall_ratio")
            self.notes["streaming_wall_ratio"] = f"over failed turns: {streamed['errors']} + {zero['errors']} at 0 s"
        self.notes["history_p50_s"] = f"{reads['requests']} reads, {reads['errors']} failed"
        if reads["errors"]:  # a failed read is not a fast one
            self.failed.update(("history_p50_s", "history_max_s"))
        self.notes["peak_connections"] = f"{out['connection_samples']} samples during phases 2-3"
        return out

    async def _serve(self, base_url: str, dbname: str) -> dict[str, Any]:
        n = self.sizes.conversations
        async with traffic.new_client(base_url, connections=2 * n + 16) as client:
            # The reader's thread exists before the load; it and a stream warm up the server.
            reader_thread = traffic.new_thread_id("reader")
            for outcome in (
                await traffic.send_turn(client, "I'm planning a trip.", reader_thread, stream=False,
                                        user_id=READER_USER_ID),  # fmt: skip
                await traffic.send_turn(client, "Warming up.", traffic.new_thread_id("warmup"), stream=True),
            ):
                if not outcome.ok:
                    raise RuntimeError(f"the server cannot run a turn: {outcome.error}")
            sampler = traffic.ConnectionSampler(self.server_url, dbname, SAMPLE_INTERVAL_S).start()
            try:
                print(f"  {n} streamed conversations at once ...", flush=True)
                poller = traffic.HistoryPoller(base_url, reader_thread, READER_USER_ID, HISTORY_INTERVAL_S).start()
                try:
                    streamed_wall, streamed = await traffic.at_once(client, n, stream=True, label="streamed")
                finally:
                    reads = poller.stop()
                print(f"  {n} unstreamed conversations at once ...", flush=True)
                poller = traffic.HistoryPoller(base_url, reader_thread, READER_USER_ID, HISTORY_INTERVAL_S).start()
                try:
                    unstreamed_wall, unstreamed = await traffic.at_once(client, n, stream=False, label="unstreamed")
                finally:
                    reads_unstreamed = poller.stop()
            finally:
                samples = sampler.stop()
            print(f"  {n} streamed conversations at once, 0 s model ...", flush=True)
            self.model(0.0)
            try:
                zero_wall, zero = await traffic.at_once(client, n, stream=True, label="zero")
            finally:
                self.model(MODEL_LATENCY_S)
        return {
            "streamed_wall_s": streamed_wall,
            "streamed": traffic.summarize(streamed),
            "unstreamed_wall_s": unstreamed_wall,
            "unstreamed": traffic.summarize(unstreamed),
            "zero_model_wall_s": zero_wall,
            "zero_model_streamed": traffic.summarize(zero),
            "history_during_streamed": traffic.summarize(reads),
            "history_during_unstreamed": traffic.summarize(reads_unstreamed),
            "peak_connections": max(samples, default=0),
            "connection_samples": len(samples),
        }

    # -- phase 4 -----------------------------------------------------------------------------
    def in_process_predicts(self) -> dict[str, Any]:
        self.model(MODEL_LATENCY_S)
        os.environ.update(OPENAI_BASE_URL=self.stub_url, OPENAI_API_KEY="unused")
        from agent import create_agent

        calls = self.sizes.in_process_calls
        with self.scratch_database("tt_load_inproc") as db:
            with create_agent(db, model="fake", pool_max_size=POOL_MAX_SIZE, tracing=False) as agent:

                def call(n: int) -> traffic.Outcome:
                    start = time.perf_counter()
                    try:
                        out = agent.predict({
                            "input": [{"role": "user", "content": f"I'm planning a trip (in-process {n})."}],
                            "custom_inputs": {"thread_id": traffic.new_thread_id("inproc")},
                        })  # fmt: skip
                        checkpoint_id = (out.custom_outputs or {}).get("checkpoint_id")
                        error = None if checkpoint_id else "no checkpoint_id in custom_outputs"
                    except Exception as exc:  # counted and reported, never hidden
                        checkpoint_id, error = None, f"{type(exc).__name__}: {exc}"
                    return traffic.Outcome(time.perf_counter() - start, None, checkpoint_id, error)

                print(f"  {calls} in-process predict calls from {calls} threads ...", flush=True)
                with concurrent.futures.ThreadPoolExecutor(max_workers=calls) as pool:
                    start = time.perf_counter()
                    outcomes = list(pool.map(call, range(calls)))
                    wall = time.perf_counter() - start
        summary = traffic.summarize(outcomes)
        self.values.update(in_process_errors=summary["errors"], in_process_wall_s=wall)
        self.notes["in_process_errors"] = _reasons(summary)
        return {"wall_s": wall, "calls": summary}

    # -- phase 8 -----------------------------------------------------------------------------
    def tracing_cpu(self) -> dict[str, Any]:
        self.model(0.0)
        wanted = {"traced": ("tt_load_traced", Setting(tracing=True, traces="default")),
                  "untraced": ("tt_load_untraced", Setting(tracing=False)),
                  "traced_local": ("tt_load_local", Setting(tracing=True, traces="local"))}  # fmt: skip
        if self.tracking_uri:
            wanted["traced_server"] = ("tt_load_remote", Setting(tracing=True, traces="server"))
        with self.phase_servers(wanted) as started:
            print(f"  {self.sizes.cpu_turns} turns on a server tracing at its default, one without tracing, one "
                  "writing every trace into its own SQLite file"
                  f"{' and one sending every trace to a tracking server' if self.tracking_uri else ''} ...",
                  flush=True)  # fmt: skip
            servers = {name: (server.process, server.url) for name, server in started.items()}
            out = asyncio.run(self._cpu_rounds(servers))
        per_turn = {
            name: out[name]["cpu_s"] / out[name]["turns"]["requests"] if out[name]["turns"]["requests"] else None
            for name in servers
        }
        errors = sum(out[name]["turns"]["errors"] for name in servers)
        if per_turn["traced"] is not None and per_turn["untraced"]:
            self.values["tracing_cpu_ratio"] = per_turn["traced"] / per_turn["untraced"]
            self.values["cpu_ms_per_turn_traced"] = per_turn["traced"] * 1000
            self.values["cpu_ms_per_turn_untraced"] = per_turn["untraced"] * 1000
        if per_turn.get("traced_server") is not None and per_turn["untraced"]:
            self.values["cpu_ms_per_turn_traced_server"] = per_turn["traced_server"] * 1000
            self.values["tracing_server_cpu_ratio"] = per_turn["traced_server"] / per_turn["untraced"]
        if per_turn["traced_local"] is not None and per_turn["untraced"]:
            self.values["cpu_ms_per_turn_traced_local"] = per_turn["traced_local"] * 1000
            self.values["tracing_local_cpu_ratio"] = per_turn["traced_local"] / per_turn["untraced"]
        if errors:
            self.failed.add("tracing_cpu_ratio")
            self.notes["tracing_cpu_ratio"] = f"{errors} turns failed"
        return out

    async def _cpu_rounds(self, servers: Mapping[str, tuple[ServerProcess, str]]) -> dict[str, Any]:
        half = max(1, self.sizes.cpu_turns // 2)
        cpu = {name: 0.0 for name in servers}
        outcomes: dict[str, list[traffic.Outcome]] = {name: [] for name in servers}
        clients = {name: traffic.new_light_client(url, CPU_CONCURRENCY) for name, (_, url) in servers.items()}
        try:
            for name, client in clients.items():
                await traffic.conversations(client, WARMUP_TURNS, 1, label=f"{name}-warmup")
            # Symmetric rounds, so a drift of the machine's speed hits every server alike.
            for name in ("traced", "untraced", "traced_server", "traced_local", "traced_local", "traced_server",
                         "untraced", "traced"):  # fmt: skip
                if name not in servers:
                    continue
                process = servers[name][0]
                for other, _ in servers.values():  # all idle first: one still exporting traces would skew it
                    await _idle_cpu_seconds(other)
                before = await _idle_cpu_seconds(process)
                _, turns = await traffic.conversations(clients[name], half, CPU_CONCURRENCY, label=name)
                cpu[name] += await _idle_cpu_seconds(process) - before
                outcomes[name] += turns
        finally:
            for client in clients.values():
                await client.aclose()
        return {name: {"cpu_s": cpu[name], "turns": traffic.summarize(outcomes[name])} for name in servers}

    # -- phase 9 -----------------------------------------------------------------------------
    def turn_growth(self) -> dict[str, Any]:
        out = {}
        here = self.sizes.growth_in_process
        for tracing in ("off", "on") if here else ("on", "off"):  # here: tracing on last (`Sizes.growth_in_process`)
            print(f"  one thread of {self.sizes.growth_turns} in-process turns, tracing {tracing} ...", flush=True)
            with self.scratch_database(f"tt_load_growth_{tracing}") as db:
                out[tracing] = self._growth_here(db, tracing) if here else self._growth_child(db, tracing)
        self.values.update(
            traced_turn_growth=out["on"]["growth"],
            traced_turn_ms_first=out["on"]["turn_p50_ms_first"],
            traced_turn_ms_last=out["on"]["turn_p50_ms_last"],
            untraced_turn_growth=out["off"]["growth"],
            untraced_turn_ms_first=out["off"]["turn_p50_ms_first"],
            untraced_turn_ms_last=out["off"]["turn_p50_ms_last"],
        )
        return out

    def _growth_here(self, database_url: str, tracing: str) -> dict[str, Any]:
        from bench import turn_growth

        if tracing == "on":  # what the child's MLFLOW_TRACKING_URI says
            import mlflow

            mlflow.set_tracking_uri(f"sqlite:///{self.trace_file(f'growth-{tracing}')}")
        found = turn_growth.measure(database_url, self.sizes.growth_turns, tracing == "on")
        if tracing == "on":  # MLflow exports traces on a thread: done before the run's directory is removed
            mlflow.flush_trace_async_logging()
        return found

    def _growth_child(self, database_url: str, tracing: str) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{self.workdir / f'growth-{tracing}'}-mlflow.db"
        # The child runs in the scratch directory: `bench` is found through PYTHONPATH.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        done = subprocess.run(
            [sys.executable, "-m", "bench.turn_growth", "--database-url", database_url,
             "--turns", str(self.sizes.growth_turns), "--tracing", tracing],
            cwd=self.workdir, env=env, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"bench.turn_growth failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    # -- phase 10 ----------------------------------------------------------------------------
    def chains(self) -> dict[str, Any]:
        configure_stub(self.stub_url, latency_s=CHAIN_MODEL_LATENCY_S, chunks=MODEL_CHUNKS)
        out: dict[str, Any] = {}
        wanted = {name: ("tt_load_chains", setting) for name, setting in self._chain_settings().items()}
        with self.phase_servers(wanted) as servers:
            for strategy in ("reject", "enqueue"):
                print(f"  {CHAIN_SERVERS} processes, {strategy}: {self.sizes.chain_threads} threads of "
                      f"{self.sizes.chain_turns} turns ...", flush=True)  # fmt: skip
                out[strategy] = asyncio.run(self._drive_chains([server.url for server in servers.values()], strategy))
            self._judge_chains(next(iter(servers.values())).database, out)
        return out

    def _chain_settings(self) -> dict[str, Setting]:
        """Phase 10's servers, CHAIN_SERVERS processes on one database."""
        if not self.sizes.shared_servers:
            return {f"chains-{i}": Setting(tracing=False) for i in range(CHAIN_SERVERS)}
        # Shared servers are one per setting: the one without tracing, and the `--workers` one of phase 11.
        return {"chains-0": Setting(tracing=False), "chains-1": Setting(tracing=False, workers=CHAIN_SERVERS - 1)}

    async def _drive_chains(self, base_urls: list[str], strategy: str) -> dict[str, Any]:
        rng = random.Random(strategy)
        threads = {traffic.new_thread_id(f"chain-{strategy}-{i}"): i for i in range(self.sizes.chain_threads)}
        async with traffic.new_client(connections=self.sizes.chain_threads * CHAIN_IN_FLIGHT + 8) as client:

            async def drive(thread_id: str) -> list[tuple[str, traffic.Outcome]]:
                in_flight = asyncio.Semaphore(CHAIN_IN_FLIGHT)

                async def one(turn: int) -> tuple[str, traffic.Outcome]:
                    text = f"{strategy}: turn {turn} of thread {threads[thread_id]}"
                    async with in_flight:
                        # Staggered, so that under reject some turns arrive while another runs and some
                        # just after it committed (without it, only each thread's first turn would land).
                        await asyncio.sleep(rng.uniform(0, CHAIN_STAGGER * CHAIN_MODEL_LATENCY_S))
                        url = f"{rng.choice(base_urls)}/responses"
                        outcome = await traffic.send_turn(client, text, thread_id, stream=False, url=url,
                                                          multitask_strategy=strategy)  # fmt: skip
                    return text, outcome

                return await asyncio.gather(*(one(t) for t in range(1, self.sizes.chain_turns + 1)))

            sent = dict(zip(threads, await asyncio.gather(*(drive(t) for t in threads)), strict=True))
            histories = {}
            for thread_id in threads:
                body = {"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id,
                                                       "limit": 1000}}  # fmt: skip
                response = await client.post(f"{rng.choice(base_urls)}/invocations", json=body)
                if response.status_code == 404:
                    histories[thread_id] = []  # no turn landed
                else:
                    response.raise_for_status()
                    histories[thread_id] = response.json()["custom_outputs"]["history"]
        return {"sent": sent, "histories": histories}

    def _judge_chains(self, database_url: str, out: dict[str, Any]) -> None:
        from agent import create_agent

        with create_agent(database_url, model="offline", tracing=False) as agent:
            for strategy, run in out.items():
                problems, counts = [], {"sent": 0, "landed": 0, "refused": 0, "other_errors": 0}
                for thread_id, turns in run["sent"].items():
                    landed = {text: o.checkpoint_id for text, o in turns if o.ok}
                    refused = [text for text, o in turns if o.status == 409]
                    others = [o.error for _, o in turns if not o.ok and o.status != 409]
                    counts["sent"] += len(turns)
                    counts["landed"] += len(landed)
                    counts["refused"] += len(refused)
                    counts["other_errors"] += len(others)
                    history = run["histories"][thread_id]
                    head_texts = _user_texts(agent, thread_id, history[0]["checkpoint_id"]) if history else []
                    found = traffic.check_chain(history, landed, refused, head_texts)
                    if strategy == "enqueue" and refused:
                        found.append(f"{len(refused)} turns refused (409) under enqueue")
                    found += [f"a turn failed: {error}" for error in others[:2]]
                    problems += [f"{thread_id}: {p}" for p in found]
                run["counts"], run["problems"] = counts, problems
                run["sent"] = {t: [{"text": text, **asdict(o), "body": None} for text, o in turns]
                               for t, turns in run["sent"].items()}  # fmt: skip
                key = f"{strategy}_chains"
                self.values[key] = not problems
                summary = (f"{counts['sent']} turns on {len(run['histories'])} threads, {counts['landed']} landed, "
                           f"{counts['refused']} refused")  # fmt: skip
                self.notes[key] = summary + (f"; {len(problems)} problems, e.g. {problems[0]}" if problems else "")

    # -- phase 11 ----------------------------------------------------------------------------
    def workers(self) -> dict[str, Any]:
        if not serve_has_workers_option(self.workdir):
            self.notes["workers_speedup"] = "not measurable: tt-agent serve has no --workers option"
            return {"measurable": False}
        self.model(0.0)
        # Tracing off: on this machine the tracking server would share the two cores too, and the
        # figure would measure it (traces cost it more CPU than the turn costs the agent).
        wanted = {f"workers-{n}": (f"tt_load_workers{n}", Setting(tracing=False, workers=n)) for n in (1, 2)}
        with self.phase_servers(wanted) as servers:
            print(f"  {self.sizes.workers_turns} turns on --workers 1 and on --workers 2 ...", flush=True)
            by_workers = {n: (servers[f"workers-{n}"].process, servers[f"workers-{n}"].url) for n in (1, 2)}
            out = asyncio.run(self._workers_rounds(by_workers))
        tps = {n: out[n]["turns"]["requests"] / out[n]["wall_s"] for n in (1, 2)}
        errors = out[1]["turns"]["errors"] + out[2]["turns"]["errors"]
        self.values.update(workers_speedup=tps[2] / tps[1], workers_1_turns_per_s=tps[1], workers_2_turns_per_s=tps[2])
        if errors:
            self.failed.add("workers_speedup")
            self.notes["workers_speedup"] = f"{errors} turns failed"
        return {"measurable": True, **{f"workers_{n}": out[n] for n in (1, 2)}}

    async def _workers_rounds(self, servers: Mapping[int, tuple[ServerProcess, str]]) -> dict[int, dict[str, Any]]:
        concurrency, half = self.sizes.workers_concurrency, max(1, self.sizes.workers_turns // 2)
        wall = {n: 0.0 for n in servers}
        outcomes: dict[int, list[traffic.Outcome]] = {n: [] for n in servers}
        clients = {n: traffic.new_light_client(url, concurrency) for n, (_, url) in servers.items()}
        try:
            for n, client in clients.items():  # every worker process imports and connects before it is timed
                await traffic.conversations(client, 2 * concurrency, concurrency, label=f"workers-{n}-warmup")
            for n in (1, 2, 2, 1):
                # Both idle first: a server still exporting traces would slow the other's round.
                for process, _ in servers.values():
                    await _idle_cpu_seconds(process)
                seconds, turns = await traffic.conversations(clients[n], half, concurrency, label=f"workers-{n}")
                wall[n] += seconds
                outcomes[n] += turns
        finally:
            for client in clients.values():
                await client.aclose()
        return {n: {"wall_s": wall[n], "turns": traffic.summarize(outcomes[n])} for n in servers}


@contextmanager
def _recorded(database: Any, names: list[str]) -> Iterator[str]:
    with database as url:
        names.append(dbname_of(url))
        yield url


@contextmanager
def tracking_server(workdir: Path) -> Iterator[str]:
    """An MLflow tracking server (`mlflow server`, SQLite store under `workdir`) for the run; yields its URI."""
    port = free_port()
    args = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(TRACKING_SERVER_WORKERS), "--backend-store-uri", f"sqlite:///{workdir / 'tracking.db'}",
            "--default-artifact-root", str(workdir / "tracking-artifacts")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_"))}
    uri = f"http://127.0.0.1:{port}"
    with running_servers([("mlflow-tracking", args, env, f"{uri}/health")], cwd=workdir, timeout=SERVER_STARTUP_TIMEOUT_S):
        yield uri


def serve_has_workers_option(cwd: Path) -> bool:
    """Whether `tt-agent serve` takes `--workers` (read from its `--help`)."""
    done = subprocess.run(
        [sys.executable, "-m", "agent", "serve", "--help"], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    return done.returncode == 0 and "--workers" in done.stdout


async def _idle_cpu_seconds(process: ServerProcess) -> float:
    """The process group's CPU seconds once it stopped using CPU (traces may be exported after the answer)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    last = process.cpu_seconds()
    while time.monotonic() < deadline:
        await asyncio.sleep(IDLE_PROBE_S)
        now = process.cpu_seconds()
        if now == last:
            break
        last = now
    return last


def _user_texts(agent: Any, thread_id: str, checkpoint_id: str) -> list[str]:
    """The user messages of one checkpoint's state, in order (read with LangGraph's `get_state`)."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return [m.text for m in agent.graph.get_state(config).values.get("messages", []) if m.type == "human"]


def _reasons(summary: Mapping[str, Any]) -> str:
    if not summary["errors"]:
        return ""
    reasons = "; ".join(f"{n}x {reason}" for reason, n in summary["error_reasons"].items())
    return f"of {summary['requests']}: {reasons}"


def run_phases(bench: LoadBenchmark, phases: Mapping[str, Callable[[], dict[str, Any]]]) -> tuple[dict, list[str]]:
    """Run each phase; a phase that raises is reported (traceback on stderr) and the others still run."""
    measurements, broken = {}, []
    for name, phase in phases.items():
        print(f"phase: {name}", flush=True)
        started = time.perf_counter()
        try:
            measurements[name] = phase()
        except Exception as exc:  # noqa: BLE001 - one broken phase must not hide the others' figures
            traceback.print_exc()
            measurements[name] = {"error": f"{type(exc).__name__}: {exc}"}
            broken.append(name)
        measurements[name]["phase_seconds"] = time.perf_counter() - started
    return measurements, broken


def run(server_url: str, *, quick: bool = False, load_tracing: bool = True) -> dict[str, Any]:
    """Every phase on the Postgres server of `server_url`; the report (`bench.report.build_report`).

    `quick` shrinks every size (`QUICK`); `load_tracing` is `AGENT_TRACING` of the servers of
    phases 1-7 (on, as `tt-agent serve`). The report also holds `measurements` (per phase)
    and `broken_phases` (phases that raised; their figures are "not measured").
    """
    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    print(f"load benchmark{' (quick)' if quick else ''}: {asdict(sizes)}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-load-") as tmp, \
            openai_stub_server(latency_s=MODEL_LATENCY_S, chunks=MODEL_CHUNKS) as stub_url, \
            (tracking_server(Path(tmp)) if sizes.tracking_server else nullcontext()) as tracking_uri, \
            closing(LoadBenchmark(server_url, stub_url, Path(tmp), sizes, load_tracing, tracking_uri)) as bench:  # fmt: skip
        measurements, broken = run_phases(
            bench,
            {
                "serving under load (phases 1-3, 5-7)": bench.serving_under_load,
                "in-process predict calls (phase 4)": bench.in_process_predicts,
                "tracing CPU (phase 8)": bench.tracing_cpu,
                "workers (phase 11)": bench.workers,
                "several processes, one database (phase 10)": bench.chains,
                "turn time as a thread grows (phase 9)": bench.turn_growth,
            },
        )
    if broken:
        print(f"phases that could not run: {'; '.join(broken)}", file=sys.stderr)
    return report.build_report(
        figures(sizes),
        bench.values,
        notes=bench.notes,
        failed=bench.failed,
        **header,
        settings={
            "quick": quick,
            "sizes": asdict(sizes),
            "model_latency_s": MODEL_LATENCY_S,
            "model_chunks": MODEL_CHUNKS,
            "pool_max_size": POOL_MAX_SIZE,
            "load_tracing": load_tracing,
            "chain_model_latency_s": CHAIN_MODEL_LATENCY_S,
        },
        measurements=measurements,
        broken_phases=broken,
        scratch_databases=bench.databases,
        servers_started=bench.started,
        elapsed_seconds=time.perf_counter() - started,
        peak_rss_mb=report.peak_rss_mb(),
    )


TITLE = (f"tt-agent serve under load: {MODEL_LATENCY_S:g} s model in {MODEL_CHUNKS} chunks, "
         f"pool_max_size={POOL_MAX_SIZE}")  # fmt: skip


def print_result(result: dict[str, Any]) -> None:
    """The table, header lines and summary line (`bench.report.print_report`)."""
    report.print_report(TITLE, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every phase at a reduced size (a smoke test)")
    parser.add_argument("--json", type=Path, help="also write every figure and measurement to this JSON file")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("AGENT_TEST_DATABASE_URL", DEFAULT_SERVER_URL),
        help="a Postgres server URL (default: AGENT_TEST_DATABASE_URL, else the local server)",
    )
    parser.add_argument(
        "--load-tracing",
        choices=["on", "off"],
        default="on",
        help="AGENT_TRACING of the servers of phases 1-7 (default on, as tt-agent serve)",
    )
    args = parser.parse_args(argv)
    try:
        server_version(args.database_url)
    except (psycopg.Error, ValueError) as exc:
        print(f"error: Postgres is not reachable at --database-url: {type(exc).__name__}", file=sys.stderr)
        return 2
    result = run(args.database_url, quick=args.quick, load_tracing=args.load_tracing == "on")
    print_result(result)
    if args.json is not None:
        report.write_json(args.json, result)
    return 1 if result["broken_phases"] else 0


if __name__ == "__main__":
    sys.exit(main())
