"""Context window benchmark: what the model is sent as a thread grows, and what a turn costs on a long thread.

Usage::

    python -m bench.context [--quick] [--json out.json] [--database-url URL]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; the run gets one scratch
database (`tt_context_<hex>`), dropped at the end whatever happens. The model
is the offline model (`agent.models.OfflineChatModel`), in process, with a
budget of `BUDGET` tokens (`max_context_tokens`); its replies quote up to ten
user messages, so a turn adds about 270 tokens and the budget is reached
within the first ten turns.

Phases (`--quick` shrinks the sizes for a smoke test; the figure keys stay):

1. **Input as the thread grows.** One thread of `turns` (500) turns per
   strategy, `trim` and `summarize`; the model input tokens each turn recorded
   (`model_input_tokens` in its checkpoint's metadata) at turn 20 and at the
   last turn, and the largest over the last 20 turns.
2. **Turn time on a long thread.** A thread of `long_messages` (10,000)
   messages, built with `update_checkpoint_state` in requests of 1,000
   messages (a request holds at most `max_input_items`), and a thread of 40
   messages (20 turns); then `timed_turns` turns on each, alternating, so both
   p50s are taken at the same moment of the machine's load. Wall time and the
   CPU time of the calling thread (`time.thread_time`), which other load on
   the machine disturbs less.

Output: the table `figure | measured | target | pass`, the machine, versions,
and `targets met: X/Y`; `--json` also saves every figure and measurement. Exit
code 0 even when targets are missed; 1 when a phase could not run; 2 when
Postgres is not reachable.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


from bench import report
from bench.databases import scratch_database, server_version

#: The budget of every agent here (`max_context_tokens`).
BUDGET = 2_000
#: The turn whose input the last one is compared with, and the window of last turns whose largest input is shown.
EARLY_TURN = 20
LAST_WINDOW = 20
#: Messages per `update_checkpoint_state` request when building the long thread (the default `max_input_items`).
BATCH = 1_000
SHORT_THREAD_TURNS = 20
WARMUP_TURNS = 3


@dataclass(frozen=True)
class Sizes:
    """How much each phase does."""

    turns: int = 500
    long_messages: int = 10_000
    timed_turns: int = 30


QUICK = Sizes(turns=EARLY_TURN + 10, long_messages=2_000, timed_turns=5)


def figures(sizes: Sizes) -> dict[str, report.Figure]:
    """The report's figures, in table order."""
    n, m = sizes.turns, f"{sizes.long_messages:,}"
    ratio, tokens, ms = report.fixed(2), report.fixed(0, " tokens"), report.fixed(2, " ms")
    return {
        "trim_input_vs_budget": report.Figure(
            f"trim: model input tokens at turn {n} / budget ({BUDGET})", "<= 1.0", lambda v: v <= 1.0, ratio
        ),
        "trim_input_growth": report.Figure(
            f"trim: model input tokens at turn {n} / at turn {EARLY_TURN}", "<= 1.1 (flat)", lambda v: v <= 1.1, ratio
        ),
        "summarize_input_vs_budget": report.Figure(
            f"summarize: largest model input over turns {n - LAST_WINDOW + 1}-{n} / budget",
            "<= 1.0",
            lambda v: v <= 1.0,
            ratio,
        ),
        "long_thread_turn_ratio": report.Figure(
            f"turn p50, thread of {m} messages / of 40 messages (offline, trim, {BUDGET})", "<= 2", lambda v: v <= 2, ratio
        ),
        "long_thread_cpu_ratio": report.Figure(f"turn CPU p50, thread of {m} messages / of 40 messages", fmt=ratio),
        "trim_input_early": report.Figure(f"trim: model input tokens at turn {EARLY_TURN}", fmt=tokens),
        "trim_input_last": report.Figure(f"trim: model input tokens at turn {n}", fmt=tokens),
        "summarize_input_early": report.Figure(f"summarize: model input tokens at turn {EARLY_TURN}", fmt=tokens),
        "summarize_input_last": report.Figure(f"summarize: model input tokens at turn {n}", fmt=tokens),
        "summarize_turns_with_summary": report.Figure(f"summarize: turns whose input had a summary, of {n}"),
        "turn_ms_short": report.Figure("turn p50, thread of 40 messages", fmt=ms),
        "turn_ms_long": report.Figure(f"turn p50, thread of {m} messages", fmt=ms),
        "turn_cpu_ms_short": report.Figure("turn CPU p50, thread of 40 messages", fmt=ms),
        "turn_cpu_ms_long": report.Figure(f"turn CPU p50, thread of {m} messages", fmt=ms),
    }


def user_message(turn: int) -> str:
    """Turn `turn`'s user message: about 100 characters, different on every turn."""
    return f"Day {turn} of my trip: a museum in the morning, lunch by the river, a show at night (plan {turn})."


