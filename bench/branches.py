"""Branch benchmark: reading a checkpoint's state, listing branches and forking on a long thread with branches.

Usage::

    python -m bench.branches [--quick] [--json out.json] [--database-url URL]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; the run uses one scratch
database (`tt_branches_<hex>`), dropped at the end whatever happens. The agent
runs in this process (`create_agent(url, model="offline", tracing=False)`): the
figures are the storage and tree work of each operation, not a model's.

Two threads of the same `turns` (200) turns, user messages of `USER_MESSAGE_BYTES`
bytes drawn from a vocabulary:

* **plain**: the turns in a row;
* **branched**: the same turns, then `branches` (20) branches, each an edit of a user
  message at evenly spaced positions (`edit_message_id`, a sibling branch) followed
  by `BRANCH_TURNS` more turns; then `set_head` back to the end of the 200 turns, so
  both heads hold the same 400 messages.

Figures (p50 over `samples` calls, the two threads' calls interleaved so a busy
moment of the machine hits both alike; the message cache is warm, as on a server
that has seen the thread):

1. `get_checkpoint_state` at the head of each thread, and their ratio (the issue's
   target: branched <= 1.5 x plain; reading one checkpoint must not load the tree);
2. `list_branches` on the branched thread;
3. `fork_thread` of the branched thread's head (a new thread of the 201-checkpoint
   chain, written in one transaction), p50 over `forks` forks;
4. for reference: `get_checkpoint_state` at the branched head with the message cache
   cleared before each call (messages rebuilt from the stored deltas), and the
   fork's stored bytes over the plain thread's (both hold the same chain);
5. the bytes a branching client fetches per action on a third thread of
   `render_turns` (50) turns (`render_bytes`): before, the action's answer and then
   a whole `get_checkpoint_state` to redraw; after, the answer with
   `custom_inputs.include = ["state"]` (`agent.operations.render`), which carries
   the changed messages with their places and alternatives. The actions: a turn,
   an edit of the middle user message, a regeneration of the last answer, and a
   switch back to the original branch (`set_head`). JSON bytes of the answer
   bodies, uncompressed (the server gzips them for clients that accept it).

Output: a table `figure | measured | target | pass`, the machine, versions, and
`targets met: X/Y`; `--json` also saves every figure and measurement. Exit code
0 even when the target is missed; 1 when the benchmark failed; 2 when Postgres
cannot be reached.
"""

from __future__ import annotations

import gzip
import json
import random
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

#: Bytes of each user message (ASCII words from `VOCABULARY`).
USER_MESSAGE_BYTES = 200
#: Turns on each branch after its edit.
BRANCH_TURNS = 2
VOCABULARY = "trip city museum train hotel dinner flight ticket beach river market bridge castle garden".split()
#: The issue's target for get_checkpoint_state, branched over plain.
STATE_RATIO_TARGET = 1.5


@dataclass(frozen=True)
class Sizes:
    turns: int = 200
    branches: int = 20
    samples: int = 60
    forks: int = 10
    render_turns: int = 50


QUICK = Sizes(turns=12, branches=3, samples=5, forks=2, render_turns=6)

#: The actions `render_bytes` measures, in table order.
RENDER_ACTIONS = ("turn", "edit", "regenerate", "switch")


def figures(sizes: Sizes) -> dict[str, report.Figure]:
    """Every figure of the report, in table order: the target first, then reference figures."""
    ms = report.fixed(2, " ms")
    shape = f"{sizes.turns}-turn thread"
    return {
        "state_ratio": report.Figure(
            f"get_checkpoint_state at the head p50, {sizes.branches} branches / none",
            f"<= {STATE_RATIO_TARGET:g}",
            lambda v: v <= STATE_RATIO_TARGET,
            report.fixed(2),
        ),
        "state_plain_ms": report.Figure(f"get_checkpoint_state at the head p50, {shape} without branches", fmt=ms),
        "state_branched_ms": report.Figure(
            f"get_checkpoint_state at the head p50, {shape} with {sizes.branches} branches", fmt=ms
        ),
        "list_branches_ms": report.Figure(f"list_branches p50, {shape} with {sizes.branches} branches", fmt=ms),
        "fork_ms": report.Figure(f"fork_thread of the head p50, {shape} with {sizes.branches} branches", fmt=ms),
        "state_cold_ms": report.Figure("get_checkpoint_state at the head p50, message cache cleared", fmt=ms),
        "fork_storage_ratio": report.Figure(
            f"stored bytes of a fork of the {sizes.turns}-turn chain / the plain thread", fmt=report.fixed(2)
        ),
        **{
            f"render_{action}_{when}_kb": report.Figure(
                f"kB a client fetches per {action}, {sizes.render_turns}-turn thread, "
                + ("answer + get_checkpoint_state" if when == "before" else 'answer with include ["state"]'),
                fmt=report.fixed(1, " kB"),
            )
            for action in RENDER_ACTIONS
            for when in ("before", "after")
        },
        "render_state_kb": report.Figure(
            f"get_checkpoint_state at the head, {sizes.render_turns}-turn thread", fmt=report.fixed(1, " kB")
        ),
        "render_state_gzip_kb": report.Figure(
            f"get_checkpoint_state at the head, {sizes.render_turns}-turn thread, gzip", fmt=report.fixed(1, " kB")
        ),
    }


