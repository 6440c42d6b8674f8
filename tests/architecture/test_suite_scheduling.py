"""The suite's scheduling (`tests/helpers/scheduling.py`) keeps a module that starts a server on one worker.

pytest-xdist's `--dist loadgroup` silently stops grouping with pytest 9.2 (pytest-xdist#1386: it marks a
group by rewriting `item._nodeid`, which pytest 9.2 no longer reads), and then every worker that gets one
of the module's tests starts the module's server again: the suite got minutes slower and nothing failed.
This runs a small suite of two such modules under `scripts/test.sh`'s options and checks that each module's
fixture was set up once, on one worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO_ROOT

MODULE = textwrap.dedent(
    """
    import json, os
    import pytest

    @pytest.fixture(scope="module")
    def server():
        with open(os.environ["SETUPS"], "a") as out:
            out.write(json.dumps([__name__, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
        yield

    @pytest.mark.parametrize("n", range(6))
    def test_uses_the_server(server, n):
        with open(os.environ["RUNS"], "a") as out:
            out.write(json.dumps([__name__, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")

    @pytest.mark.parametrize("n", range(6))
    def test_in_process(n):
        with open(os.environ["RUNS"], "a") as out:
            out.write(json.dumps([__name__ + ".in_process", os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
    """
)

#: Collected last, run first: the longest unit of the suite.
LONGEST = textwrap.dedent(
    """
    import json, os
    import pytest

    @pytest.mark.longest
    def test_longest():
        with open(os.environ["RUNS"], "a") as out:
            out.write(json.dumps([__name__, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
    """
)


def test_a_module_with_a_module_fixture_runs_on_one_worker_and_sets_it_up_once(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["tests.helpers.scheduling"]\n')
    for name in ("test_first", "test_second"):
        (suite / f"{name}.py").write_text(MODULE)
    (suite / "test_zlast.py").write_text(LONGEST)
    setups, runs = tmp_path / "setups.jsonl", tmp_path / "runs.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SETUPS": str(setups), "RUNS": str(runs)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
         "-p", "no:cacheprovider", "-q", str(suite)],  # fmt: skip
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    set_up = [tuple(json.loads(line)) for line in setups.read_text().splitlines()]
    ran = [tuple(json.loads(line)) for line in runs.read_text().splitlines()]
    assert sorted(module for module, _ in set_up) == ["test_first", "test_second"]  # once each
    for module, worker in set_up:
        assert {w for m, w in ran if m == module} == {worker}  # all of its tests on that worker
    assert len(ran) == 25
    # The order the workers send is the order xdist deals out: the `longest` unit, then the modules that
    # start a server, then the in-process tests (each worker's first test tells, two workers for three kinds).
    first = {}
    for module, worker in ran:
        first.setdefault(worker, module)
    assert "test_zlast" in first.values() and not any(m.endswith(".in_process") for m in first.values()), ran
