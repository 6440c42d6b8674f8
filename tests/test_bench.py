"""scripts/bench.py keeps working: run it at a small N and check what it reports (correctness, never time)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from langchain_core.messages import AIMessage, HumanMessage

from tests.helpers.offline import AGENT_TOOL_SCHEMAS, offline_reply

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench.py"
TURNS = 12


def _bench_module():
    spec = importlib.util.spec_from_file_location("tt_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = {**os.environ, "AGENT_TEST_DATABASE_URL": pg_server_url}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", str(TURNS), "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return done, report


def test_bench_exits_zero_and_prints_table_and_summary(bench_run):
    done, report = bench_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"targets met: {report['targets_met']}/{report['targets_total']}" in done.stdout
    for row in report["figures"].values():
        assert row["figure"] in done.stdout


def test_bench_reports_every_figure_for_both_designs_as_positive_finite_numbers(bench_run):
    _, report = bench_run
    bench = _bench_module()
    assert set(report["figures"]) == set(bench.FIGURES)
    for key, row in report["figures"].items():
        for design in ("reference", "project"):
            value = row[design]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, design, value)
    targeted = [row for row in report["figures"].values() if row["target"]]
    assert report["targets_total"] == len(targeted) == 6
    assert report["targets_met"] == sum(row["pass"] is True for row in targeted)
    assert all(isinstance(row["pass"], bool) for row in targeted)
    assert report["turns"] == TURNS
    assert report["peak_rss_mb"] > 0
    assert {"langgraph", "langgraph-checkpoint-postgres", "psycopg"} <= set(report["versions"])
    assert report["machine"]["cpu_count"] >= 1


def test_bench_concurrent_conversations_have_no_errors(bench_run):
    _, report = bench_run
    assert report["errors"] == {"reference": 0, "project": 0}


def test_bench_counts_exactly_the_bytes_the_thread_holds(bench_run):
    _, report = bench_run
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
    _, report = bench_run
    names = [report["measurements"][design]["database"] for design in ("reference", "project")]
    assert names[0].startswith("tt_bench_ref_") and names[1].startswith("tt_bench_ours_")
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)).fetchall()
    assert left == []
