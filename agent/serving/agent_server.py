"""The MLflow Agent Server (`mlflow.genai.agent_server`) for one agent: its routes and error answers.

Endpoints (MLflow's): `POST /invocations` and `POST /responses` (the OpenAI
Responses API shape, so `openai.OpenAI(base_url=...).responses.create(...)`
works), both with `"stream": true` for server-sent events; `GET /health`
(liveness); `GET /agent/info`, answered here with the agent's name, version,
store kind and model instead of MLflow's generic payload. Added here: `GET
/ready` (503 while the database is unreachable), and the `Idempotency-Key`
request header on `/invocations` and `/responses` (as `custom_inputs.idempotency_key`).

What this module adds to MLflow's server:

* **Async handlers.** The handlers await the agent's `apredict` /
  `apredict_stream`: a turn waiting for its model holds no OS thread and no
  database connection, so hundreds of streams share one process. (MLflow
  calls a synchronous handler on the event loop, and a streamed sync
  generator needs a worker thread per chunk; with Starlette's 40 threads the
  first release deadlocked at 100 streams.)
* **A client that leaves cancels its turn**: the stream's task is cancelled,
  which cancels the model request and releases the thread at once.
* **Errors keep their status.** MLflow answers any handler exception with 500
  (mlflow 3.17, `AgentServer._handle_invoke_request`) and reports a streaming
  error inside a 200 stream. Here an `AgentError` answers with its own status
  (`serving.errors`: 400, 404, 409, 503) and the JSON body
  `{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "..."}`, also for a
  stream that fails before its first event. A stream that fails later (the
  status is already sent) ends with one `{"type": "error", "code": ...,
  "message": ..., "error": {...}}` event and `[DONE]`; the `openai` client
  raises `openai.APIError` with the message. No traceback ever reaches a client.

MLflow keeps the `@invoke()` / `@stream()` handlers in module globals, so a
process serves one agent: `build_app(agent)` binds it (a second call rebinds).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import mlflow
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, StreamingResponse
from mlflow.genai.agent_server import AgentServer, get_request_headers, get_stream_function, invoke, stream
from mlflow.genai.agent_server.validator import ResponsesAgentValidator
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.errors import AgentError, InvalidRequest
from agent.requests import keeping_item_ids
from agent.responses import LangGraphResponsesAgent
from agent.serving.errors import error_body, http_status
from agent.serving.limits import RequestBodyLimits, body_limit
from agent.tracing import scrub_trace_inputs, tag_trace

_bound_agent: LangGraphResponsesAgent | None = None


def _agent() -> LangGraphResponsesAgent:
    if _bound_agent is None:
        raise AgentError("No agent is bound to this server; call build_app(agent) first.")
    return _bound_agent


def _idempotency_header() -> str | None:
    # MLflow's server stores each request's headers (lower-cased by Starlette) in a context variable.
    return get_request_headers().get("idempotency-key")


@invoke()
async def respond(request: ResponsesAgentRequest) -> ResponsesAgentResponse:
    """One whole turn (or `custom_inputs.action`) with the bound agent's `apredict`."""
    try:
        return await _agent().apredict(request, idempotency_key=_idempotency_header())
    except InvalidRequest:
        scrub_trace_inputs()  # MLflow's server span recorded the refused request too
        raise


@stream()
async def respond_stream(request: ResponsesAgentRequest) -> AsyncIterator[ResponsesAgentStreamEvent]:
    """The bound agent's `apredict_stream` events; the last one carries `custom_outputs`."""
    async for event in _agent().apredict_stream(request, idempotency_key=_idempotency_header()):
        yield event


class _KeepItemIds(ResponsesAgentValidator):
    """MLflow's request validation, keeping the input items' ids (see `agent.requests.ItemIdsRequest`)."""

    def validate_and_convert_request(self, data: dict[str, Any]) -> ResponsesAgentRequest:
        self.validate_pydantic(ResponsesAgentRequest, data)
        return keeping_item_ids(data)


class _ResponsesAgentServer(AgentServer):
    """MLflow's `AgentServer`, except that a stream's first event is produced before the response starts,
    and requests keep their input items' ids."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.validator = _KeepItemIds()

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
                await events.aclose()  # also when the client left: ends the turn, nothing written

        replay.__name__ = handler.__name__  # MLflow names the server's span after it
        return StreamingResponse(self._generate(replay, request, return_trace_id), media_type="text/event-stream")


def build_app(agent: LangGraphResponsesAgent) -> FastAPI:
    """The Agent Server's FastAPI app, with `agent` answering `/invocations` and `/responses`.

    Binds `agent` to this module's handlers (one agent per process; a second
    call rebinds). The caller keeps ownership of `agent` and closes it.

    Returns:
        A FastAPI app to serve with uvicorn (`agent.serving.app` does).
    """
    global _bound_agent
    _bound_agent = agent
    app = _ResponsesAgentServer("ResponsesAgent").app
    app.add_exception_handler(AgentError, _agent_error_response)
    app.add_exception_handler(HTTPException, _http_error_response)
    app.add_middleware(RequestBodyLimits, max_bytes=body_limit(agent.settings.max_request_bytes))

    _replace_agent_info(app, agent)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 when the database answers, 503 otherwise (for load balancers' readiness probes)."""
        up = await agent.threads.in_io(agent.threads.storage.ready)
        return JSONResponse({"status": "ready" if up else "database unreachable"}, status_code=200 if up else 503)

    return app


def _replace_agent_info(app: FastAPI, agent: LangGraphResponsesAgent) -> None:
    # MLflow's GET /agent/info names a generic "mlflow_agent_server"; say what actually runs
    # (`AgentInfo.public_dict`: the store's kind, never its URL), keeping MLflow's other keys.
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/agent/info"]
    info = {**agent.info().public_dict(), "use_case": "agent", "agent_api": "responses", "mlflow_version": mlflow.__version__}

    @app.get("/agent/info")
    async def agent_info() -> dict[str, Any]:
        """The agent's name, version, store kind (postgres, sqlite, memory) and model name."""
        return info


# -- errors ----------------------------------------------------------------------------------
async def _agent_error_response(_request: Request, exc: AgentError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=http_status(exc))


async def _http_error_response(request: Request, exc: HTTPException):
    # MLflow turns a handler's exception into HTTPException(500, str(exc)) raised
    # while handling it, so the AgentError is the HTTPException's __context__.
    if isinstance(exc.__context__, AgentError):
        return await _agent_error_response(request, exc.__context__)
    return await http_exception_handler(request, exc)


def _error_event(exc: AgentError) -> dict[str, Any]:
    # `type`/`code`/`message` is the Responses API's error event; the `error`
    # object makes the openai client raise APIError with the message.
    body = error_body(exc)
    return {"type": "error", "code": body["error_code"], "message": exc.message, "error": body}


def _tag_server_trace(event: Any) -> None:
    # The agent's own trace of the stream is tagged by the agent; this tags the
    # server's span around it, which MLflow starts only after the first event.
    outputs = getattr(event, "custom_outputs", None)
    if outputs and outputs.get("thread_id"):
        tag_trace(outputs["thread_id"], outputs.get("checkpoint_id"), outputs.get("parent_checkpoint_id"))
