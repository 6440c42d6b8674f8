"""`python -m bench.context --quick` runs end to end and reports every figure (measured, never checked against
its targets here: those are the benchmark's verdict on the code, not a test of the benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import context

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_context_benchmark_measures_every_figure_and_prints_the_table(pg_server_url, tmp_path):
    out = tmp_path / "context.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.context", "--quick", "--json", str(out), "--database-url", pg_server_url],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(out.read_text())
    expected = context.figures(context.QUICK)
    assert list(report["figures"]) == list(expected)
    assert report["broken_phases"] == []
    assert all(row["measured"] is not None for row in report["figures"].values())
    targeted = [key for key, figure in expected.items() if figure.check is not None]
    assert report["targets_total"] == len(targeted) == 4
    assert f"targets met: {report['targets_met']}/{report['targets_total']}" in done.stdout
    assert report["measurements"]["long thread"]["long_thread_messages_at_end"] >= context.QUICK.long_messages
    assert len(report["measurements"]["trim"]["tokens"]) == context.QUICK.turns
