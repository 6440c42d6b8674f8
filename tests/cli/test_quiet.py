"""Quiet defaults: no MLflow INFO lines where a person reads the output, and the model URI as the
last line of `scripts/log_model.py` even with stderr and stdout in one terminal.

MLflow logs at INFO ("Creating initial MLflow database tables", "Predicting on input example to
validate output", "Flushing the async trace logging queue before program exit") unless told
otherwise; the command line and the script tell it (`MLFLOW_LOGGING_LEVEL`), and `log_model()`
silences those lines for its own work (`agent.tracing.mlflow_info_silenced`).
The notebooks' outputs are checked in tests/docs/test_notebooks.py, the README's in-memory
example in tests/docs/test_docs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.servers import LOG_MODEL_SCRIPT
from tests.cli.test_cli import assert_clean_success, run_cli

pytestmark = pytest.mark.slow

MLFLOW_INFO = re.compile(r"\bINFO mlflow")


def test_demo_with_tracing_prints_no_mlflow_info_line(tmp_path):
    result = run_cli("demo", "--tracing", cwd=tmp_path, new_interpreter=True)  # MLflow's logging, set up at import
    assert_clean_success(result)
    assert (tmp_path / ".agent" / "mlflow.db").is_file()  # tracing did run, with a new tracking store
    assert not MLFLOW_INFO.search(result.stdout + result.stderr), result.stderr


def test_log_model_script_ends_with_the_model_uri_in_a_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    # A terminal shows stderr and stdout in one stream, in the order they were written.
    result = subprocess.run(
        [sys.executable, str(LOG_MODEL_SCRIPT)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"models:/m-[0-9a-f]+", lines[-1]), lines[-3:]
    assert not MLFLOW_INFO.search(result.stdout), result.stdout
