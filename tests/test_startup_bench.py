"""`python -m bench.startup --quick` runs end to end and reports every figure (never checked against
its targets here: timings are the benchmark's verdict, not a test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import startup
from tests.helpers.servers import REPO_ROOT


@pytest.mark.slow
def test_quick_startup_benchmark_reports_every_figure(tmp_path):
    out = tmp_path / "startup.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.startup", "--quick", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["figures"]) == set(startup.FIGURES)
    assert all(row["measured"] is not None for row in report["figures"].values())
    assert "targets met:" in done.stdout
