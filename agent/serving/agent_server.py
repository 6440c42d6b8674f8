"""The MLflow Agent Server (`mlflow.genai.agent_server`) for one agent, as `tt-agent serve` runs it.

Endpoints (MLflow's): `POST /invocations` and `POST /responses` (the OpenAI
Responses API shape, so `openai.OpenAI(base_url=...).responses.create(...,
extra_body={"custom_inputs": {...}})` works), both with `"stream": true` for
server-sent events; `GET /health`; `GET /agent/info`.

What this module adds to MLflow's server:

* **Handlers off the event loop.** MLflow calls a synchronous handler on the
  event loop, so one slow turn would stall every other request (and
  `/health`). `predict` and each step of `predict_stream` run in the thread pool.
* **Errors keep their status.** MLflow answers any handler exception with 500
  (mlflow 3.17, `AgentServer._handle_invoke_request`) and reports a streaming
  error inside a 200 stream. Here an `AgentError` answers with its own status
  (`agent.errors.http_status`: 400, 404, 409, 503) and the JSON body
  `{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "..."}`, also for a
  stream that fails before its first event. A stream that fails later (the
  status is already sent) ends with one `{"type": "error", "code": ...,
  "message": ..., "error": {...}}` event and `[DONE]`; the `openai` client
  raises `openai.APIError` with the message. No traceback ever reaches a client.

MLflow keeps the `@invoke()` / `@stream()` handlers in module globals, so a
process serves one agent: `build_app(agent)` binds it (a second call rebinds).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, StreamingResponse
from mlflow.genai.agent_server import AgentServer, get_stream_function, invoke, stream
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from agent.errors import AgentError, InvalidRequest, http_status
from agent.responses import LangGraphResponsesAgent
from agent.tracing import scrub_trace_inputs, tag_trace

_bound_agent: LangGraphResponsesAgent | None = None


def _agent() -> LangGraphResponsesAgent:
    if _bound_agent is None:
        raise AgentError("No agent is bound to this server; call build_app(agent) first.")
    return _bound_agent


@invoke()
async def respond(request: ResponsesAgentRequest) -> ResponsesAgentResponse:
    """One whole turn (or `custom_inputs.action`) with the bound agent's `predict`."""
    try:
        return await run_in_threadpool(_agent().predict, request)
    except InvalidRequest:
        scrub_trace_inputs()  # MLflow's server span recorded the refused request too
        raise


@stream()
async def respond_stream(request: ResponsesAgentRequest) -> AsyncIterator[ResponsesAgentStreamEvent]:
    """The bound agent's `predict_stream` events; the last one carries `custom_outputs`."""
    events = _agent().predict_stream(request)
    try:
        async for event in iterate_in_threadpool(events):
            yield event
    finally:
        # A client that goes away leaves the turn suspended mid-stream, holding
        # its thread's lock and a pooled connection until garbage collection
        # (minutes under load). Closing it ends the turn now: nothing is written.
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(events.close)


class _ResponsesAgentServer(AgentServer):
    """MLflow's `AgentServer`, except that a stream's first event is produced before the response starts."""

    async def _handle_stream_request(self, request: ResponsesAgentRequest, return_trace_id: bool) -> StreamingResponse:
        # Starlette sends the status line before pulling the body, so a turn
        # refused at its start (unknown thread, busy thread, bad ids) must fail
        # here to get a 4xx; MLflow's version would send 200 and an error event.
        handler = get_stream_function()
        if handler is None:
            raise HTTPException(status_code=500, detail="No stream function registered")
        events = handler(request)
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None

        async def replay(_request: Any) -> AsyncIterator[Any]:
            try:
                if first is None:
                    return
                yield first
                _tag_server_trace(first)
                async for event in events:
                    yield event
                    _tag_server_trace(event)
            except AgentError as exc:
                yield _error_event(exc)
            finally:
                await events.aclose()  # also when the client left: see respond_stream

        replay.__name__ = handler.__name__  # MLflow names the server's span after it
        return StreamingResponse(self._generate(replay, request, return_trace_id), media_type="text/event-stream")


