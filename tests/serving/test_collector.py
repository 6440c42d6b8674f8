"""The garbage collector of a server process (`agent.serving.collector`): start-up objects frozen, full
collections rarer; and MLflow's tracer built at start-up, in a worker thread once the server answers
(`agent.tracing.build_tracer_now`). Each check runs in
a child process, so that the test process's own collector and tracer are left alone."""

from __future__ import annotations

import json
import subprocess
import sys

from agent.serving.collector import THRESHOLDS
from tests.helpers import REPO_ROOT

CHILD = """
import gc, json, time
from agent.serving.collector import THRESHOLDS
from fastapi.testclient import TestClient
from agent import create_agent
from agent.serving.agent_server import build_app
from agent.serving.app import with_lifespan
from mlflow.tracing.provider import provider

agent = create_agent("memory://", model="offline", tracing=True)
app = build_app(agent)
with_lifespan(app, agent, close_agent=True)
before = {"frozen": gc.get_freeze_count(), "tracer_built": provider.once._done}
with TestClient(app) as client:  # runs the lifespan's start-up, as uvicorn does before it opens the port
    health = client.get("/health").status_code  # answered while the warm-up may still run in its thread
    deadline = time.monotonic() + 60
    while gc.get_threshold() != THRESHOLDS and time.monotonic() < deadline:
        time.sleep(0.05)
    during = {"frozen": gc.get_freeze_count(), "thresholds": gc.get_threshold(), "tracer_built": provider.once._done,
              "health": health}
print(json.dumps({"before": before, "during": during}))
"""


def test_a_server_process_freezes_its_start_up_objects_and_builds_its_tracer_once_it_serves(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["before"]["frozen"] == 0 and not found["before"]["tracer_built"]
    during = found["during"]
    assert during["frozen"] > 100_000  # the imports' objects: MLflow, LangChain, FastAPI ...
    assert tuple(during["thresholds"]) == THRESHOLDS
    assert during["tracer_built"] is True and during["health"] == 200