def _turn(agent: Any, thread_id: str, text: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) of one turn."""
    wall, cpu = time.perf_counter(), time.thread_time()
    agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": {"thread_id": thread_id}})
    return time.perf_counter() - wall, time.thread_time() - cpu


def input_growth(database_url: str, sizes: Sizes, strategy: str) -> dict[str, Any]:
    """Phase 1 for one strategy: the model input tokens of every turn of a `sizes.turns`-turn thread."""
    from agent import create_agent

    with create_agent(database_url, model="offline", tracing=False, max_context_tokens=BUDGET,
                      context_strategy=strategy) as agent:  # fmt: skip
        thread_id = f"context-{strategy}-{uuid.uuid4().hex[:8]}"
        for n in range(1, sizes.turns + 1):
            _turn(agent, thread_id, user_message(n))
        entries = agent.get_checkpoint_history(thread_id, limit=sizes.turns + 1)
    turns = [entry for entry in reversed(entries) if entry["source"] == "loop"]
    tokens = [entry["model_input_tokens"] for entry in turns]
    return {
        "tokens": tokens,
        "early": tokens[EARLY_TURN - 1],
        "last": tokens[-1],
        "largest_last_window": max(tokens[-LAST_WINDOW:]),
        "with_summary": sum(bool(entry["summary_used"]) for entry in turns),
    }


def long_thread_turns(database_url: str, sizes: Sizes) -> dict[str, Any]:
    """Phase 2: turn times on a thread of `sizes.long_messages` messages and on one of 40, alternating."""
    from agent import create_agent

    with create_agent(database_url, model="offline", tracing=False, max_context_tokens=BUDGET) as agent:
        long_thread, short_thread = (f"context-{name}-{uuid.uuid4().hex[:8]}" for name in ("long", "short"))
        _turn(agent, long_thread, user_message(0))
        for start in range(0, sizes.long_messages - 2, BATCH):
            count = min(BATCH, sizes.long_messages - 2 - start)
            items = [
                {"role": "user" if (start + i) % 2 == 0 else "assistant", "content": user_message(start + i)}
                for i in range(count)
            ]
            agent.update_checkpoint_state(long_thread, None, items)
        for n in range(1, SHORT_THREAD_TURNS + 1):
            _turn(agent, short_thread, user_message(n))
        for n in range(WARMUP_TURNS):
            _turn(agent, long_thread, user_message(n))
            _turn(agent, short_thread, user_message(n))
        short, long = [], []
        for n in range(sizes.timed_turns):
            short.append(_turn(agent, short_thread, user_message(n)))
            long.append(_turn(agent, long_thread, user_message(n)))
        long_messages = agent.get_checkpoint_history(long_thread, limit=1)[0]["message_count"]
    return {
        "turn_ms_short": _p50_ms([wall for wall, _ in short]),
        "turn_ms_long": _p50_ms([wall for wall, _ in long]),
        "turn_cpu_ms_short": _p50_ms([cpu for _, cpu in short]),
        "turn_cpu_ms_long": _p50_ms([cpu for _, cpu in long]),
        "long_thread_messages_at_end": long_messages,
    }


def _p50_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000.0


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run every phase on a scratch database of the Postgres server at `server_url`; returns the report.

    Raises:
        psycopg.Error: the server is not reachable.
    """
    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    values: dict[str, Any] = {}
    measurements: dict[str, Any] = {}
    broken: list[str] = []
    with scratch_database(server_url, "tt_context") as database_url:
        phases: dict[str, Callable[[], dict[str, Any]]] = {
            "trim": lambda: input_growth(database_url, sizes, "trim"),
            "summarize": lambda: input_growth(database_url, sizes, "summarize"),
            "long thread": lambda: long_thread_turns(database_url, sizes),
        }
        for name, phase in phases.items():
            try:
                measurements[name] = phase()
            except Exception:  # noqa: BLE001 - report the other phases; the traceback goes to stderr
                traceback.print_exc()
                broken.append(name)
    if "trim" in measurements:
        trim = measurements["trim"]
        values |= {
            "trim_input_vs_budget": trim["last"] / BUDGET,
            "trim_input_growth": trim["last"] / trim["early"],
            "trim_input_early": trim["early"],
            "trim_input_last": trim["last"],
        }
    if "summarize" in measurements:
        summarize = measurements["summarize"]
        values |= {
            "summarize_input_vs_budget": summarize["largest_last_window"] / BUDGET,
            "summarize_input_early": summarize["early"],
            "summarize_input_last": summarize["last"],
            "summarize_turns_with_summary": summarize["with_summary"],
        }
    if "long thread" in measurements:
        long = measurements["long thread"]
        values |= {key: long[key] for key in ("turn_ms_short", "turn_ms_long", "turn_cpu_ms_short", "turn_cpu_ms_long")}
        values["long_thread_turn_ratio"] = long["turn_ms_long"] / long["turn_ms_short"]
        values["long_thread_cpu_ratio"] = long["turn_cpu_ms_long"] / long["turn_cpu_ms_short"]
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes), "budget": BUDGET, "batch": BATCH},
        measurements=measurements,
        broken_phases=broken,
        elapsed_seconds=time.perf_counter() - started,
        peak_rss_mb=report.peak_rss_mb(),
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    report.print_report(f"context window: offline model, max_context_tokens={BUDGET}", result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="every phase at a reduced size (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())
