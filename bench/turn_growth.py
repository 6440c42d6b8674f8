"""In-process turn time as a thread grows, tracing on or off: one figure of the load benchmark.

    python -m bench.turn_growth --database-url URL --turns 200 --tracing on

Prints one JSON object on its last line: the p50 (ms) of the first `WINDOW`
turns of a thread and of the last `WINDOW` turns of a thread of `--turns`
turns, and their ratio. The agent is `create_agent(url, model="offline",
tracing=...)` driven with `predict`, as a Python user would.

It runs as its own process because MLflow's tracing switch and sampling ratio
are global to a process: a run with tracing on must not leave its
hooks in a process that then measures tracing off. Traces go where
`MLFLOW_TRACKING_URI` says (the load benchmark points it at a temporary file).
(The load benchmark's quick run, a smoke test, calls `measure` in its own
process instead, tracing off first: `bench.load.Sizes.growth_in_process`.)

Fairness, as `scripts/bench.py` does it: after a warm-up thread, the last
`WINDOW` turns of the long thread alternate with the first `WINDOW` turns of a
new thread, so the two p50s compared are taken at the same moment of the
machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

#: Turns in each window compared: the first and the last `WINDOW` turns. Forty, not ten: with tracing on,
#: a sampled turn's trace is exported by MLflow's async logging thread, which takes the GIL for 20 to 30 ms of
#: CPU, so over ten turns the p50 moved with one export more or less. Three runs of 200 turns with a window of
#: ten, the same code on an idle machine, gave 1.23, 1.03 and 1.11, and a full benchmark run 1.48
#: (2026-12-06); `bench.turn_cost` widened its window for the same reason.
WINDOW = 40
WARMUP_TURNS = 3


def user_message(turn: int) -> str:
    """Turn `turn`'s user message: about 100 characters, different on every turn."""
    return f"Day {turn} of my trip: a museum in the morning, lunch by the river, a show at night (plan {turn})."


def measure(database_url: str, turns: int, tracing: bool) -> dict[str, Any]:
    """Time every turn of a `turns`-turn thread, and of a new thread beside its last turns (module docstring)."""
    from agent import create_agent

    with create_agent(database_url, model="offline", tracing=tracing) as agent:

        def turn(thread_id: str, text: str) -> float:
            start = time.perf_counter()
            agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": {"thread_id": thread_id}})
            return time.perf_counter() - start

        warmup = f"growth-warmup-{uuid.uuid4()}"
        for n in range(1, WARMUP_TURNS + 1):
            turn(warmup, user_message(n))
        long_thread, fresh_thread = f"growth-long-{uuid.uuid4()}", f"growth-fresh-{uuid.uuid4()}"
        times, fresh_times = [], []
        for n in range(1, turns + 1):
            early = n - (turns - WINDOW)  # 1..WINDOW during the last WINDOW turns
            if early >= 1:
                fresh_times.append(turn(fresh_thread, user_message(early)))
            times.append(turn(long_thread, user_message(n)))
    first, last = _p50_ms(fresh_times), _p50_ms(times[-WINDOW:])
    return {
        "turns": turns,
        "tracing": tracing,
        "turn_p50_ms_first_of_thread": _p50_ms(times[:WINDOW]),
        "turn_p50_ms_first": first,
        "turn_p50_ms_last": last,
        "growth": last / first,
    }


def _p50_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", required=True, help="the agent's database: postgresql://, sqlite:///, memory://"
    )
    parser.add_argument("--turns", type=int, default=200, help=f"turns of the long thread (>= {WINDOW})")
    parser.add_argument("--tracing", choices=["on", "off"], required=True)
    args = parser.parse_args(argv)
    if args.turns < WINDOW:
        parser.error(f"--turns must be at least {WINDOW}")
    print(json.dumps(measure(args.database_url, args.turns, args.tracing == "on")), flush=True)


if __name__ == "__main__":
    main()
