"""A server stopped with SIGTERM lets its background runs finish (`serving.drain`), up to `shutdown_grace_seconds`;
those still going then are stopped and read `failed` (code `server_shutdown`) at once, not after their lease.

Each test starts `tt-agent serve` (one process, or `--workers 2`) on its backend's database (Postgres, or a
SQLite file) with the OpenAI-compatible stub as its model, starts a background run, sends SIGTERM to the
server, waits for it to exit, then asks a second server on the same database what the run left.

The second server, the reader, is the module's: one per backend, started once and running beside the servers
the tests stop, as another replica of a deployment does (the database, and the stub, are the module's too;
each test uses threads and runs of its own). A reader started after each stop cost the suite a server start
per test, each importing MLflow. It reads only what the stopped server wrote: a run's end is recorded by the
server that ran it, and a live run whose server vanished reads `lease_expired` only after its lease (15 s),
which these tests would see as a failure.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest
from openai.types.responses import Response

from agent.runs.service import STOPPED_AT_SHUTDOWN
from tests.helpers.databases import fresh_database
from tests.helpers.openai_stub import configure_stub, openai_stub_server
from tests.helpers.servers import free_port, running_server

pytestmark = pytest.mark.slow

USER = {"X-User": "alice"}
#: The servers' `lease_seconds` (the default): a run abandoned by its server would read failed only after it.
LEASE_S = 15.0


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def database(request, pg_server_url, tmp_path_factory):
    if request.param == "postgres":
        with fresh_database(pg_server_url) as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path_factory.mktemp('graceful') / 'checkpoints.sqlite'}"


@pytest.fixture(scope="module")
def model_url():
    with openai_stub_server(chunks=4) as url:
        yield url


@pytest.fixture(scope="module")
def reader(database, model_url, tmp_path_factory):
    """The base URL of a server on `database` that outlives the tests' stopped servers (module docstring)."""
    with serve(database, model_url, tmp_path_factory.mktemp("reader")) as server:
        yield server.base_url


def serve(database: str, model_url: str, cwd, *, workers: int = 1, grace: float | None = None):
    env = {
        "AGENT_DATABASE_URL": database,
        "AGENT_MODEL": "fake",
        "OPENAI_BASE_URL": model_url,
        "OPENAI_API_KEY": "unused",
        "AGENT_TRACING": "false",
        "AGENT_USER_ID_HEADER": "X-User",
        "AGENT_LEASE_SECONDS": str(LEASE_S),
    }
    if grace is not None:
        env["AGENT_SHUTDOWN_GRACE_SECONDS"] = str(grace)
    port = free_port()
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers)]
    return running_server(command, port=port, health_path="/health", env=env, cwd=cwd)


def start_background_run(base: str, body: dict) -> str:
    """Start a background run; its response id once it runs (`in_progress`)."""
    queued = httpx.post(f"{base}/responses", json={**body, "background": True}, headers=USER, timeout=30)
    assert queued.status_code == 200 and queued.json()["status"] == "queued", queued.text
    response_id = queued.json()["id"]
    deadline = time.monotonic() + 30
    while get_run(base, response_id)["status"] == "queued":
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    return response_id