def build_app(agent: LangGraphResponsesAgent) -> FastAPI:
    """The Agent Server's FastAPI app, with `agent` answering `/invocations` and `/responses`.

    Binds `agent` to this module's handlers (one agent per process; a second
    call rebinds). The caller keeps ownership of `agent` and closes it.

    Returns:
        A FastAPI app to serve with uvicorn (`run_agent_server` does).
    """
    global _bound_agent
    _bound_agent = agent
    app = _ResponsesAgentServer("ResponsesAgent").app
    app.add_exception_handler(AgentError, _agent_error_response)
    app.add_exception_handler(HTTPException, _http_error_response)
    app.add_middleware(RequestBodyLimits, max_bytes=_body_limit(agent.settings.max_request_bytes))
    return app


def _body_limit(max_request_bytes: int) -> int:
    # The agent measures a request as compact UTF-8 JSON; a body may spell the
    # same text with whitespace or \uXXXX escapes (up to 6 bytes a character).
    return 6 * max_request_bytes + 64 * 1024


class RequestBodyLimits:
    """ASGI middleware: a POST body must be at most `max_bytes` and a JSON object, or it gets a 400.

    Checked before MLflow's server reads it: MLflow parses (and traces) any
    body in full, and answers a body that is not a JSON object with a 500.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"The request body is {int(declared)} bytes; the limit is {self.max_bytes} bytes")
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(send, f"The request body is over the limit of {self.max_bytes} bytes")
                return
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            await self._refuse(send, f"The request body is not valid JSON: {exc}")
            return
        if not isinstance(parsed, dict):
            await self._refuse(send, f"The request body must be a JSON object, got {type(parsed).__name__}")
            return
        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Any, message: str) -> None:
        payload = json.dumps(_error_body(InvalidRequest(message))).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


def run_agent_server(host: str, port: int, database_url: str | None, model: str | None) -> None:
    """Serve an agent on `host`:`port` until interrupted (Ctrl-C or SIGTERM), then close it.

    Args:
        host: interface to bind, e.g. `"127.0.0.1"` (local only) or `"0.0.0.0"`.
        port: TCP port.
        database_url: as for `agent.create_agent`; None reads `AGENT_DATABASE_URL`,
            else the embedded SQLite file.
        model: as for `agent.create_agent`; None reads `AGENT_MODEL`, else offline
            unless an OpenAI key or base URL is set.

    Raises:
        ConfigurationError, StorageUnavailable: from `create_agent`, before the
            port is bound (the database is connected and set up first).
    """
    from agent import create_agent

    with create_agent(database_url, model) as agent:
        uvicorn.run(build_app(agent), host=host, port=port)


# -- errors ----------------------------------------------------------------------------------
def _error_body(exc: AgentError) -> dict[str, str]:
    return {"error_code": exc.error_code, "message": exc.message}


async def _agent_error_response(_request: Request, exc: AgentError) -> JSONResponse:
    return JSONResponse(_error_body(exc), status_code=http_status(exc))


async def _http_error_response(request: Request, exc: HTTPException):
    # MLflow turns a handler's exception into HTTPException(500, str(exc)) raised
    # while handling it, so the AgentError is the HTTPException's __context__.
    if isinstance(exc.__context__, AgentError):
        return await _agent_error_response(request, exc.__context__)
    return await http_exception_handler(request, exc)


def _error_event(exc: AgentError) -> dict[str, Any]:
    # `type`/`code`/`message` is the Responses API's error event; the `error`
    # object makes the openai client raise APIError with the message.
    return {"type": "error", "code": exc.error_code, "message": exc.message, "error": _error_body(exc)}


def _tag_server_trace(event: Any) -> None:
    # The agent's own trace of the stream is tagged by the agent; this tags the
    # server's span around it, which MLflow starts only after the first event.
    outputs = getattr(event, "custom_outputs", None)
    if outputs and outputs.get("thread_id"):
        tag_trace(outputs["thread_id"], outputs.get("checkpoint_id"), outputs.get("parent_checkpoint_id"))
