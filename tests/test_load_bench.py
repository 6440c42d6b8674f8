"""`python -m bench.load --quick` runs end to end and reports every figure (never checked against its
targets here: those are the benchmark's verdict on the code, not a test of the benchmark), and the
chain check it judges concurrent turns with finds forks, lost and duplicated turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench import load
from bench.traffic import check_chain

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_run(pg_server_url, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("load") / "load.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.load", "--quick", "--json", str(out), "--database-url", pg_server_url],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.slow
def test_quick_load_benchmark_completes_and_prints_the_table_and_the_summary(quick_run):
    done, report = quick_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert report["broken_phases"] == []
    assert f"targets met: {report['targets_met']}/{report['targets_total']}" in done.stdout
    for column in ("figure", "measured", "target", "pass"):
        assert column in done.stdout


@pytest.mark.slow
def test_quick_load_benchmark_reports_every_figure(quick_run):
    _, report = quick_run
    expected = load.figures(load.QUICK)
    assert list(report["figures"]) == list(expected)
    targeted = [key for key, figure in expected.items() if figure.check is not None]
    assert report["targets_total"] == len(targeted) == 12
    assert report["targets_met"] == sum(report["figures"][key]["pass"] is True for key in targeted)
    # Every figure was measured (the workers figures only where `tt-agent serve` has --workers).
    unmeasured = {key for key, row in report["figures"].items() if row["measured"] is None}
    assert unmeasured <= {"workers_speedup", "workers_1_turns_per_s", "workers_2_turns_per_s"}
    assert report["settings"]["sizes"]["conversations"] == load.QUICK.conversations


@pytest.mark.slow
def test_quick_load_benchmark_drops_its_scratch_databases(quick_run, pg_server_url):
    _, report = quick_run
    created = report["scratch_databases"]
    assert len(created) == 10 and all(name.startswith("tt_load_") for name in created)
    # Only this run's: other runs on the same server may have theirs in flight.
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (created,)).fetchall()
    assert left == []


# -- the chain check ---------------------------------------------------------------------------


def entry(checkpoint_id: str, parent: str | None, message_count: int) -> dict:
    return {"checkpoint_id": checkpoint_id, "parent_checkpoint_id": parent, "message_count": message_count}


def linear(n: int, *, root: bool = False) -> list[dict]:
    """A thread of `n` turns (checkpoints c1..cn), newest first, optionally under a root r0."""
    entries = [entry("r0", None, 0)] if root else []
    for i in range(1, n + 1):
        entries.append(entry(f"c{i}", entries[-1]["checkpoint_id"] if entries else None, 2 * i))
    return list(reversed(entries))


LANDED = {"u1": "c1", "u2": "c2", "u3": "c3"}


@pytest.mark.parametrize("root", [False, True])
def test_a_linear_chain_holding_each_landed_turn_once_passes(root):
    assert check_chain(linear(3, root=root), LANDED, ["refused"], ["u2", "u1", "u3"]) == []


def test_two_children_of_one_checkpoint_are_a_fork():
    history = linear(2)
    history.insert(0, entry("c3", "c1", 6))  # c3 forks from c1 instead of continuing c2
    problems = check_chain(history, LANDED, [], ["u1", "u2", "u3"])
    assert any("a fork" in p for p in problems)


def test_a_duplicated_user_message_is_found():
    problems = check_chain(linear(3), LANDED, [], ["u1", "u2", "u2", "u3"])
    assert any("duplicated user messages: ['u2']" in p for p in problems)


def test_an_acknowledged_turn_missing_from_the_thread_is_lost():
    problems = check_chain(linear(2), LANDED, [], ["u1", "u2"])
    assert any("2 turn checkpoints for 3 turns" in p for p in problems)
    assert any("lost user messages: ['u3']" in p for p in problems)


def test_a_refused_turn_that_was_stored_is_found():
    problems = check_chain(linear(3), LANDED, ["u4"], ["u1", "u2", "u3", "u4"])
    assert any("refused but stored" in p for p in problems)
