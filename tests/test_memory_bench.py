"""`python -m bench.memory --quick` runs end to end and reports every figure (never checked against its
targets here: those are the benchmark's verdict on the code, not a test of the benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import memory

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_memory_benchmark_reports_every_figure_for_every_configuration(pg_server_url, tmp_path):
    out = tmp_path / "memory.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.memory", "--quick", "--json", str(out), "--database-url", pg_server_url],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["broken_configurations"] == []
    assert list(report["figures"]) == list(memory.figures())
    assert all(row["measured"] is not None for row in report["figures"].values())
    assert {name: report["measurements"][name]["search"] for name in memory.CONFIGURATIONS} == {
        "sqlite_keyword": "keyword", "sqlite_semantic": "semantic", "postgres_keyword": "keyword",
    }  # fmt: skip
    # The turns with a user_id were given memories: the figure measures retrieval, not an empty search.
    assert all(report["measurements"][name]["turns_given_memories"] > 0 for name in memory.CONFIGURATIONS)
    assert f"targets met: {report['targets_met']}/{report['targets_total']}" in done.stdout
