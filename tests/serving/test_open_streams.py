"""Many open streams on one `tt-agent serve` process: none is lost.

One server process (the CLI, default admission settings) on a Postgres database, its model the
OpenAI-compatible stub slowed to `MODEL_LATENCY_S` per reply, so that every stream is open at the same
time. `STREAMS` streamed turns are sent at once, each on a new thread: every stream must end with its
checkpoint id and no error event, and each thread's head must be that checkpoint (the turn was saved).
The 1,000-stream figure, with its memory and CPU per stream, is `bench.streams`'s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

import httpx
import pytest

from agent import create_agent
from tests.helpers.databases import fresh_database
from tests.helpers.openai_stub import configure_stub, openai_stub_server
from tests.helpers.servers import free_port, server_process

pytestmark = pytest.mark.slow

STREAMS = 100
MODEL_LATENCY_S = 1.0


async def stream_turn(http: httpx.AsyncClient, thread_id: str) -> tuple[int, str | None, list[str]]:
    """(status, the final checkpoint id, error events) of one streamed turn on `thread_id`."""
    body = {"input": [{"role": "user", "content": f"Hello from {thread_id}"}],
            "custom_inputs": {"thread_id": thread_id}, "stream": True}  # fmt: skip
    checkpoint_id, errors = None, []
    async with http.stream("POST", "/responses", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if event.get("type") == "error":
                errors.append(event.get("message", ""))
            checkpoint_id = (event.get("custom_outputs") or {}).get("checkpoint_id") or checkpoint_id
    return response.status_code, checkpoint_id, errors


async def at_once(base_url: str, thread_ids: list[str]) -> list[tuple[int, str | None, list[str]]]:
    limits = httpx.Limits(max_connections=STREAMS + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:
        return await asyncio.gather(*(stream_turn(http, thread_id) for thread_id in thread_ids))


def test_a_hundred_streams_at_once_on_one_process_all_end_and_are_saved(pg_server_url, tmp_path):
    with fresh_database(pg_server_url, prefix="tt_streams") as url, openai_stub_server(chunks=4) as model_url:
        port = free_port()
        env = {"AGENT_DATABASE_URL": url, "AGENT_MODEL": "fake", "OPENAI_BASE_URL": model_url,
               "OPENAI_API_KEY": "unused", "AGENT_TRACING": "false"}  # fmt: skip
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
            assert asyncio.run(at_once(base_url, [f"warm-{uuid.uuid4()}"]))[0][0] == 200
            configure_stub(model_url, latency_s=MODEL_LATENCY_S)
            thread_ids = [f"stream-{n}-{uuid.uuid4()}" for n in range(STREAMS)]
            answers = asyncio.run(at_once(base_url, thread_ids))
        assert [(status, errors) for status, _, errors in answers] == [(200, [])] * STREAMS
        assert all(checkpoint_id for _, checkpoint_id, _ in answers)
        with create_agent(url, model="offline", tracing=False) as agent:
            heads = [agent.get_thread(thread_id)["checkpoint_id"] for thread_id in thread_ids]
        assert heads == [checkpoint_id for _, checkpoint_id, _ in answers]
