"""Storage benchmark: this project's memory against the reference design, on the same Postgres server (issue 4).

Usage::

    python -m bench.storage [--quick] [--turns N] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it with the other benchmarks.) `--quick` is 12 turns and 4 conversations at once, a smoke test.

The server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL` (as the
tests), else `postgresql://postgres@127.0.0.1:5432/postgres`. Each design gets
a fresh scratch database (`tt_bench_ref_<hex>`, `tt_bench_ours_<hex>`), dropped
at the end whatever happens.

Two designs, one offline chat model (`agent.models.OfflineChatModel`):

* **reference**: what the Databricks memory notebooks do. `StateGraph(MessagesState)`
  with one node calling the model, `PostgresSaver` on a `psycopg_pool.ConnectionPool`,
  the graph compiled per request, default durability, and history read with a
  `get_state_history` loop that stops at `limit` in Python.
* **project**: `agent.create_agent(url, model="offline")`, turns with `predict`
  and `custom_inputs.thread_id`, history with `get_checkpoint_history(limit=10)`.

For one thread of N turns (user messages of exactly `USER_MESSAGE_BYTES` ASCII
bytes, from `user_message`), it measures the figures of issue 4 and prints
(`bench.report`) a table `figure | measured | target | pass` of this project's
figures, each with the reference design's value in its note, then
`targets met: X/Y`. The exit code is 0 even when a target is missed; it is
non-zero only when the benchmark itself cannot run.

How it measures, and why:

* Timings use `time.perf_counter`, after a warm-up thread on every design.
* Storage: the bytes of every table of the scratch database (with indexes and
  TOAST) after the thread's N turns minus before, over the UTF-8 bytes of the
  text of every message the thread holds at the end. User messages are drawn
  from a vocabulary, so TOAST compression cannot hide a design that stores the
  same text many times.
* Turn latency: p50 of the last `WINDOW` turns of the N-turn thread over the
  p50 of the first `WINDOW` turns of a thread, taken from a second thread
  whose first turns alternate with the long thread's last ones (so both are
  measured at the same moment). The same design in memory runs its own
  threads in lockstep with the Postgres ones (turn t on both before turn t+1),
  so a busy moment of the machine hits both alike.
* History: p50 of `get_checkpoint_history(limit=10)` (the reference: its loop)
  on the N-turn thread and on a new thread of `WINDOW` turns (the same
  messages), calls interleaved for the same reason.
* Throughput: `CONCURRENT_CONVERSATIONS` threads of `THROUGHPUT_TURNS` turns at
  once versus one, with a chat model that takes `SLOW_MODEL_MS`; errors are counted
  (`--quick`: `QUICK_CONCURRENT_CONVERSATIONS` of `QUICK_THROUGHPUT_TURNS`).

All figures are ratios of times measured in this one run, so they compare
designs, not machines; other load on the machine still adds noise (the report
records the load average).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from agent import create_agent
from agent.models import OfflineChatModel
from bench import report
from bench.databases import DEFAULT_SERVER_URL, dbname_of, scratch_database, server_version

#: The report's title.
TITLE = "storage: timetravel-agent vs the reference design, one thread of {turns} turns"
#: Turns of the measured thread: a full run, and `--quick` (a smoke test).
TURNS, QUICK_TURNS = 200, 12

#: Bytes of every user message (ASCII, so also characters).
USER_MESSAGE_BYTES = 500
#: Turns in each latency window: the first and the last `WINDOW` turns of the thread.
WINDOW = 10
#: `limit` of every history call.
HISTORY_LIMIT = 10
#: Timed history calls on a thread of `WINDOW` turns and on the thread of N turns, per design.
HISTORY_REPETITIONS = 50
#: The reference's history loop loads the whole thread; at N=200 one call takes seconds.
REFERENCE_HISTORY_REPETITIONS_AT_N = 3
#: Conversations run at once in the throughput figure, each doing `THROUGHPUT_TURNS` turns; `--quick`'s
#: fewer and shorter (its 171 turns a design were most of the smoke test's CPU after the imports).
CONCURRENT_CONVERSATIONS, QUICK_CONCURRENT_CONVERSATIONS = 16, 4
THROUGHPUT_TURNS, QUICK_THROUGHPUT_TURNS = 10, 3
#: How long the slow chat model of the throughput figure takes per call.
SLOW_MODEL_MS = 100
#: Turns of the warm-up thread each design runs before anything is timed.
WARMUP_TURNS = 3
#: The reference notebooks' pool.
REFERENCE_POOL_MIN, REFERENCE_POOL_MAX = 1, 10

# Every table of the scratch database, with its indexes and TOAST (pg_total_relation_size).
DATABASE_BYTES_SQL = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%'
"""
TABLE_BYTES_SQL = """
SELECT c.relname AS name, pg_total_relation_size(c.oid)::bigint AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%'
ORDER BY bytes DESC, name
"""

