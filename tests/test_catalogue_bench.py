"""`python -m bench.catalogue --quick` runs end to end and reports every figure (never checked against its target
here: that is the benchmark's verdict on the code, not a test of the benchmark), and drops its scratch database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench import catalogue

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run(pg_server_url, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("catalogue") / "catalogue.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.catalogue", "--quick", "--json", str(out), "--database-url", pg_server_url],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, json.loads(out.read_text()) if out.exists() else {}


def test_quick_catalogue_benchmark_reports_every_figure_and_the_summary(quick_run):
    done, report = quick_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert report["error"] is None
    assert list(report["figures"]) == list(catalogue.figures(catalogue.QUICK))
    assert all(row["measured"] is not None for row in report["figures"].values())
    assert report["targets_total"] == 1
    assert f"targets met: {report['targets_met']}/1" in done.stdout
    assert report["threads"]["large"] == catalogue.QUICK.large and report["threads"]["small"] == catalogue.QUICK.small


def test_quick_catalogue_benchmark_drops_its_scratch_database(quick_run, pg_server_url):
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'tt_catalogue_%'").fetchall()
    assert left == []