def get_run(base: str, response_id: str) -> dict:
    answer = httpx.get(f"{base}/responses/{response_id}", headers=USER, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stop(server, *, within: float) -> None:
    """SIGTERM to the server (the supervisor of `--workers`, which passes it on); wait until it exited."""
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {within} s of SIGTERM:\n{server.output()}")


def history_length(base: str, thread_id: str) -> int:
    answer = httpx.get(f"{base}/conversations/{thread_id}/items", params={"limit": 100}, headers=USER, timeout=30)
    assert answer.status_code == 200, answer.text
    return len(answer.json()["data"])


def test_sigterm_lets_a_running_background_run_complete_before_the_server_exits(database, model_url, reader, tmp_path):
    # Each backend once, and both ways of serving (the drain is the same code on each backend's run store). Not a
    # parameter of its own: a parameter beside the module's `database` would keep pytest from running each
    # backend's tests together, and the module's reader would be started again for each group.
    workers = 1 if database.startswith("sqlite") else 2
    configure_stub(model_url, latency_s=2.0)
    with serve(database, model_url, tmp_path, workers=workers) as server:
        response_id = start_background_run(server.base_url, {"input": "Tell me about Porto"})
        stop(server, within=LEASE_S)  # the default grace (25 s) is not needed: the run takes 2 s
        output = server.output()
    run = get_run(reader, response_id)
    assert run["status"] == "completed", run
    Response.model_validate(run)
    assert run["output"][-1]["content"][0]["text"]  # the model's answer, written
    assert run["custom_outputs"]["checkpoint_id"]
    assert "Shutting down: waiting" in output  # it waited in the lifespan's exit, not by luck


def test_runs_still_going_or_queued_when_the_grace_period_ends_read_failed_at_once_and_leave_their_thread_free(
    database, model_url, reader, tmp_path
):
    configure_stub(model_url, latency_s=0)
    with serve(database, model_url, tmp_path, grace=1.0) as server:
        first = httpx.post(f"{server.base_url}/responses", json={"input": "Hello there"}, headers=USER, timeout=60)
        assert first.status_code == 200, first.text
        thread_id = first.json()["custom_outputs"]["thread_id"]
        before = history_length(server.base_url, thread_id)
        configure_stub(model_url, latency_s=20.0)
        response_id = start_background_run(server.base_url, {"input": "Write a long poem", "conversation": thread_id})
        # A second run on the thread waits for it, queued, when the server is stopped.
        body = {"input": "And another", "conversation": thread_id, "background": True,
                "custom_inputs": {"multitask_strategy": "enqueue"}}  # fmt: skip
        waiting = httpx.post(f"{server.base_url}/responses", json=body, headers=USER, timeout=30).json()["id"]
        assert get_run(server.base_url, waiting)["status"] == "queued"
        stop(server, within=LEASE_S)  # a run left to its lease would hold the thread that long
    configure_stub(model_url, latency_s=0)
    for stopped in (response_id, waiting):
        run = get_run(reader, stopped)
        # Its end was recorded by the server that stopped it: not lease_expired, which only its lease gives.
        assert run["status"] == "failed", run
        Response.model_validate(run)
        assert run["custom_outputs"]["code"] == "server_shutdown", run
        assert run["error"]["message"] == STOPPED_AT_SHUTDOWN
        assert run["custom_outputs"]["written"] is False and run["custom_outputs"]["checkpoint_id"] is None
    assert history_length(reader, thread_id) == before  # nothing of the stopped turn
    # The thread is free: a turn that refuses to wait for it runs.
    body = {"input": "Again", "conversation": thread_id, "custom_inputs": {"multitask_strategy": "reject"}}
    answer = httpx.post(f"{reader}/responses", json=body, headers=USER, timeout=60)
    assert answer.status_code == 200, answer.text
    assert history_length(reader, thread_id) == before + 2


# One backend: what is tested is the stream's end; the run's record on both is the test above's.
@pytest.mark.parametrize("database", ["postgres"], indirect=True)
def test_an_open_stream_still_going_when_the_grace_period_ends_gets_an_error_event_and_its_run_reads_failed(
    database, model_url, reader, tmp_path
):
    configure_stub(model_url, latency_s=20.0)
    with serve(database, model_url, tmp_path, grace=1.0) as server:
        body = {"input": "Write a long poem", "stream": True}
        with httpx.stream("POST", f"{server.base_url}/responses", json=body, headers=USER, timeout=60) as response:
            lines = response.iter_lines()
            created = next(line for line in lines if line.startswith("data: {"))
            server.process.send_signal(signal.SIGTERM)
            rest = [line[6:] for line in lines if line.startswith("data: ")]  # to the stream's end
        stop(server, within=LEASE_S)
    # The stream ended as a cancelled one does: an error event, then [DONE], not a cut connection.
    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])
    assert error["type"] == "error" and error["code"] == "server_shutdown", error
    response_id = json.loads(created[6:])["response"]["id"]
    run = get_run(reader, response_id)
    assert run["status"] == "failed" and run["custom_outputs"]["code"] == "server_shutdown", run
