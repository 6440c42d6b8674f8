"""scripts/bench.py (the runner of every benchmark) and its storage part, bench.storage, keep working: run
them at a small size and check what they report (correctness, never time)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench import storage
from langchain_core.messages import AIMessage, HumanMessage

from tests.helpers.offline import AGENT_TOOL_SCHEMAS, offline_reply

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench.py"
TURNS = storage.QUICK_TURNS


def _bench_module():
    return storage


def _expected_raw_bytes(bench, turns: int, tools) -> int:
    # Each turn holds the user message and the offline model's reply, which quotes the user
    # messages so far and says what it received (see OfflineChatModel): the whole thread, with the
    # schemas of the tools bound to it (the agent binds its tools, the reference design none).
    history = []
    for turn in range(1, turns + 1):
        history.append(HumanMessage(bench.user_message(turn)))
        history.append(AIMessage(offline_reply(history, tools=tools)))
    return sum(len(m.text.encode("utf-8")) for m in history)


@pytest.fixture(scope="module")
def bench_run(pg_server_url, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """`scripts/bench.py --quick --only storage`: the runner with the storage part at QUICK_TURNS turns."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "storage", "--json", str(out), "--database-url", pg_server_url],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    runner = json.loads(out.read_text()) if out.exists() else {}
    return done, runner.get("parts", {}).get("storage", {}), runner


def test_bench_exits_zero_and_prints_table_and_summary(bench_run):
    done, report, runner = bench_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"targets met: {report['targets_met']}/{report['targets_total']}" in done.stdout
    for row in report["figures"].values():
        assert row["figure"] in done.stdout
    assert runner["broken_parts"] == [] and list(runner["parts"]) == ["storage"]
    assert f"all parts: targets met: {runner['targets_met']}/{runner['targets_total']}" in done.stdout
    assert runner["targets_total"] == report["targets_total"]


def test_bench_reports_every_figure_for_both_designs_as_positive_finite_numbers(bench_run):
    _, report, _ = bench_run
    assert list(report["figures"]) == list(storage.figures())
    for key, row in report["figures"].items():
        for value in (row["measured"], report["reference_figures"][key]):
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)
        assert row["note"].startswith("reference ")
    targeted = [row for row in report["figures"].values() if row["target"]]
    assert report["targets_total"] == len(targeted) == 6
    assert report["targets_met"] == sum(row["pass"] is True for row in targeted)
    assert all(isinstance(row["pass"], bool) for row in targeted)
    assert report["turns"] == TURNS
    assert report["peak_rss_mb"] > 0
    assert {"langgraph", "langgraph-checkpoint-postgres", "psycopg"} <= set(report["versions"])
    assert report["machine"]["cpu_count"] >= 1


def test_bench_concurrent_conversations_have_no_errors(bench_run):
    _, report, _ = bench_run
    assert report["errors"] == {"reference": 0, "project": 0}


def test_bench_counts_exactly_the_bytes_the_thread_holds(bench_run):
    _, report, _ = bench_run
    bench = _bench_module()
    # The N-turn thread, plus the thread whose first WINDOW turns were timed beside its last ones.
    for design, tools in (("reference", ()), ("project", AGENT_TOOL_SCHEMAS)):
        expected = _expected_raw_bytes(bench, TURNS, tools) + _expected_raw_bytes(bench, bench.WINDOW, tools)
        measured = report["measurements"][design]
        assert measured["message_count"] == 2 * TURNS
        assert measured["raw_message_bytes"] == expected
        assert measured["db_bytes_after"] > measured["db_bytes_before"] > 0


def test_bench_user_messages_are_deterministic_and_of_fixed_size():
    bench = _bench_module()
    assert bench.user_message(7) == bench.user_message(7) != bench.user_message(8)
    assert {len(bench.user_message(t).encode("utf-8")) for t in (1, 99, 12345)} == {bench.USER_MESSAGE_BYTES}


def test_bench_drops_its_scratch_databases(bench_run, pg_server_url):
    _, report, _ = bench_run
    names = [report["measurements"][design]["database"] for design in ("reference", "project")]
    assert names[0].startswith("tt_bench_ref_") and names[1].startswith("tt_bench_ours_")
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)).fetchall()
    assert left == []


def test_bench_runner_lists_its_parts_and_refuses_an_unknown_one():
    done = subprocess.run([sys.executable, str(BENCH), "--only", "nonsense"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "storage" in done.stderr and "load" in done.stderr


def test_every_part_of_the_runner_has_run_and_print_result():
    # The runner imports each part by name and calls these two; a part without them breaks `scripts/bench.py`.
    import importlib
    import runpy

    parts = runpy.run_path(str(BENCH), run_name="bench_runner")["PARTS"]
    assert {"storage", "branches", "catalogue", "context", "memory", "startup", "load"} <= set(parts)
    for name in parts:
        module = importlib.import_module(f"bench.{name}")
        assert callable(module.run) and callable(module.print_result), name