# Words of the user messages. Each message draws its own sequence (seeded by
# its turn), so messages do not repeat one another and Postgres's TOAST
# compression cannot hide a design that stores the same text many times.
_WORDS = (
    "trip train hotel museum ticket river bridge market castle harbor island valley mountain lake "
    "village station airport ferry bus taxi bicycle map guide dinner lunch breakfast coffee tea "
    "wine bread cheese fish garden park square cathedral tower gallery theater concert festival "
    "beach cliff forest desert glacier canyon temple palace library university street avenue "
    "north south east west morning evening night monday tuesday wednesday thursday friday "
    "saturday sunday january march may july september november early late quiet busy cheap "
    "expensive small large old new famous hidden local friendly slow fast rainy sunny windy "
    "cold warm remember booked missed visited planned cancelled moved changed asked told met"
).split()


def user_message(turn: int) -> str:
    """The user message of turn `turn` (1-based): deterministic ASCII text of exactly `USER_MESSAGE_BYTES` bytes.

    It never starts with "calculate ", so the offline model always answers in text.
    """
    draw = random.Random(turn)
    text = f"Turn {turn:05d}:"
    while len(text) < USER_MESSAGE_BYTES:
        text += " " + draw.choice(_WORDS)
    return text[:USER_MESSAGE_BYTES]


def message_bytes(messages: list[Any]) -> int:
    """UTF-8 bytes of the text content of `messages` (LangChain messages)."""
    return sum(len(m.text.encode("utf-8")) for m in messages)


def p50_ms(seconds: list[float]) -> float:
    """The median of `seconds`, in milliseconds."""
    return statistics.median(seconds) * 1000.0


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


