"""Turns that outlive their connection (`agent.runs`): resumable streams on another replica, background runs
behind a proxy that cuts connections, a replica killed mid-turn, cancel and delete from another replica.

Two `tt-agent serve` processes (replicas A and B; the last test kills A with SIGKILL) on one fresh Postgres database, with a short lease
(`LEASE_S`) and `finish_left_streams` on, the trusted user header set; their model is the OpenAI-compatible
stub, slowed so that a turn streams for a few seconds. Every stream event is validated with the `openai`
package's own model.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import httpx
import openai
import psycopg
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.helpers.databases import fresh_database
from tests.helpers.openai_stub import configure_stub, openai_stub_server
from tests.helpers.servers import free_port, server_process
from tests.helpers.tcp_proxy import tcp_proxy

pytestmark = pytest.mark.slow

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
#: The replicas' `lease_seconds`: a killed replica's run reads failed, and its thread is free, after this long.
LEASE_S = 2.0
#: Seconds the stub takes per reply (its text arrives in `CHUNKS` deltas spread over it).
SLOW_S = 2.5
CHUNKS = 10
USER = {"X-User": "alice"}
STRANGER = {"X-User": "mallory"}


def serve(cwd, env):
    port = free_port()
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    return server_process(command, port=port, health_path="/health", env=env, cwd=cwd)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, pg_server_url):
    cwd = tmp_path_factory.mktemp("runs")
    with fresh_database(pg_server_url) as db, openai_stub_server(chunks=CHUNKS) as model_url:
        env = {
            "AGENT_DATABASE_URL": db,
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "unused",
            "AGENT_TRACING": "false",
            "AGENT_LEASE_SECONDS": str(LEASE_S),
            "AGENT_FINISH_LEFT_STREAMS": "true",
            "AGENT_USER_ID_HEADER": "X-User",
            "AGENT_MULTITASK_STRATEGY": "enqueue",
        }
        with serve(cwd, env) as a, serve(cwd, env) as b:
            configure_stub(model_url, latency_s=SLOW_S)
            yield SimpleNamespace(a=a, b=b, env=env, cwd=cwd, model_url=model_url)


def events_of(lines) -> list[dict]:
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            EVENT.validate_python(event)
            out.append(event)
    return out


def new_thread(base: str) -> tuple[str, str]:
    """A thread with one turn, made on `base`: (its id, that turn's response id)."""
    answer = httpx.post(f"{base}/responses", json={"input": "Hello there"}, headers=USER, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["custom_outputs"]["thread_id"], answer.json()["id"]


def history_length(base: str, thread_id: str) -> int:
    answer = httpx.get(f"{base}/conversations/{thread_id}/items", params={"limit": 100}, headers=USER, timeout=30)
    assert answer.status_code == 200, answer.text
    return len(answer.json()["data"])


def wait_status(base: str, response_id: str, wanted: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(f"{base}/responses/{response_id}", headers=USER, timeout=30).json()
        if body.get("status") in wanted or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def read_until(response: httpx.Response, count: int) -> list[dict]:
    """The first `count` events of an open stream (then the caller drops the connection)."""
    events: list[dict] = []
    for line in response.iter_lines():
        events += events_of([line])
        if len(events) >= count:
            break
    return events


def resume(base: str, response_id: str, after: int) -> list[dict]:
    with httpx.stream("GET", f"{base}/responses/{response_id}", params={"stream": "true", "starting_after": after},
                      headers=USER, timeout=60) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        return events_of(response.iter_lines())


def test_a_stream_dropped_at_event_n_resumes_on_another_replica_exactly_once_in_order(replicas):
    thread_id, seed = new_thread(replicas.b)
    body = {"input": "Tell me about Lisbon", "stream": True, "previous_response_id": seed}
    with httpx.stream("POST", f"{replicas.a}/responses", json=body, headers=USER, timeout=60) as response:
        assert response.status_code == 200
        first = read_until(response, 6)  # created, in_progress, item added, part added, two deltas
    response_id = first[0]["response"]["id"]
    after = first[-1]["sequence_number"]
    rest = resume(replicas.b, response_id, after)

    numbers = [e["sequence_number"] for e in first + rest]
    assert numbers == list(range(len(numbers)))  # nothing lost, nothing twice, in order
    assert rest[-1]["type"] == "response.completed"
    completed = rest[-1]["response"]
    text = "".join(e["delta"] for e in first + rest if e["type"] == "response.output_text.delta")
    assert completed["output"][-1]["content"][0]["text"] == text
    # The whole stream, replayed from the store, is the one the two connections got.
    assert resume(replicas.b, response_id, -1) == first + rest
    # The response equals a straight (unstreamed) run of the same request on a sibling branch.
    straight = httpx.post(f"{replicas.b}/responses", json={"input": "Tell me about Lisbon", "previous_response_id": seed},
                          headers=USER, timeout=60).json()  # fmt: skip
    assert [i["content"][0]["text"] for i in straight["output"]] == [i["content"][0]["text"] for i in completed["output"]]
    stored = httpx.get(f"{replicas.b}/responses/{response_id}", headers=USER, timeout=30).json()
    assert stored["status"] == "completed" and stored["output"] == completed["output"]
    # Another user's id is unknown to them: status, stream, cancel and delete.
    assert httpx.get(f"{replicas.b}/responses/{response_id}", headers=STRANGER).status_code == 404
    assert httpx.get(f"{replicas.b}/responses/{response_id}", params={"stream": "true"}, headers=STRANGER).status_code == 404
    assert httpx.post(f"{replicas.b}/responses/{response_id}/cancel", headers=STRANGER).status_code == 404
    assert httpx.delete(f"{replicas.b}/responses/{response_id}", headers=STRANGER).status_code == 404


def test_a_background_turn_outlives_a_proxy_that_cuts_every_connection(replicas):
    host, port = replicas.a.removeprefix("http://").split(":")
    with tcp_proxy(host, int(port)) as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        stop = threading.Event()

        def cut_every_2s() -> None:
            while not stop.wait(2.0):
                proxy.cut()

        cutter = threading.Thread(target=cut_every_2s, daemon=True)
        cutter.start()
        try:
            queued = httpx.post(f"{base}/responses", json={"input": "Plan a long trip", "background": True},
                                headers=USER, timeout=30).json()  # fmt: skip
            assert queued["status"] == "queued" and queued["output"] == []
            Response.model_validate(queued)
            started = time.monotonic()
            done: dict = {}
            while time.monotonic() - started < 30:
                try:
                    done = httpx.get(f"{base}/responses/{queued['id']}", headers=USER, timeout=5).json()
                except httpx.HTTPError:
                    continue
                if done.get("status") not in ("queued", "in_progress"):
                    break
                time.sleep(0.3)
        finally:
            stop.set()
            cutter.join()
    assert time.monotonic() - started > 2.0  # the turn outlived at least one cut
    assert done["status"] == "completed", done
    assert done["id"] == queued["id"] and done["output"][-1]["content"][0]["text"]
    # Its whole stream, from the store, on the other replica.
    events = resume(replicas.b, queued["id"], -1)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["output"] == done["output"]
    # DELETE removes its stored run record and keeps the checkpoint, saying so.
    deleted = httpx.delete(f"{replicas.b}/responses/{queued['id']}", headers=USER).json()
    assert deleted["deleted"] is True and deleted["removed"] == ["run", "events"]
    assert deleted["kept"]["checkpoint_id"] == done["custom_outputs"]["checkpoint_id"]
    assert httpx.get(f"{replicas.b}/responses/{queued['id']}", headers=USER).status_code == 404
    assert httpx.get(f"{replicas.b}/responses/{done['custom_outputs']['response_id']}", headers=USER).status_code == 200


def test_previous_response_id_of_an_unfinished_run_is_a_409_saying_so_and_writes_nothing(replicas):
    # Found by a new user: it answered 404 previous_response_not_found, as if the response did not exist.
    thread_id, _ = new_thread(replicas.a)
    queued = httpx.post(f"{replicas.a}/responses", json={"input": "Plan a trip", "background": True,
                        "conversation": thread_id}, headers=USER, timeout=30).json()  # fmt: skip
    with psycopg.connect(replicas.env["AGENT_DATABASE_URL"]) as conn:
        threads_before = conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0]
    with openai.OpenAI(base_url=replicas.b, api_key="unused", max_retries=0, default_headers=USER) as client:
        with pytest.raises(openai.ConflictError) as refused:
            client.responses.create(model="fake", input="And then?", previous_response_id=queued["id"])
        error = refused.value
        assert (error.code, error.param) == ("response_in_progress", "previous_response_id")
        assert queued["id"] in error.message and "still" in error.message
        # Once the run has completed, the same request continues from it.
        assert wait_status(replicas.b, queued["id"], {"completed"}, timeout=30)["status"] == "completed"
        later = client.responses.create(model="fake", input="And then?", previous_response_id=queued["id"])
    assert later.custom_outputs["thread_id"] == thread_id
    with psycopg.connect(replicas.env["AGENT_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0] == threads_before


def test_cancel_from_another_replica_while_queued_and_while_running_writes_nothing(replicas):
    thread_id, _ = new_thread(replicas.b)
    before = history_length(replicas.b, thread_id)
    turn = {"input": "Write a poem", "background": True, "conversation": thread_id}
    # Slower than the module's turns until both are cancelled: on a loaded machine the steps before the second
    # cancel took longer than SLOW_S, and the running turn had completed.
    configure_stub(replicas.model_url, latency_s=SLOW_S * 4)
    try:
        running = httpx.post(f"{replicas.a}/responses", json=turn, headers=USER, timeout=30).json()
        wait_status(replicas.b, running["id"], {"in_progress"}, timeout=10)
        # The second through MLflow's route: `custom_inputs.background`.
        invocation = {"input": [{"role": "user", "content": "Write a poem"}],
                      "custom_inputs": {"background": True, "thread_id": thread_id}}  # fmt: skip
        queued = httpx.post(f"{replicas.a}/invocations", json=invocation, headers=USER, timeout=30).json()
        assert wait_status(replicas.b, queued["id"], {"queued"}, timeout=1)["status"] == "queued"

        cancelled = httpx.post(f"{replicas.b}/responses/{queued['id']}/cancel", headers=USER, timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        Response.model_validate(cancelled.json())
        stopped = httpx.post(f"{replicas.b}/responses/{running['id']}/cancel", headers=USER, timeout=30)
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["status"] == "cancelled" and stopped.json()["custom_outputs"]["written"] is False
    finally:
        configure_stub(replicas.model_url, latency_s=SLOW_S)

    # Both stay cancelled (the queued one never runs), nothing was written, and the thread is free.
    time.sleep(1.0)
    for response_id in (queued["id"], running["id"]):
        assert httpx.get(f"{replicas.a}/responses/{response_id}", headers=USER).json()["status"] == "cancelled"
    assert history_length(replicas.b, thread_id) == before
    free = httpx.post(f"{replicas.b}/responses", json={"input": "Hi", "conversation": thread_id,
                      "custom_inputs": {"multitask_strategy": "reject"}}, headers=USER, timeout=60)  # fmt: skip
    assert free.status_code == 200, free.text
    # Cancelling again answers the same; a response that completed cannot be cancelled: a 400 saying so.
    again = httpx.post(f"{replicas.b}/responses/{running['id']}/cancel", headers=USER)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    late = httpx.post(f"{replicas.b}/responses/{free.json()['id']}/cancel", headers=USER)
    assert late.status_code == 400 and "completed" in late.json()["error"]["message"]


def test_a_replica_killed_mid_stream_leaves_a_failed_run_and_a_free_thread(replicas):
    # The module's last test: it kills replica A.
    thread_id, _ = new_thread(replicas.b)
    before = history_length(replicas.b, thread_id)
    pid = _pid_of(replicas.a)
    body = {"input": "Tell me about Porto", "stream": True, "conversation": thread_id}
    with httpx.stream("POST", f"{replicas.a}/responses", json=body, headers=USER, timeout=60) as response:
        first = read_until(response, 6)
        os.kill(pid, signal.SIGKILL)
    response_id = first[0]["response"]["id"]
    killed = time.monotonic()
    run = wait_status(replicas.b, response_id, {"failed"}, timeout=LEASE_S * 3)
    assert run["status"] == "failed" and "lease" in run["error"]["message"]
    Response.model_validate(run)
    rest = resume(replicas.b, response_id, first[-1]["sequence_number"])
    assert rest[-1]["type"] == "error" and rest[-1]["code"] == "lease_expired"
    assert [e["sequence_number"] for e in first + rest] == list(range(len(first) + len(rest)))
    # The thread is free within the lease: a turn that refuses to wait runs, on what was there before.
    answer = httpx.post(f"{replicas.b}/responses", json={"input": "Again", "conversation": thread_id,
                        "custom_inputs": {"multitask_strategy": "reject"}}, headers=USER, timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - killed < LEASE_S * 3 + SLOW_S + 5
    assert history_length(replicas.b, thread_id) == before + 2  # nothing of the killed turn


def _pid_of(base: str) -> int:
    """The pid of the server listening at `base` (its port), from /proc."""
    import psutil

    port = int(base.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    raise AssertionError(f"no process listens on {port}")
