"""Resumable streams (`agent.runs`): what a streamed turn's stored events cost, against the turn's own text.

Usage::

    python -m bench.runs [--quick] [--json out.json] [--database-url URL]

(`scripts/bench.py` runs it with the other benchmarks.) `--quick` is 3 turns, a smoke test.

An agent of this project on a fresh scratch Postgres database (`tt_bench_runs_<hex>`, dropped at the end),
its model LangChain's `GenericFakeChatModel` answering `ANSWER_BYTES` bytes of words drawn at random from a
vocabulary (seeded; as unlike each other as a real answer's), streamed word by word and space by space (more
and smaller deltas than a real model's tokens: the worst case for the per-delta bytes), streams N turns with
OpenAI's whole event set (`apredict_stream(openai_events=True)`, what `POST /responses` streams). Figures,
summed over the turns:

* kept event bytes / turn text bytes: the event log's payloads as kept after the turns ended
  (`agent_run_events.payload`: one deflated whole-log row per turn, `agent.runs.log`) over the UTF-8 bytes
  of the turns' streamed text (the deltas joined). Target: at most 1 (no more than the turn's own text);
* the log's bytes while its turn runs (the same ops as JSON, not deflated: its rows before the
  compaction) / turn text bytes, for reference (the bound: text + `DELTA_OVERHEAD` bytes per delta + a
  few hundred bytes per turn);
* the same with Postgres's row sizes (`pg_column_size` of every row of both run tables: run rows, row
  headers and TOAST compression included);
* the stream's own bytes (the events as JSON, as sent) / turn text bytes, for reference: what storing
  the stream instead of its source would cost (each text is in it about five times);
* the time the recording adds per turn: p50 of turns streamed with it, less p50 of the same turns streamed
  with the recorder switched off (both commit their checkpoints).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from agent import create_agent
from bench import report
from agent.runs.log import decode
from bench.databases import dbname_of, scratch_database, server_version

TITLE = "resumable streams: kept event bytes vs turn text bytes, {turns} streamed turns on Postgres"
TURNS, QUICK_TURNS = 100, 3
#: The length of each answer, in bytes.
ANSWER_BYTES = 2000
#: The words answers are made of.
VOCABULARY = ("the city tram climbs past tiled houses toward a viewpoint where evening light falls on red roofs "
              "river boats harbour bakery custard tart museum azulejo castle walls fado singer narrow street "
              "market fish coffee bridge ocean breeze hill garden cathedral library station ticket").split()  # fmt: skip


def answers(seed: int) -> Iterator[AIMessage]:
    """Answers of `ANSWER_BYTES` bytes of random words, for ever (seeded: the same from run to run)."""
    rng = random.Random(seed)
    while True:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < ANSWER_BYTES:
            words.append(rng.choice(VOCABULARY))
        yield AIMessage(content=" ".join(words)[:ANSWER_BYTES])


class FakeModel(GenericFakeChatModel):
    """LangChain's fake chat model, which streams its answers; the agent's tools are offered and never called."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeModel:
        return self
ROW_BYTES_SQL = """
SELECT (SELECT coalesce(sum(pg_column_size(r.*)), 0) FROM agent_run_events r)
     + (SELECT coalesce(sum(pg_column_size(r.*)), 0) FROM agent_runs r) AS bytes
"""


def figures() -> dict[str, report.Figure]:
    ratio = report.fixed(2)
    return {
        "log_over_text": report.Figure("kept event bytes / turn text bytes", "<= 1", lambda v: v <= 1, ratio),
        "running_log_over_text": report.Figure("event log bytes while the turn runs / turn text bytes", fmt=ratio),
        "rows_over_text": report.Figure("Postgres row bytes of both run tables / turn text bytes", fmt=ratio),
        "stream_over_text": report.Figure("stream bytes as sent / turn text bytes (not stored)", fmt=ratio),
        "recording_ms_p50": report.Figure("time recording adds per turn, p50", fmt=report.fixed(1, " ms")),
    }


async def _stream(agent: Any, text: str) -> list[dict]:
    request = {"input": [{"role": "user", "content": text}]}
    return [e.model_dump(exclude_none=True) async for e in agent.apredict_stream(request, openai_events=True)]


def measure(server_url: str, turns: int) -> dict[str, Any]:
    with scratch_database(server_url, "tt_bench_runs") as url:
        agent = create_agent(url, model=FakeModel(messages=answers(7)), tracing=False)
        try:
            words = "Tell me about Lisbon."
            asyncio.run(_stream(agent, "warm up"))
            text_bytes = stream_bytes = deltas = 0
            recorded, unrecorded = [], []
            for turn in range(turns):
                started = time.perf_counter()
                events = asyncio.run(_stream(agent, f"{turn}: {words}"))
                recorded.append(time.perf_counter() - started)
                text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
                text_bytes += len(text.encode())
                deltas += sum(1 for e in events if e["type"] == "response.output_text.delta")
                stream_bytes += sum(len(json.dumps(e).encode()) for e in events)
                started = time.perf_counter()
                asyncio.run(_stream_unrecorded(agent, f"{turn}: {words}"))
                unrecorded.append(time.perf_counter() - started)
            with psycopg.connect(url, autocommit=True) as conn:
                payloads = [bytes(row[0]) for row in conn.execute("SELECT payload FROM agent_run_events").fetchall()]
                log_bytes = sum(len(p) for p in payloads)
                running_bytes = sum(len(json.dumps(decode(p, None)[0], ensure_ascii=False, separators=(",", ":")).encode()) for p in payloads)
                row_bytes = int(conn.execute(ROW_BYTES_SQL).fetchone()[0])
        finally:
            agent.close()
    return {"database": dbname_of(url), "text_bytes": text_bytes, "log_bytes": log_bytes, "running_log_bytes": running_bytes, "row_bytes": row_bytes, "stream_bytes": stream_bytes,
            "deltas": deltas, "recorded_p50_s": statistics.median(recorded), "unrecorded_p50_s": statistics.median(unrecorded)}  # fmt: skip


async def _stream_unrecorded(agent: Any, text: str) -> None:
    """The same turn with its recorder switched off (`Runs.recorder` giving none), as the baseline."""
    runs = agent.runs
    runs.recorder = lambda parsed, **kwargs: None
    try:
        await _stream(agent, text)
    finally:
        del runs.recorder


def run(server_url: str, *, quick: bool = False) -> dict[str, Any]:
    """Measure; the report (`bench.report.build_report`), with the raw `measurements`."""
    turns = QUICK_TURNS if quick else TURNS
    started = time.perf_counter()
    print(f"runs benchmark: {turns} streamed turns of {ANSWER_BYTES}-byte answers", flush=True)
    m = measure(server_url, turns)
    values = {
        "log_over_text": m["log_bytes"] / m["text_bytes"],
        "running_log_over_text": m["running_log_bytes"] / m["text_bytes"],
        "rows_over_text": m["row_bytes"] / m["text_bytes"],
        "stream_over_text": m["stream_bytes"] / m["text_bytes"],
        "recording_ms_p50": 1000 * (m["recorded_p50_s"] - m["unrecorded_p50_s"]),
    }
    return report.build_report(
        figures(), values, **report.environment(server_version(server_url)), turns=turns, measurements=m,
        elapsed_seconds=time.perf_counter() - started,
    )  # fmt: skip


def print_result(result: dict[str, Any]) -> None:
    report.print_report(TITLE.format(turns=result["turns"]), result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help=f"{QUICK_TURNS} turns: a smoke test")


if __name__ == "__main__":
    sys.exit(main())