def user_message(rng: random.Random, n: int) -> str:
    text = f"turn {n}:"
    while len(text) < USER_MESSAGE_BYTES:
        text += " " + rng.choice(VOCABULARY)
    return text[:USER_MESSAGE_BYTES]


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class BranchBenchmark:
    """Builds the two threads on one agent and measures the operations."""

    def __init__(self, agent: Any, database_url: str, sizes: Sizes) -> None:
        self.agent = agent
        self.database_url = database_url
        self.sizes = sizes
        self.rng = random.Random(7)

    def say(self, text: str, **custom_inputs: Any) -> dict:
        return self.agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom_inputs}).custom_outputs

    def build(self) -> dict[str, Any]:
        texts = [user_message(self.rng, n) for n in range(self.sizes.turns)]
        plain = self.say(texts[0])["thread_id"]
        branched = self.say(texts[0])["thread_id"]
        for text in texts[1:]:
            self.say(text, thread_id=plain)
            self.say(text, thread_id=branched)
        main_head = self.agent.storage.get_thread(branched).head_checkpoint_id
        users = [item for item in self.agent.get_checkpoint_state(branched)["messages"] if item["role"] == "user"]
        step = max(1, len(users) // self.sizes.branches)
        for k in range(self.sizes.branches):
            target = users[(k * step) % len(users)]
            self.say(f"edited {k}: " + texts[k % len(texts)], thread_id=branched, checkpoint_id=main_head,
                     edit_message_id=target["id"])  # fmt: skip
            for t in range(BRANCH_TURNS):
                self.say(f"branch {k} turn {t}", thread_id=branched)
        self.agent.set_head(branched, main_head)
        return {"plain": plain, "branched": branched, "checkpoints": len(self.agent.get_checkpoint_history(branched, limit=1000))}

    def measure(self, threads: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
        agent, plain, branched = self.agent, threads["plain"], threads["branched"]
        for thread_id in (plain, branched):  # warm-up: caches, plans, connections
            agent.get_checkpoint_state(thread_id)
            agent.list_branches(thread_id)
        state_plain, state_branched, listed, cold = [], [], [], []
        for _ in range(self.sizes.samples):
            state_plain.append(timed(lambda: agent.get_checkpoint_state(plain)))
            state_branched.append(timed(lambda: agent.get_checkpoint_state(branched)))
            listed.append(timed(lambda: agent.list_branches(branched)))
        for _ in range(max(3, self.sizes.samples // 10)):
            agent.storage.saver.message_cache.clear()
            cold.append(timed(lambda: agent.get_checkpoint_state(branched)))
        forks, fork_ids = [], []
        for _ in range(self.sizes.forks):
            started = time.perf_counter()
            fork_ids.append(agent.fork_thread(branched)["thread_id"])
            forks.append(time.perf_counter() - started)
        values = {
            "state_plain_ms": p50_ms(state_plain),
            "state_branched_ms": p50_ms(state_branched),
            "list_branches_ms": p50_ms(listed),
            "fork_ms": p50_ms(forks),
            "state_cold_ms": p50_ms(cold),
            "fork_storage_ratio": self.stored_bytes(fork_ids[0]) / self.stored_bytes(plain),
        }
        values["state_ratio"] = values["state_branched_ms"] / values["state_plain_ms"]
        samples = {"state_plain_s": state_plain, "state_branched_s": state_branched, "list_branches_s": listed,
                   "fork_s": forks, "state_cold_s": cold}  # fmt: skip
        return values, samples

    def render_bytes(self) -> dict[str, float]:
        """kB per action before and after `include: ["state"]` on a new thread of `render_turns` turns (module docstring)."""
        agent = self.agent

        def answer(text: str | None, **custom_inputs: Any) -> tuple[dict, int]:
            items = [] if text is None else [{"role": "user", "content": text}]
            response = agent.predict({"input": items, "custom_inputs": custom_inputs})
            return response.custom_outputs, len(body(response.model_dump(exclude_none=True)))

        def state_bytes(thread_id: str) -> int:
            return answer(None, action="get_checkpoint_state", thread_id=thread_id)[1]

        texts = [user_message(self.rng, n) for n in range(self.sizes.render_turns)]
        thread_id = answer(texts[0])[0]["thread_id"]
        for text in texts[1:]:
            answer(text, thread_id=thread_id)
        whole = agent.get_checkpoint_state(thread_id)
        middle = [item for item in whole["messages"] if item.get("role") == "user"][len(texts) // 2]
        values: dict[str, float] = {"render_state_kb": len(body(whole)) / 1000,
                                    "render_state_gzip_kb": len(gzip.compress(body(whole))) / 1000}  # fmt: skip
        actions = {
            "turn": lambda **include: answer("And then?", thread_id=thread_id, **include),
            "edit": lambda **include: answer("edited: " + texts[0], thread_id=thread_id, edit_message_id=middle["id"], **include),
            "regenerate": lambda **include: answer(None, thread_id=thread_id, regenerate=True, **include),
        }
        for action in RENDER_ACTIONS:
            head = agent.storage.get_thread(thread_id).head_checkpoint_id
            if action == "switch":  # from the edit's branch back to the original one, whose head is `original`
                values["render_switch_before_kb"] = (
                    answer(None, action="set_head", thread_id=thread_id, checkpoint_id=original)[1] + state_bytes(thread_id)
                ) / 1000
                agent.set_head(thread_id, head)
                moved = answer(None, action="set_head", thread_id=thread_id, checkpoint_id=original, include=["state"])
                values["render_switch_after_kb"] = moved[1] / 1000
                continue
            if action == "edit":
                original = head
            values[f"render_{action}_before_kb"] = (actions[action]()[1] + state_bytes(thread_id)) / 1000
            agent.set_head(thread_id, head)  # the same action again, from the same place
            values[f"render_{action}_after_kb"] = actions[action](include=["state"])[1] / 1000
        return values

    def stored_bytes(self, thread_id: str) -> int:
        """Bytes of the thread's checkpoint rows (the messages they hold too) and blobs (TOAST included)."""
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)"
                " + coalesce(pg_column_size(agent_messages), 0)), 0) FROM checkpoints "
                "WHERE thread_id = %s",
                (thread_id,),
            ).fetchone()[0]
            blobs = conn.execute(
                "SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %s", (thread_id,)
            ).fetchone()[0]
        return rows + blobs


def body(value: Any) -> bytes:
    """`value` as the server's JSON answer body (compact, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run the benchmark on a scratch database of the Postgres server at `server_url`; return the report.

    The report is `bench.report.build_report`'s, with `settings`, `measurements`
    (every sample, in seconds), `threads` (ids and the branched thread's checkpoint
    count) and `error` (None, or the failure's traceback; its figures are then None).
    """
    from agent import create_agent

    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    values: dict[str, float] = {}
    samples: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    error = None
    try:
        with scratch_database(server_url, "tt_branches") as url, create_agent(url, model="offline", tracing=False) as agent:
            bench = BranchBenchmark(agent, url, sizes)
            threads = bench.build()
            values, samples = bench.measure(threads)
            values.update(bench.render_bytes())
    except Exception:  # noqa: BLE001 - reported: the figures say "not measured"
        error = traceback.format_exc()
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes), "user_message_bytes": USER_MESSAGE_BYTES,
                  "branch_turns": BRANCH_TURNS},  # fmt: skip
        threads=threads,
        measurements=samples,
        error=error,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    sizes = result["settings"]["sizes"]
    report.print_report(
        f"Branch operations on a {sizes['turns']}-turn thread with {sizes['branches']} branches (Postgres, in-process)",
        result,
    )


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="a small thread and few samples (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())
