"""Every benchmark part keeps working: each runs end to end at its quick size, and what it reports is checked.

The checks are of correctness, never of time: figures are the benchmark's verdict on the code, not a
test of the benchmark. One table, `PARTS`, names each part, how it is started and what is specific
to it; what every part must do (exit 0, report every figure it declares, print the
`targets met: X/Y` line, name no phase that could not run) is checked once, in
`test_quick_bench_part_runs_and_reports_every_figure`. The storage part runs through the runner,
`scripts/bench.py --only storage`, so the runner's own summary is checked on a real report; the
others run alone, `python -m bench.<name> --quick`, as their docstrings say they can. Each runs in a
process forked from the preloaded interpreter (`tests.helpers.preloaded.run_source`, the module or
script by `runpy`), not a new interpreter: what a part measures of new processes, it starts itself.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import runpy
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from bench import (
    branches,
    catalogue,
    context,
    encryption,
    export,
    load,
    memory,
    memory_eval,
    report,
    runs,
    search,
    startup,
    storage,
    streams,
    turn_cost,
    users,
    web,
)
from tests.helpers import REPO_ROOT
from tests.helpers.preloaded import run_source
from tests.helpers.offline import AGENT_TOOL_SCHEMAS, offline_reply

RUNNER = REPO_ROOT / "scripts" / "bench.py"


@dataclass(frozen=True)
class Run:
    """One quick run of a part: the process, the JSON it wrote, and the part's own report in it."""

    done: subprocess.CompletedProcess
    output: dict[str, Any]
    """The JSON file as written: the part's report, or the runner's `{"parts": ..., totals}`."""
    report: dict[str, Any]
    server_url: str
    before: frozenset[str] = frozenset()
    """The server's databases before the run: a database another run left (killed) is not this run's."""


@dataclass(frozen=True)
class Part:
    """A benchmark part: how to start it at its quick size, and what only it must report."""

    name: str
    figures: Callable[[], Mapping[str, report.Figure]]
    """The figures the part declares at its quick size, in table order."""
    check: Callable[[Run], None]
    timeout: float = 600
    via_runner: bool = False
    """Run as `scripts/bench.py --only NAME` (the report sits under `parts`), else `python -m bench.NAME`."""
    takes_database: bool = True
    """Whether the part accepts `--database-url` (start-up needs no server)."""
    may_be_unmeasured: frozenset[str] = frozenset()
    """Figures that may be None in a quick run (what this machine cannot measure)."""

    def source(self) -> str:
        """What the part's process runs: `python scripts/bench.py` or `python -m bench.NAME`, as source."""
        if self.via_runner:
            return f"import runpy; runpy.run_path({str(RUNNER)!r}, run_name='__main__')"
        return f"import runpy; runpy.run_module('bench.{self.name}', run_name='__main__', alter_sys=True)"

    def arguments(self, out: Path, server_url: str) -> list[str]:
        arguments = ["--quick", *(["--only", self.name] if self.via_runner else []), "--json", str(out)]
        return arguments + (["--database-url", server_url] if self.takes_database else [])