# -- database sizes ------------------------------------------------------------------------
def table_bytes(url: str) -> dict[str, int]:
    """Bytes of each table of the database at `url` (with its indexes and TOAST), largest first."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {name: int(size) for name, size in conn.execute(TABLE_BYTES_SQL).fetchall()}


def database_bytes(url: str) -> int:
    """Bytes of every table of the database at `url`, including indexes and TOAST."""
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(DATABASE_BYTES_SQL).fetchone()[0])


# -- the two designs, behind one small interface -------------------------------------------
class Design:
    """One design under test: run a turn on a thread, read its history, read its final messages."""

    def turn(self, thread_id: str, text: str) -> None:
        raise NotImplementedError

    def history(self, thread_id: str, limit: int) -> list[dict]:
        raise NotImplementedError

    def messages(self, thread_id: str) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Reference(Design):
    """The Databricks notebooks' design: MessagesState, PostgresSaver, a graph compiled per request."""

    def __init__(self, checkpointer: Any, model: OfflineChatModel, close: Callable[[], None] = lambda: None) -> None:
        self.checkpointer = checkpointer
        self.model = model
        self._close = close

    @classmethod
    def on_postgres(cls, url: str, model: OfflineChatModel) -> Reference:
        pool = ConnectionPool(
            url,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            min_size=REFERENCE_POOL_MIN,
            max_size=REFERENCE_POOL_MAX,
            open=True,
        )
        checkpointer = PostgresSaver(pool)
        checkpointer.setup()
        return cls(checkpointer, model, pool.close)

    @classmethod
    def on_sqlite(cls, path: str, model: OfflineChatModel) -> Reference:
        conn = sqlite3.connect(path, check_same_thread=False)
        return cls(SqliteSaver(conn), model, conn.close)

    def graph(self):
        # Compiled per request, as the notebooks do.
        model = self.model

        def call_model(state: MessagesState) -> dict:
            return {"messages": [model.invoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", call_model)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        return builder.compile(checkpointer=self.checkpointer)

    def turn(self, thread_id: str, text: str) -> None:
        config = {"configurable": {"thread_id": thread_id}}
        self.graph().invoke({"messages": [{"role": "user", "content": text}]}, config)

    def history(self, thread_id: str, limit: int) -> list[dict]:
        config = {"configurable": {"thread_id": thread_id}}
        out: list[dict] = []
        # No limit passed to the call: the reference stops the loop in Python.
        for state in self.graph().get_state_history(config):
            messages = state.values.get("messages", [])
            out.append(
                {
                    "checkpoint_id": state.config["configurable"]["checkpoint_id"],
                    "message_count": len(messages),
                    "last_message": messages[-1].text[:100] if messages else "",
                }
            )
            if len(out) >= limit:
                break
        return out

    def messages(self, thread_id: str) -> list[Any]:
        return self.graph().get_state({"configurable": {"thread_id": thread_id}}).values.get("messages", [])

    def close(self) -> None:
        self._close()


class Project(Design):
    """This project: `create_agent(...)`, `predict` with `custom_inputs.thread_id`, `get_checkpoint_history`."""

    def __init__(self, url: str, model: Any = "offline", **settings: Any) -> None:
        self.agent = create_agent(url, model=model, tracing=False, **settings)

    def turn(self, thread_id: str, text: str) -> None:
        self.agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": {"thread_id": thread_id}})

    def history(self, thread_id: str, limit: int) -> list[dict]:
        return self.agent.get_checkpoint_history(thread_id, limit=limit)

    def messages(self, thread_id: str) -> list[Any]:
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        return self.agent.graph.get_state(config).values.get("messages", [])

    def close(self) -> None:
        self.agent.close()


# -- measurements --------------------------------------------------------------------------
def new_thread_id(label: str) -> str:
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


def warm_up(design: Design) -> None:
    thread_id = new_thread_id("warmup")
    for turn in range(1, WARMUP_TURNS + 1):
        design.turn(thread_id, user_message(turn))
    design.history(thread_id, HISTORY_LIMIT)


def run_threads(designs: dict[str, Design], turns: int) -> dict[str, dict[str, Any]]:
    """One new thread of `turns` turns on each design, in lockstep; returns per design its thread and turn times.

    Lockstep (turn t on every design before turn t+1) makes a busy moment of
    the machine hit every design alike, so ratios between designs stay fair.
    The last `WINDOW` turns alternate with the first `WINDOW` turns of a second,
    new thread (the same messages as the first thread's first turns), so the
    "first 10" and "last 10" turn times that the growth ratio compares are
    taken at the same moment, not minutes apart on a machine whose speed drifts.
    """
    threads = {name: new_thread_id(name) for name in designs}
    fresh = {name: new_thread_id(f"{name}-fresh") for name in designs}
    times: dict[str, list[float]] = {name: [] for name in designs}
    fresh_times: dict[str, list[float]] = {name: [] for name in designs}
    for turn in range(1, turns + 1):
        text = user_message(turn)
        early = turn - (turns - WINDOW)  # 1..WINDOW during the last WINDOW turns
        for name, design in designs.items():
            if early >= 1:
                seconds, _ = timed(lambda: design.turn(fresh[name], user_message(early)))
                fresh_times[name].append(seconds)
            seconds, _ = timed(lambda: design.turn(threads[name], text))
            times[name].append(seconds)
    return {
        name: {
            "thread_id": threads[name],
            "fresh_thread_id": fresh[name],
            "turn_p50_ms_first_of_thread": p50_ms(times[name][:WINDOW]),
            "turn_p50_ms_first": p50_ms(fresh_times[name]),
            "turn_p50_ms_last": p50_ms(times[name][-WINDOW:]),
        }
        for name in designs
    }


def time_history(design: Design, long_thread: str, long_repetitions: int) -> dict[str, float]:
    """History p50 (ms) on a new thread of `WINDOW` turns and on `long_thread`, calls interleaved.

    The short thread holds the same messages as the first `WINDOW` turns of the
    long one. Interleaving the two keeps the machine's load out of their ratio.
    """
    short_thread = new_thread_id("short")
    for turn in range(1, WINDOW + 1):
        design.turn(short_thread, user_message(turn))
    times: dict[str, list[float]] = {short_thread: [], long_thread: []}
    for repetition in range(max(HISTORY_REPETITIONS, long_repetitions)):
        for thread_id, wanted in ((short_thread, HISTORY_REPETITIONS), (long_thread, long_repetitions)):
            if repetition >= wanted:
                continue
            seconds, entries = timed(lambda: design.history(thread_id, HISTORY_LIMIT))
            if len(entries) != HISTORY_LIMIT:
                raise RuntimeError(f"history returned {len(entries)} entries, expected {HISTORY_LIMIT}")
            times[thread_id].append(seconds)
    return {"history_p50_ms_at_10": p50_ms(times[short_thread]), "history_p50_ms_at_n": p50_ms(times[long_thread])}


def measure_main(design: Design, memory: Design, url: str, turns: int, long_history_repetitions: int) -> dict[str, Any]:
    """The one-thread figures of a design on Postgres (`design`, database at `url`), with `memory` in lockstep."""
    warm_up(design)
    warm_up(memory)
    before = database_bytes(url)
    found = run_threads({"postgres": design, "memory": memory}, turns)
    thread_id = found["postgres"]["thread_id"]
    out: dict[str, Any] = {
        "db_bytes_before": before,
        "db_bytes_after": database_bytes(url),
        "table_bytes_after": table_bytes(url),
        "turn_p50_ms_first": found["postgres"]["turn_p50_ms_first"],
        "turn_p50_ms_last": found["postgres"]["turn_p50_ms_last"],
        # The in-memory growth is the floor that storage work cannot remove
        # (the reducer, the chat model's input, our message checks are O(messages)).
        "memory_turn_p50_ms_first": found["memory"]["turn_p50_ms_first"],
        "memory_turn_p50_ms_last": found["memory"]["turn_p50_ms_last"],
    }
    messages = design.messages(thread_id)
    out["message_count"] = len(messages)
    # Both threads written since `before` count: the N-turn one and the
    # second one whose first turns were timed alongside its last.
    out["raw_message_bytes"] = message_bytes(messages) + message_bytes(design.messages(found["postgres"]["fresh_thread_id"]))
    # After the size is read: the history's short thread is not part of the storage figure.
    out.update(time_history(design, thread_id, long_history_repetitions))
    return out


def measure_sqlite(design: Design, turns: int) -> dict[str, float]:
    """Turn p50s (ms) of the first and last `WINDOW` turns of one thread on a SQLite file."""
    try:
        warm_up(design)
        found = run_threads({"sqlite": design}, turns)["sqlite"]
    finally:
        design.close()
    return {
        "sqlite_turn_p50_ms_first": found["turn_p50_ms_first"],
        "sqlite_turn_p50_ms_last": found["turn_p50_ms_last"],
    }


def run_throughput(design: Design, conversations: int = CONCURRENT_CONVERSATIONS,
                   turns: int = THROUGHPUT_TURNS) -> dict[str, Any]:  # fmt: skip
    """Turns per second of one conversation, and of `conversations` at once; `turns` each."""

    def conversation() -> int:
        thread_id = new_thread_id("tput")
        errors = 0
        for turn in range(1, turns + 1):
            try:
                design.turn(thread_id, user_message(turn))
            except Exception as exc:  # counted and reported, never hidden
                print(f"  error in a concurrent turn: {type(exc).__name__}: {exc}", file=sys.stderr)
                errors += 1
        return errors

    design.turn(new_thread_id("tput-warmup"), user_message(1))
    single_seconds, single_errors = timed(conversation)
    with concurrent.futures.ThreadPoolExecutor(max_workers=conversations) as pool:
        start = time.perf_counter()
        futures = [pool.submit(conversation) for _ in range(conversations)]
        concurrent_errors = sum(f.result() for f in futures)
        concurrent_seconds = time.perf_counter() - start
    return {
        "throughput_single_tps": turns / single_seconds,
        "throughput_concurrent_tps": conversations * turns / concurrent_seconds,
        "errors": single_errors + concurrent_errors,
    }


def measure_reference(server_url: str, turns: int, workdir: Path, throughput: tuple[int, int]) -> dict[str, Any]:
    """The reference design's measurements; `throughput` is `run_throughput`'s (conversations, turns)."""
    out: dict[str, Any] = {}
    with scratch_database(server_url, "tt_bench_ref") as url:
        out["database"] = dbname_of(url)
        print(f"  reference: {turns} turns on Postgres and in memory, history ...", flush=True)
        design = Reference.on_postgres(url, OfflineChatModel())
        try:
            memory = Reference(InMemorySaver(), OfflineChatModel())
            out.update(measure_main(design, memory, url, turns, REFERENCE_HISTORY_REPETITIONS_AT_N))
        finally:
            design.close()
        print("  reference: throughput ...", flush=True)
        slow = Reference.on_postgres(url, OfflineChatModel(latency_ms=SLOW_MODEL_MS))
        try:
            out.update(run_throughput(slow, *throughput))
        finally:
            slow.close()
    print("  reference: SQLite file ...", flush=True)
    out.update(measure_sqlite(Reference.on_sqlite(str(workdir / "reference.sqlite"), OfflineChatModel()), turns))
    return out


def measure_project(server_url: str, turns: int, workdir: Path, throughput: tuple[int, int]) -> dict[str, Any]:
    """This project's measurements; `throughput` is `run_throughput`'s (conversations, turns)."""
    out: dict[str, Any] = {}
    with scratch_database(server_url, "tt_bench_ours") as url:
        out["database"] = dbname_of(url)
        print(f"  project: {turns} turns on Postgres and memory://, history ...", flush=True)
        design, memory = Project(url), Project("memory://")
        try:
            out.update(measure_main(design, memory, url, turns, HISTORY_REPETITIONS))
        finally:
            design.close()
            memory.close()
        print("  project: throughput ...", flush=True)
        slow = Project(url, model=OfflineChatModel(latency_ms=SLOW_MODEL_MS))
        try:
            out.update(run_throughput(slow, *throughput))
        finally:
            slow.close()
    print("  project: SQLite file ...", flush=True)
    out.update(measure_sqlite(Project(f"sqlite:///{workdir / 'project.sqlite'}"), turns))
    return out


# -- figures ---------------------------------------------------------------------------------
def figures(conversations: int = CONCURRENT_CONVERSATIONS) -> dict[str, report.Figure]:
    """Every figure of the report (this project's value; the reference's goes in the note), in table order;
    `conversations` is the throughput figure's."""
    ratio, speedup, ms = report.fixed(2), report.fixed(1, "x"), report.fixed(2, " ms")
    return {
        "storage_growth": report.Figure("storage growth / raw message bytes", "<= 3", lambda v: v <= 3, ratio),
        "history_growth": report.Figure("history(limit=10) p50 at N / at 10 turns", "<= 1.5", lambda v: v <= 1.5, ratio),
        "history_speedup": report.Figure("history at N: reference loop p50 / p50", ">= 100x", lambda v: v >= 100, speedup),
        "turn_latency_growth": report.Figure("turn p50, last 10 / first 10 turns", "<= 1.3", lambda v: v <= 1.3, ratio),
        "postgres_vs_memory": report.Figure("turn p50 at N, Postgres / in memory", "<= 1.5", lambda v: v <= 1.5, ratio),
        "concurrency_speedup": report.Figure(
            f"throughput, {conversations} conversations / 1", ">= 8x, 0 errors", lambda v: v >= 8, speedup
        ),
        "history_ms_at_n": report.Figure("history(limit=10) p50 at N turns", fmt=ms),
        "turn_ms_first": report.Figure("Postgres turn p50, first 10 turns", fmt=ms),
        "turn_ms_last": report.Figure("Postgres turn p50, last 10 turns", fmt=ms),
        "sqlite_turn_ms_at_10": report.Figure("SQLite file turn p50, first 10 turns", fmt=ms),
        "sqlite_turn_ms_at_n": report.Figure("SQLite file turn p50, last 10 turns", fmt=ms),
    }


def figures_of(m: dict[str, Any], reference_history_ms_at_n: float) -> dict[str, float]:
    """The figures of one design from its measurements."""
    return {
        "storage_growth": (m["db_bytes_after"] - m["db_bytes_before"]) / m["raw_message_bytes"],
        "history_growth": m["history_p50_ms_at_n"] / m["history_p50_ms_at_10"],
        "history_speedup": reference_history_ms_at_n / m["history_p50_ms_at_n"],
        "turn_latency_growth": m["turn_p50_ms_last"] / m["turn_p50_ms_first"],
        "postgres_vs_memory": m["turn_p50_ms_last"] / m["memory_turn_p50_ms_last"],
        "concurrency_speedup": m["throughput_concurrent_tps"] / m["throughput_single_tps"],
        "history_ms_at_n": m["history_p50_ms_at_n"],
        "turn_ms_first": m["turn_p50_ms_first"],
        "turn_ms_last": m["turn_p50_ms_last"],
        "sqlite_turn_ms_at_10": m["sqlite_turn_p50_ms_first"],
        "sqlite_turn_ms_at_n": m["sqlite_turn_p50_ms_last"],
    }


def run(server_url: str, *, quick: bool = False, turns: int | None = None) -> dict[str, Any]:
    """Measure both designs on the Postgres server of `server_url`; the report (`bench.report.build_report`).

    `turns` (>= `WINDOW`) defaults to `TURNS`, or `QUICK_TURNS` with `quick`, which also runs the smaller
    throughput figure (`QUICK_CONCURRENT_CONVERSATIONS` of `QUICK_THROUGHPUT_TURNS`). Besides the figures the
    report holds `reference_figures` (the same figures of the reference design), `measurements`
    (both designs' raw numbers), `errors` (of the concurrent conversations, per design) and `turns`.
    """
    turns = turns or (QUICK_TURNS if quick else TURNS)
    if turns < WINDOW:
        raise ValueError(f"turns must be at least {WINDOW}")
    header = report.environment(server_version(server_url), PACKAGES)
    conversations, throughput_turns = (QUICK_CONCURRENT_CONVERSATIONS, QUICK_THROUGHPUT_TURNS) if quick else (
        CONCURRENT_CONVERSATIONS, THROUGHPUT_TURNS)  # fmt: skip
    print(f"storage benchmark: {turns} turns", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-bench-") as tmp:
        reference = measure_reference(server_url, turns, Path(tmp), (conversations, throughput_turns))
        project = measure_project(server_url, turns, Path(tmp), (conversations, throughput_turns))
    ref_figures = figures_of(reference, reference["history_p50_ms_at_n"])
    our_figures = figures_of(project, reference["history_p50_ms_at_n"])
    table = figures(conversations)
    notes = {key: f"reference {table[key].fmt(value)}" for key, value in ref_figures.items()}
    errors = {"reference": reference["errors"], "project": project["errors"]}
    if project["errors"]:
        notes["concurrency_speedup"] += f"; {project['errors']} errors"
    return report.build_report(
        table,
        our_figures,
        notes=notes,
        failed={"concurrency_speedup"} if project["errors"] else set(),
        **header,
        turns=turns,
        user_message_bytes=USER_MESSAGE_BYTES,
        settings={
            "window_turns": WINDOW,
            "history_limit": HISTORY_LIMIT,
            "history_repetitions": HISTORY_REPETITIONS,
            "reference_history_repetitions_at_n": REFERENCE_HISTORY_REPETITIONS_AT_N,
            "concurrent_conversations": conversations,
            "throughput_turns": throughput_turns,
            "slow_model_ms": SLOW_MODEL_MS,
            "reference_pool": [REFERENCE_POOL_MIN, REFERENCE_POOL_MAX],
        },
        reference_figures=ref_figures,
        measurements={"reference": reference, "project": project},
        errors=errors,
        elapsed_seconds=time.perf_counter() - started,
        peak_rss_mb=report.peak_rss_mb(),
    )


def print_details(result: dict[str, Any]) -> None:
    """The lines under the table: storage in MB, throughput, in-memory turn times."""
    m_ref, m_our = result["measurements"]["reference"], result["measurements"]["project"]
    print(
        f"storage: reference {(m_ref['db_bytes_after'] - m_ref['db_bytes_before']) / 1e6:.2f} MB, "
        f"project {(m_our['db_bytes_after'] - m_our['db_bytes_before']) / 1e6:.3f} MB, "
        f"for {m_our['raw_message_bytes'] / 1e6:.3f} MB of messages ({m_our['message_count']} messages)"
    )
    print(
        f"throughput (turns/s, {SLOW_MODEL_MS} ms model): reference {m_ref['throughput_single_tps']:.1f} -> "
        f"{m_ref['throughput_concurrent_tps']:.1f}, project {m_our['throughput_single_tps']:.1f} -> "
        f"{m_our['throughput_concurrent_tps']:.1f}; errors: reference {result['errors']['reference']}, "
        f"project {result['errors']['project']}"
    )
    print(
        "in memory, turn p50 first -> last 10 turns (ms): "
        f"reference {m_ref['memory_turn_p50_ms_first']:.2f} -> {m_ref['memory_turn_p50_ms_last']:.2f}, "
        f"project {m_our['memory_turn_p50_ms_first']:.2f} -> {m_our['memory_turn_p50_ms_last']:.2f}"
    )
    print(f"peak RSS: {result['peak_rss_mb']:.0f} MB", flush=True)


def print_result(result: dict[str, Any]) -> None:
    """The table (`bench.report.print_report`) with the detail lines before the summary line."""
    report.print_report(TITLE.format(turns=result["turns"]), result, details=lambda: print_details(result))


#: The libraries whose versions the report records.
PACKAGES = (
    "timetravel-agent",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-postgres",
    "langgraph-checkpoint-sqlite",
    "psycopg",
    "psycopg-pool",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_TURNS} turns, {QUICK_CONCURRENT_CONVERSATIONS} conversations at once: a smoke test")  # fmt: skip
    parser.add_argument("--turns", type=int, help=f"turns of the measured thread (>= {WINDOW}; default {TURNS})")
    parser.add_argument("--json", type=Path, help="also write every figure and measurement to this JSON file")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("AGENT_TEST_DATABASE_URL", DEFAULT_SERVER_URL),
        help="a Postgres server URL (default: AGENT_TEST_DATABASE_URL, else the local server)",
    )
    args = parser.parse_args(argv)
    if args.turns is not None and args.turns < WINDOW:
        parser.error(f"--turns must be at least {WINDOW}")
    try:
        server_version(args.database_url)
    except (psycopg.Error, ValueError) as exc:
        print(f"error: Postgres is not reachable at --database-url: {type(exc).__name__}", file=sys.stderr)
        return 2
    result = run(args.database_url, quick=args.quick, turns=args.turns)
    print_result(result)
    if args.json is not None:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
