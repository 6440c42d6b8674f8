"""Notebooks: stored without outputs, and executed top to bottom with nbclient on the
embedded default store and on Postgres (`AGENT_DATABASE_URL`); a cell error fails the test.

The kernel is this interpreter (a kernelspec written to a temporary JUPYTER_PATH),
so the notebooks see exactly the packages the tests see.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import psycopg
import pytest
from jupyter_core.utils import ensure_async
from nbclient import NotebookClient

from tests.helpers.servers import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.longest]  # ten kernels: over a minute of one worker

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
KERNEL_NAME = "timetravel-agent-tests"


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory) -> str:
    jupyter_path = tmp_path_factory.mktemp("jupyter")
    spec_dir = jupyter_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "timetravel-agent tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(jupyter_path))
        yield KERNEL_NAME


def test_the_five_notebooks_exist_and_are_stored_without_outputs():
    assert {path.stem for path in NOTEBOOKS} == {"short_term_memory", "time_travel", "serving", "long_term_memory", "own_agent"}
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} holds outputs"


def run(path: Path, kernel_name: str, cwd: Path) -> tuple[list[str], list[str]]:
    """Execute the notebook in `cwd`; the text of every output (stdout, stderr, results), in order, and the
    text of every stream message the kernel sent, whichever cell it names (`record_streams`)."""
    notebook = nbformat.read(path, as_version=4)
    streams: list[str] = []
    # nbclient waits 4 s (iopub_timeout) after a cell's reply for the rest of its output and then drops it with
    # only a log warning: on a loaded machine a cell's printed lines went missing and the test failed on them.
    # Wait longer, and fail as a timeout if the output still does not come.
    client = NotebookClient(
        notebook, kernel_name=kernel_name, timeout=300, iopub_timeout=60, raise_on_iopub_timeout=True,
        resources={"metadata": {"path": str(cwd)}},
    )  # fmt: skip
    client.on_notebook_start = lambda notebook: record_streams(client, streams)
    client.execute()
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text") or str(output.get("data", {}).get("text/plain", "")))
    return texts, streams


def record_streams(client: NotebookClient, streams: list[str]) -> None:
    """Keep the text of every stream message `client` reads from the kernel in `streams`.

    nbclient puts a message in the outputs of the cell running when it comes only if it names that cell
    (`_async_poll_output_msg`), and drops the others without a word. Twice in a loaded full run the serving
    notebook's printed `store:` line was in no cell's outputs (never alone, never under synthetic load);
    printed text the kernel sent under another cell's name still counts as printed.
    """
    channel = client.kc.iopub_channel
    get_msg = channel.get_msg

    async def recording(*args, **kwargs):
        message = await ensure_async(get_msg(*args, **kwargs))
        if message["msg_type"] == "stream":
            streams.append(message["content"]["text"])
        return message

    channel.get_msg = recording


def assert_named(outputs: list[str], store: str) -> None:
    """The store the notebook wrote to is the one it printed."""
    printed = [line for text in outputs for line in text.splitlines() if "store:" in line]
    assert any(f"store: {store}" in text for text in outputs), (printed, outputs)


def assert_own_agent_kept_its_interrupts(outputs: list[str], database_url: str) -> None:
    """own_agent.ipynb: the thread it printed holds, in the store, the interrupted checkpoint (waiting at
    `tools`) with its two answers (booked, declined), and the Paris question left waiting on its branch."""
    from agent import create_agent

    [thread_id] = [text.split("thread:", 1)[1].split()[0] for text in outputs if "thread:" in text]
    assert any("waiting at 'tools' for an answer to 'Book a trip to Tokyo?'" in text for text in outputs), outputs
    with create_agent(database_url, model="offline") as reader:
        entries = reader.get_checkpoint_history(thread_id, limit=100)
    waiting = [e for e in entries if e["next_nodes"] == ["tools"]]
    assert sorted(e["last_user_message"] for e in waiting) == ['use book_trip {"destination": "Paris"}', 'use book_trip {"destination": "Tokyo"}']
    tokyo = next(e for e in waiting if "Tokyo" in e["last_user_message"])
    answers = sorted(e["last_message"] for e in entries if e["parent_checkpoint_id"] == tokyo["checkpoint_id"])
    assert [("Booked: a trip to Tokyo" in a, "declined the trip to Tokyo" in a) for a in answers] == [(True, False), (False, True)], answers


def assert_quiet(outputs: list[str]) -> None:
    """No MLflow INFO line in the outputs (with nothing configured, as a new user runs them)."""
    assert not [text for text in outputs if "INFO mlflow" in text], outputs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_embedded_default_store(path, kernel_name, tmp_path, monkeypatch):
    for name in ("AGENT_DATABASE_URL", "AGENT_MODEL", "MLFLOW_TRACKING_URI", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    outputs, streams = run(path, kernel_name, tmp_path)
    assert (tmp_path / ".agent" / "checkpoints.sqlite").is_file()
    assert_named(outputs + streams, str(tmp_path / ".agent" / "checkpoints.sqlite"))
    assert_quiet(outputs)
    if path.stem == "own_agent":
        assert_own_agent_kept_its_interrupts(outputs, f"sqlite:///{tmp_path / '.agent' / 'checkpoints.sqlite'}")
    # Only logging a model writes an MLflow store, and then under .agent/; nothing lands in the current directory.
    assert (tmp_path / ".agent" / "mlflow.db").is_file() == (path.stem == "serving")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_postgres_from_agent_database_url(path, kernel_name, tmp_path, monkeypatch, pg_url):
    for name in ("AGENT_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENT_DATABASE_URL", pg_url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    threads_before = _thread_count(pg_url)
    outputs, streams = run(path, kernel_name, tmp_path)
    assert _thread_count(pg_url) > threads_before
    assert_named(outputs + streams, pg_url)  # no password in the test URL, so masking leaves it as is
    if path.stem == "own_agent":
        assert_own_agent_kept_its_interrupts(outputs, pg_url)
    # Not assert_quiet: with MLFLOW_TRACKING_URI set, tracing is on and MLflow announces the
    # tracking store it creates; its messages are then the user's to tune (MLFLOW_LOGGING_LEVEL).
    assert not (tmp_path / ".agent" / "checkpoints.sqlite").exists()


def _thread_count(pg_url: str) -> int:
    with psycopg.connect(pg_url) as conn:
        exists = conn.execute("SELECT to_regclass('agent_threads') IS NOT NULL").fetchone()[0]
        return conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0] if exists else 0