def databases_left(server_url: str, *, names: list[str] | None = None, like: str | None = None) -> list[tuple]:
    """Databases of the server with one of `names`, or whose name matches the LIKE pattern `like`."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        if names is not None:
            return conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)).fetchall()
        return conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like,)).fetchall()


def left_by(run: Run, *, like: str) -> list[str]:
    """The databases matching `like` that this run made and left (not those that were there before it)."""
    return [name for (name,) in databases_left(run.server_url, like=like) if name not in run.before]


# -- what is specific to each part ---------------------------------------------------------------


def _expected_raw_bytes(turns: int, tools) -> int:
    # Each turn holds the user message and the offline model's reply, which quotes the user
    # messages so far and says what it received (see OfflineChatModel): the whole thread, with the
    # schemas of the tools bound to it (the agent binds its tools, the reference design none).
    history = []
    for turn in range(1, turns + 1):
        history.append(HumanMessage(storage.user_message(turn)))
        history.append(AIMessage(offline_reply(history, tools=tools)))
    return sum(len(m.text.encode("utf-8")) for m in history)


def check_storage(run: Run) -> None:
    done, result, runner = run.done, run.report, run.output
    # The runner: the part's figures in its table, its summary and the totals over the one part.
    for row in result["figures"].values():
        assert row["figure"] in done.stdout
    assert runner["broken_parts"] == [] and list(runner["parts"]) == ["storage"]
    assert f"all parts: targets met: {runner['targets_met']}/{runner['targets_total']}" in done.stdout
    assert runner["targets_total"] == result["targets_total"]
    # Every figure for both designs, as positive finite numbers.
    for key, row in result["figures"].items():
        for value in (row["measured"], result["reference_figures"][key]):
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)
        assert row["note"].startswith("reference ")
    targeted = [row for row in result["figures"].values() if row["target"]]
    assert result["targets_total"] == len(targeted) == 6
    assert result["targets_met"] == sum(row["pass"] is True for row in targeted)
    assert all(isinstance(row["pass"], bool) for row in targeted)
    assert result["turns"] == storage.QUICK_TURNS
    assert result["peak_rss_mb"] > 0
    assert {"langgraph", "langgraph-checkpoint-postgres", "psycopg"} <= set(result["versions"])
    assert result["machine"]["cpu_count"] >= 1
    # The concurrent conversations had no errors.
    assert result["errors"] == {"reference": 0, "project": 0}
    # Exactly the bytes the thread holds: the N-turn thread, plus the thread whose first WINDOW
    # turns were timed beside its last ones.
    for design, tools in (("reference", ()), ("project", AGENT_TOOL_SCHEMAS)):
        expected = _expected_raw_bytes(storage.QUICK_TURNS, tools) + _expected_raw_bytes(storage.WINDOW, tools)
        measured = result["measurements"][design]
        assert measured["message_count"] == 2 * storage.QUICK_TURNS
        assert measured["raw_message_bytes"] == expected
        assert measured["db_bytes_after"] > measured["db_bytes_before"] > 0
    # Its scratch databases are dropped.
    names = [result["measurements"][design]["database"] for design in ("reference", "project")]
    assert names[0].startswith("tt_bench_ref_") and names[1].startswith("tt_bench_ours_")
    assert databases_left(run.server_url, names=names) == []


def check_turn_cost(run: Run) -> None:
    result = run.report
    assert result["turns"] == turn_cost.QUICK_TURNS and result["targets_total"] == 2 * len(turn_cost.MESSAGE_SIZES) + 2
    storage_found = result["measurements"]["storage"]
    for backend in ("postgres", "sqlite"):
        for label in turn_cost.MESSAGE_SIZES:
            ours, ref = storage_found[f"project_{backend}_{label}"], storage_found[f"reference_{backend}_{label}"]
            assert ours["message_bytes"] > turn_cost.QUICK_TURNS * turn_cost.MESSAGE_SIZES[label] < ref["message_bytes"]
            assert result["figures"][f"fixed_{backend}_{label}"]["measured"] == (
                (ours["bytes"] - ours["message_bytes"]) / turn_cost.QUICK_TURNS
            )
    latency = result["measurements"]["latency"]
    assert latency["tracing_on"]["tracing"] is True and latency["tracing_off"]["tracing"] is False
    assert all(len(latency[mode]["ratios"]) == turn_cost.QUICK_ROUNDS for mode in latency)
    # Every Postgres turn's waits for the server were timed (the claim's and the commit's round trips), and
    # are a part of its wall time, not all of it.
    for mode in latency:
        for found in latency[mode]["rounds"]:
            assert 0 < found["round_trips"] < found["postgres"]
            assert found["postgres_less_round_trips"] < found["postgres"]
    assert left_by(run, like="tt_bench_cost_%") == []


def check_streams(run: Run) -> None:
    result = run.report
    assert result["streams"] == streams.QUICK_STREAMS and result["targets_total"] == 3
    found = result["measurements"]
    # No stream is lost: each of the 2 x QUICK_STREAMS streams at once ended with its checkpoint id and no error
    # event, and that checkpoint is its thread's head in the database (the turn was saved).
    assert [found[phase]["requests"] for phase in ("zero_model", "slow_model")] == [streams.QUICK_STREAMS] * 2
    assert found["zero_model"]["errors"] == found["slow_model"]["errors"] == 0
    assert found["saved_heads"] == 2 * streams.QUICK_STREAMS and result["figures"]["lost"]["measured"] == 0
    assert found["rss_peak_bytes"] >= found["rss_idle_bytes"] > 0 and found["cpu_seconds"] > 0
    assert databases_left(run.server_url, names=[result["database"]]) == []


def check_users(run: Run) -> None:
    result = run.report
    assert result["users"] == users.QUICK_USERS and result["targets_total"] == 5
    found = result["measurements"]
    # Every user's turn was answered: streamed to its checkpoint, or refused with 429 and Retry-After.
    assert found["turns"]["requests"] == users.QUICK_USERS and found["errors"] == 0
    assert found["turns"]["errors"] == found["refused"]
    # /health and the other user's history were read during the burst, and connections were sampled.
    assert found["health"]["requests"] > 0 and found["health"]["errors"] == 0 and found["health"]["p99_s"] > 0
    assert found["history"]["requests"] > 0 and found["history"]["errors"] == 0
    assert found["connection_samples"] > 0 and 0 < found["peak_connections"]
    assert result["settings"]["pool_max_size"] == users.POOL_MAX_SIZE
    assert databases_left(run.server_url, names=[result["database"]]) == []


def check_branches(run: Run) -> None:
    result = run.report
    assert result["error"] is None
    assert result["targets_total"] == 1
    assert result["threads"]["checkpoints"] == (
        1 + branches.QUICK.turns + branches.QUICK.branches * (1 + branches.BRANCH_TURNS)
    )
    measured = {key: figure["measured"] for key, figure in result["figures"].items()}
    for action in branches.RENDER_ACTIONS:  # include: ["state"] saves the second request's bytes
        assert measured[f"render_{action}_after_kb"] < measured[f"render_{action}_before_kb"]
    assert left_by(run, like="tt_branches_%") == []


def check_export(run: Run) -> None:
    result = run.report
    assert result["error"] is None  # the round trip read back the same, or the run would have failed
    assert result["targets_total"] == 2
    measured = result["measurements"]
    # The figures are what they say: bytes of the documents over bytes of their distinct messages.
    assert measured["own_message_bytes"] < measured["document_bytes"]
    assert result["figures"]["document_ratio"]["measured"] == measured["document_bytes"] / measured["own_message_bytes"]
    assert measured["checkpoints"] == 1 + export.QUICK.turns + export.QUICK.branches * (1 + export.BRANCH_TURNS)
    assert left_by(run, like="tt_export_%") == []


def check_search(run: Run) -> None:
    result = run.report
    assert result["error"] is None and result["targets_total"] == 2
    rows = result["figures"]
    # The index's ratio to the text is its bytes per message over the text per message (at the quick size
    # the index may not have grown by a page: its growth is measured, after minus before).
    for prefix in ("pg", "sqlite"):
        per_message = rows[f"{prefix}_bytes_per_message"]["measured"]
        assert per_message >= 0
        assert rows[f"{prefix}_ratio"]["measured"] == pytest.approx(per_message / rows["pg_text_per_message"]["measured"])
    assert left_by(run, like="tt_search_%") == []


def check_catalogue(run: Run) -> None:
    result = run.report
    assert result["error"] is None
    assert result["targets_total"] == 1
    assert result["threads"]["large"] == catalogue.QUICK.large and result["threads"]["small"] == catalogue.QUICK.small
    assert left_by(run, like="tt_catalogue_%") == []


def check_context(run: Run) -> None:
    result = run.report
    assert result["broken_phases"] == []
    targeted = [key for key, figure in context.figures(context.QUICK).items() if figure.check is not None]
    assert result["targets_total"] == len(targeted) == 4
    assert result["measurements"]["long thread"]["long_thread_messages_at_end"] >= context.QUICK.long_messages
    assert len(result["measurements"]["trim"]["tokens"]) == context.QUICK.turns


def check_memory(run: Run) -> None:
    result = run.report
    assert result["broken_configurations"] == []
    measured = result["measurements"]
    # Measured with pgvector, or (on a server that cannot create it) not measured, saying why.
    pgvector = "skipped" not in measured["postgres_pgvector"]
    if not pgvector:
        assert measured["postgres_pgvector"]["skipped"].startswith("CREATE EXTENSION vector failed")
    # Its figures are "not measured" exactly when it was skipped (the generic test allows them to be).
    unmeasured = {key for key in MEMORY_PGVECTOR_FIGURES if result["figures"][key]["measured"] is None}
    assert unmeasured == (set() if pgvector else MEMORY_PGVECTOR_FIGURES)
    configurations = [name for name in memory.CONFIGURATIONS if pgvector or name != "postgres_pgvector"]
    assert {name: measured[name]["search"] for name in configurations} == {
        "sqlite_keyword": "keyword", "sqlite_semantic": "semantic", "postgres_keyword": "keyword",
        "postgres_semantic": "semantic", **({"postgres_pgvector": "semantic, pgvector"} if pgvector else {}),
    }  # fmt: skip
    # The turns with a user_id were given memories: the figure measures retrieval, not an empty search.
    assert all(measured[name]["turns_given_memories"] > 0 for name in configurations)
    # Semantic turns called the embeddings model, and the call is a part of the turn.
    for name in (name for name in configurations if name in memory.SEMANTIC):
        assert 0 < measured[name]["embedding_ms"] < measured[name]["with_ms"]
        assert 0 < measured[name]["ratio_beside_embedding"] <= measured[name]["ratio"]


def check_memory_eval(run: Run) -> None:
    result = run.report
    assert result["broken_configurations"] == []
    sqlite, postgres = (result["measurements"][name]["questions"] for name in memory_eval.BACKENDS)
    # Every question was asked, and both backends recalled and answered alike (the offline model is deterministic).
    assert len(sqlite) == result["sizes"]["questions"] and sqlite == postgres
    assert {question["kind"] for question in sqlite} == set(memory_eval.TYPES)
    # The branch rule and supersession held: nothing from an abandoned branch, no superseded version.
    assert all(question["leaks"] == [] for question in sqlite)


def check_encryption(run: Run) -> None:
    result, m = run.report, run.report["measurements"]
    assert result["targets_total"] == 1 and result["turns"] == encryption.QUICK_TURNS
    # The same thread on both databases: the same message bytes; sealing costs bytes, never saves them.
    assert m["plain"]["raw_message_bytes"] == m["sealed"]["raw_message_bytes"] > 0
    assert all(m[name]["value_bytes_after"] > m[name]["value_bytes_before"] > 0 for name in ("plain", "sealed"))
    assert databases_left(run.server_url, names=list(m["databases"].values())) == []


def check_runs(run: Run) -> None:
    result, m = run.report, run.report["measurements"]
    assert result["targets_total"] == 1 and result["turns"] == runs.QUICK_TURNS
    # Every turn streamed its text and kept a log; what was sent is many times what is kept.
    assert m["text_bytes"] >= runs.QUICK_TURNS * runs.ANSWER_BYTES * 0.9 and m["log_bytes"] > 0
    assert m["stream_bytes"] > m["running_log_bytes"] > m["log_bytes"]
    assert databases_left(run.server_url, names=[m["database"]]) == []


def check_startup(run: Run) -> None:
    # Nothing beyond what every part reports: start-up writes nothing and needs no server.
    del run


def check_web(run: Run) -> None:
    result = run.report
    measured = result["measurements"]
    # The quick thread: 20 turns and 2 branches after the root, every checkpoint drawn in the tree.
    assert measured["checkpoints"] == 1 + web.QUICK.turns + web.QUICK.branches
    assert 0 < result["figures"]["api_bytes"]["measured"] < result["figures"]["all_bytes"]["measured"]
    ratio = result["figures"]["api_bytes"]["measured"] / result["figures"]["message_bytes"]["measured"]
    assert math.isclose(result["figures"]["api_ratio"]["measured"], ratio)


def check_load(run: Run) -> None:
    done, result = run.done, run.report
    assert result["broken_phases"] == []
    for column in ("figure", "measured", "target", "pass"):
        assert column in done.stdout
    expected = load.figures(load.QUICK)
    targeted = [key for key, figure in expected.items() if figure.check is not None]
    assert result["targets_total"] == len(targeted) == 12
    assert result["targets_met"] == sum(result["figures"][key]["pass"] is True for key in targeted)
    assert result["settings"]["sizes"]["conversations"] == load.QUICK.conversations
    # The quick run's phases share their servers, one per setting, on one database (`load.Sizes.shared_servers`):
    # a phase that started its own again would add minutes to the suite, as it did.
    assert result["servers_started"] == ["serve", "untraced", "traced_local", "workers-2"]
    created = result["scratch_databases"]
    assert len(created) == 4 and all(name.startswith("tt_load_") for name in created)  # shared, in-process, 2 growth
    # Only this run's: other runs on the same server may have theirs in flight.
    assert databases_left(run.server_url, names=created) == []


MEMORY_PGVECTOR_FIGURES = frozenset(key for key in memory.figures() if key.startswith("postgres_pgvector_"))

# Longest first (xdist hands the tests out in this order, see tests/helpers/scheduling.py).
PARTS = [
    # The workers figures only where `tt-agent serve` has --workers.
    Part("load", lambda: load.figures(load.QUICK), check_load, timeout=900,
         may_be_unmeasured=frozenset({"workers_speedup", "workers_1_turns_per_s", "workers_2_turns_per_s"})),
    Part("startup", lambda: startup.FIGURES, check_startup, takes_database=False),
    Part("context", lambda: context.figures(context.QUICK), check_context),
    Part("storage", storage.figures, check_storage, timeout=300, via_runner=True),
    Part("turn_cost", turn_cost.figures, check_turn_cost, timeout=300),
    Part("streams", lambda: streams.figures(streams.QUICK_STREAMS), check_streams, timeout=300),
    Part("users", lambda: users.figures(users.QUICK_USERS), check_users, timeout=300),
    Part("encryption", encryption.figures, check_encryption, timeout=300),
    Part("runs", runs.figures, check_runs, timeout=300),
    Part("catalogue", lambda: catalogue.figures(catalogue.QUICK), check_catalogue),
    # The pgvector figures only on a server that can create pgvector (`check_memory`).
    Part("memory", memory.figures, check_memory, timeout=900, may_be_unmeasured=MEMORY_PGVECTOR_FIGURES),
    Part("memory_eval", memory_eval.figures, check_memory_eval, timeout=300),
    Part("branches", lambda: branches.figures(branches.QUICK), check_branches, timeout=900),
    Part("export", lambda: export.figures(export.QUICK), check_export),
    Part("search", lambda: search.figures(search.QUICK), check_search),
    Part("web", lambda: web.figures(web.QUICK), check_web),
]  # fmt: skip

# The storage part is the quick one; the others start servers and databases for minutes.
_SLOW = {"branches", "catalogue", "context", "memory", "memory_eval", "startup", "load", "web", "turn_cost", "streams", "users"}
# The load part's quick run is the suite's longest single test (about 1.5 minutes of one worker).
_LONGEST = {"load"}


def _marks(name: str) -> list[pytest.MarkDecorator]:
    return [mark for mark, names in ((pytest.mark.slow, _SLOW), (pytest.mark.longest, _LONGEST)) if name in names]


def run_part(part: Part, server_url: str, out: Path) -> Run:
    before = frozenset(name for (name,) in databases_left(server_url, like="tt_%"))
    # Forked from the preloaded interpreter (`tests.helpers.preloaded`), as `python -m bench.NAME` would run
    # but without importing the agent's stack again (about 3 s of CPU a part); what a part measures of new
    # processes (start-up, servers) it starts itself, as new interpreters.
    done = run_source(
        part.source(),
        f"<bench.{part.name}>",
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200"},
        timeout=part.timeout,
        args=part.arguments(out, server_url),
    )
    output = json.loads(out.read_text()) if out.exists() else {}
    result = output.get("parts", {}).get(part.name, {}) if part.via_runner else output
    return Run(done, output, result, server_url, before)


@pytest.mark.parametrize(
    "part", [pytest.param(p, id=p.name, marks=_marks(p.name)) for p in PARTS]
)
def test_quick_bench_part_runs_and_reports_every_figure(part: Part, pg_server_url, tmp_path):
    run = run_part(part, pg_server_url, tmp_path / f"{part.name}.json")
    done, result = run.done, run.report
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert list(result["figures"]) == list(part.figures())
    unmeasured = {key for key, row in result["figures"].items() if row["measured"] is None}
    assert unmeasured <= part.may_be_unmeasured
    assert f"targets met: {result['targets_met']}/{result['targets_total']}" in done.stdout
    assert not [key for key in report.INNER_FAILURES if result.get(key)]
    part.check(run)


def test_every_part_of_the_runner_has_a_smoke_test():
    parts = runpy.run_path(str(RUNNER), run_name="bench_runner")["PARTS"]
    assert {part.name for part in PARTS} == set(parts)


def test_bench_user_messages_are_deterministic_and_of_fixed_size():
    assert storage.user_message(7) == storage.user_message(7) != storage.user_message(8)
    assert {len(storage.user_message(t).encode("utf-8")) for t in (1, 99, 12345)} == {storage.USER_MESSAGE_BYTES}


def test_bench_runner_lists_its_parts_and_refuses_an_unknown_one():
    done = subprocess.run([sys.executable, str(RUNNER), "--only", "nonsense"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "storage" in done.stderr and "load" in done.stderr


def test_every_part_of_the_runner_has_run_and_print_result():
    # The runner imports each part by name and calls these two; a part without them breaks `scripts/bench.py`.
    parts = runpy.run_path(str(RUNNER), run_name="bench_runner")["PARTS"]
    assert {"storage", "encryption", "branches", "export", "catalogue", "context", "memory", "startup", "load"} <= set(parts)
    for name in parts:
        module = importlib.import_module(f"bench.{name}")
        assert callable(module.run) and callable(module.print_result), name
