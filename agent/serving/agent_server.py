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
  which cancels the model request and releases the thread at once. With `finish_left_streams`
  the turn runs on to its end instead (its events are recorded, `agent.runs`), so the client can
  resume it with `GET /responses/{id}?stream=true&starting_after=N`; it keeps its place under the
  admission bound until it ends (`agent.runs.places`).
* **One trace per turn**: the server's span covers the whole turn, the first
  model call of a stream included; the turn's model calls are spans inside it
  (`agent.tracing`), and the trace is tagged with the thread and checkpoints.
  An action (a read, a state edit) gets no span unless `trace_actions` is set.
* **Errors keep their status.** MLflow answers any handler exception with 500
  (mlflow 3.17, `AgentServer._handle_invoke_request`) and reports a streaming
  error inside a 200 stream. Here an `AgentError` answers with its own status
  (`serving.errors`: 400, 404, 409, 503) and the route's JSON body: OpenAI's
  `{"error": {"message", "type", "code", "param"}}` on `/responses` and
  `/conversations`, MLflow's `{"error_code": "RESOURCE_DOES_NOT_EXIST", "message":
  "..."}` on `/invocations`; also for a stream that fails before its first output
  (`response.created` and `response.in_progress` wait for it). A stream that
  fails later (the status is already sent) ends with one `{"type": "error",
  "code": ..., "message": ..., "error": {...}}` event (on `/responses` also
  `param` and `sequence_number`: OpenAI's error event) and `[DONE]`; the `openai`
  client raises `openai.APIError` with the message and code. No traceback ever
  reaches a client. Every other error answer (bad JSON, unknown routes, wrong
  methods, a body too large, too deep or too slow) has the same body. A 4xx is logged as one line,
  a 5xx with its traceback (`serving.errors.log_error_answer`).
* **Turns at once.** At most `max_running_turns` turns run at once in the process, up to
  `max_waiting_turns` more wait (a waiting turn whose client leaves leaves the queue), and
  beyond that a turn is refused with 429 and `Retry-After`, nothing written
  (`serving.admission`); background runs and left streams count until their turn ends. Actions, `/health`, `/ready` and every other route never wait behind turns.
* **Browsers and bandwidth.** With `cors_origins` set, Starlette's `CORSMiddleware`
  answers preflights from those origins (others get no CORS headers); answers of
  1 kB or more are gzip-compressed for clients that accept it (`GZipMiddleware`,
  which leaves server-sent event streams uncompressed, so they still stream).
* **Typed `GET /openapi.json`.** Every route's request and answers, from existing
  pydantic models (`serving.schemas`).
* **The web page** at `/` (`serving.web`): static files that speak this same API.
* **One trusted user header.** With `user_id_header` set, a request carrying
  that header twice, or a comma-joined list in it, is a 400 before any route
  runs (`serving.identity` says why).

MLflow keeps the `@invoke()` / `@stream()` handlers in module globals, so a
process serves one agent: `build_app(agent)` binds it (a second call rebinds).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import json
from collections.abc import AsyncIterator
from typing import Any

import mlflow
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from mlflow.genai.agent_server import (
    AgentServer,
    get_invoke_function,
    get_request_headers,
    get_stream_function,
    invoke,
    stream,
)
from mlflow.pyfunc import ResponsesAgent
from mlflow.tracing.constant import SpanAttributeKey
from mlflow.genai.agent_server.validator import ResponsesAgentValidator
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware

from agent.errors import AgentError, InvalidRequest, validation_problems
from agent.requests import keeping_item_ids, with_string_input
from agent.responses import LangGraphResponsesAgent, traces
from agent.runs import run_cancelled
from agent.runs.places import keep_request_place
from agent.serving.admission import TurnAdmission
from agent.serving.origins import BrowserGuard
from agent.serving.errors import answer_body, http_status, log_error_answer, speaks_openai, status_answer_body
from agent.serving.identity import TrustedUserHeader
from agent.serving.limits import RequestBodyLimits, body_limit
from agent.serving.openai import openai_router
from agent.serving.schemas import with_typed_openapi
from agent.serving.web import mount_web_page
from agent.tracing import scrub_trace_inputs, tag_trace

_bound_agent: LangGraphResponsesAgent | None = None


def _agent() -> LangGraphResponsesAgent:
    if _bound_agent is None:
        raise AgentError("No agent is bound to this server; call build_app(agent) first.")
    return _bound_agent


def _idempotency_header() -> str | None:
    # MLflow's server stores each request's headers (lower-cased by Starlette) in a context variable.
    return get_request_headers().get("idempotency-key")


def _caller() -> dict[str, Any]:
    """`apredict`'s caller keywords: the trusted user header's value when the agent has `user_id_header`."""
    header = _agent().settings.user_id_header
    if not header:
        return {}
    return {"user_id": get_request_headers().get(header.lower()) or None, "trusted_user": True}


@invoke()
async def respond(request: ResponsesAgentRequest) -> ResponsesAgentResponse:
    """One whole turn (or `custom_inputs.action`) with the bound agent's `apredict`."""
    try:
        return await _agent().apredict(request, idempotency_key=_idempotency_header(), **_caller())
    except InvalidRequest:
        scrub_trace_inputs()  # MLflow's server span recorded the refused request too
        raise


@stream()
async def respond_stream(request: ResponsesAgentRequest) -> AsyncIterator[ResponsesAgentStreamEvent]:
    """The bound agent's `apredict_stream` events; the last one is `response.completed`, with `custom_outputs`."""
    try:
        # OpenAI's whole event set on its route; `/invocations` keeps MLflow's stream.
        openai_events = speaks_openai(_route.get())
        async for event in _agent().apredict_stream(
            request, idempotency_key=_idempotency_header(), openai_events=openai_events, **_caller()
        ):
            yield event
    except InvalidRequest:
        scrub_trace_inputs()
        raise


class _KeepItemIds(ResponsesAgentValidator):
    """MLflow's request validation, keeping the input items' ids and the top-level fields its schema drops
    (`previous_response_id`, `conversation`, `instructions`: see `agent.requests.ItemIdsRequest`), and
    taking `input` as a string (one user message)."""

    def validate_and_convert_request(self, data: dict[str, Any]) -> ResponsesAgentRequest:
        if not isinstance(data, dict):
            self.validate_pydantic(ResponsesAgentRequest, data)
            return keeping_item_ids(data)
        data = with_string_input(data)
        try:
            ResponsesAgentRequest(**data)
        except Exception as exc:
            # MLflow's `validate_pydantic` puts pydantic's whole text in the 400 (newlines, validator names,
            # documentation links); this is the one line `predict` gives (`agent.errors.validation_problems`).
            reason = validation_problems(exc.errors(include_url=False)) if isinstance(exc, ValidationError) else str(exc)
            raise ValueError(f"Invalid data for ResponsesAgentRequest: {reason}") from None
        return keeping_item_ids(data)


class _ResponsesAgentServer(AgentServer):
    """MLflow's `AgentServer`, with the turn's span around the whole turn, error answers of our own,
    and requests that keep their input items' ids (`_KeepItemIds`).

    Overrides (mlflow 3.17, `mlflow.genai.agent_server.server`):

    * `_handle_invoke_request`: MLflow logs every handler exception with
      `logger.exception` (a 48-line traceback for a 404) and answers 500; here the
      exception propagates to the app's handlers (`_agent_error_response`), which
      answer with its status and log a 4xx as one line.
    * `_handle_stream_request`: Starlette sends the status line before pulling
      the body, so a turn refused at its start (unknown thread, busy thread, bad
      ids) must fail before the response starts to get a 4xx; MLflow's version
      would send 200 and an error event. The stream therefore runs in a task of
      its own, started here, inside the turn's span (MLflow opens its span only
      when the response starts pulling, after the first event: the first model
      call would be outside the trace). A client that leaves cancels that task,
      which ends the turn, writing nothing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.validator = _KeepItemIds()

    async def _handle_invocations_request(self, request: Request) -> Any:
        # `/invocations` and `/responses` share MLflow's handler; a stream's error event has the shape of its route.
        _route.set(request.url.path)
        return await super()._handle_invocations_request(request)

    async def _handle_invoke_request(self, request: ResponsesAgentRequest, return_trace_id: bool) -> dict[str, Any]:
        handler = get_invoke_function()
        if handler is None:
            raise HTTPException(status_code=500, detail="No invoke function registered")
        if not traces(request, _agent().settings):
            return self.validator.validate_and_convert_result(await handler(request))
        with mlflow.start_span(name=handler.__name__) as span:
            span.set_inputs(request)
            result = self.validator.validate_and_convert_result(await handler(request))
            _tag_trace_from(result.get("custom_outputs"))
            span.set_attribute(SpanAttributeKey.MESSAGE_FORMAT, "openai")
            if return_trace_id:
                result["metadata"] = (result.get("metadata") or {}) | {"trace_id": span.trace_id}
            span.set_outputs(result)
        return result

    async def _handle_stream_request(self, request: ResponsesAgentRequest, return_trace_id: bool) -> StreamingResponse:
        handler = get_stream_function()
        if handler is None:
            raise HTTPException(status_code=500, detail="No stream function registered")
        events = _StreamEvents(maxsize=STREAM_BUFFER_EVENTS)
        producer = asyncio.create_task(self._produce(handler, request, return_trace_id, events))
        # `response.created` and `response.in_progress` go out with the turn's first output, so that a turn
        # whose model fails before it answers still answers with its status (as one refused at its start).
        lead: list[dict[str, Any]] = []
        try:
            first = await events.get()
            while isinstance(first, dict) and first.get("type") in LIFECYCLE_EVENTS:
                lead.append(first)
                first = await events.get()
        except BaseException:
            producer.cancel()
            raise
        if isinstance(first, BaseException):  # refused before its first output: a 4xx/5xx answer
            await asyncio.gather(producer, return_exceptions=True)
            raise first
        route = _route.get()

        async def sse() -> AsyncIterator[str]:
            try:
                for item in lead:
                    yield f"data: {json.dumps(item)}\n\n"
                sequence = lead[-1]["sequence_number"] + 1 if lead else 0
                item = first
                while item is not _END:
                    if isinstance(item, BaseException):  # failed after the status went out
                        yield f"data: {json.dumps(_error_event(item, route, sequence))}\n\n"
                        break
                    yield f"data: {json.dumps(item)}\n\n"
                    sequence = item.get("sequence_number", sequence - 1) + 1
                    item = await events.get()
                yield "data: [DONE]\n\n"
            finally:
                if _agent().settings.finish_left_streams and not producer.done():
                    # The turn runs on to its end (its events are recorded: `agent.runs`); the client may resume.
                    events.left = True
                    _agent().runs.tasks.add(producer)
                    producer.add_done_callback(_agent().runs.tasks.discard)
                    place = keep_request_place()  # it still counts under the admission bound until it ends
                    if place is not None:
                        producer.add_done_callback(lambda _: place.release())
                else:
                    producer.cancel()  # also when the client left: ends the turn, nothing written
                    await asyncio.gather(producer, return_exceptions=True)

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def _produce(self, handler: Any, request: ResponsesAgentRequest, return_trace_id: bool,
                       events: asyncio.Queue) -> None:  # fmt: skip
        """Run the stream handler inside the turn's span, putting each event (as a dict), then `_END`, on
        `events`; an exception is put instead of raised (the consumer decides its answer)."""
        chunks: list[dict[str, Any]] = []
        try:
            if not traces(request, _agent().settings):
                # An action (a read): one answer event, no span (`agent.tracing`, "What is traced").
                stream = handler(request)
                try:
                    async for event in stream:
                        await events.put(self.validator.validate_and_convert_result(event, stream=True))
                finally:
                    await stream.aclose()
                await events.put(_END)
                return
            with mlflow.start_span(name=handler.__name__) as span:
                span.set_inputs(request)
                stream = handler(request)
                try:
                    async for event in stream:
                        chunk = self.validator.validate_and_convert_result(event, stream=True)
                        _tag_trace_from(chunk.get("custom_outputs"))
                        chunks.append(chunk)
                        await events.put(chunk)
                finally:
                    await stream.aclose()
                span.set_attribute(SpanAttributeKey.MESSAGE_FORMAT, "openai")
                span.set_outputs(ResponsesAgent.responses_agent_output_reducer(chunks))
                if return_trace_id:
                    await events.put({"trace_id": span.trace_id})
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which answers or ends the stream
            await events.put(exc)
            return
        except asyncio.CancelledError as exc:
            # A cancel asked for the run reaches the turn inside it (`Recorder.cancelled`: RunCancelled, above)
            # unless the client stopped reading: then it lands here, in a put waiting for room in `events`; the
            # turn's stream was closed, its end recorded, and the client would get no end at all.
            cancelled = run_cancelled(exc)
            if cancelled is None:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            events.end(cancelled)
            return
        await events.put(_END)


class _StreamEvents(asyncio.Queue):
    """A stream's events between its producer and the client; once the client `left` (with
    `finish_left_streams`), the producer's puts are dropped, so the turn runs on without waiting for it.

    `end(item)` puts the stream's last item without waiting for room, after the item whose put was cancelled
    (it was recorded, so a resumed stream has it): a client that stopped reading gets both when it reads again.
    """

    left = False

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize=maxsize)
        self.unsent: list[Any] = []  # the item whose put was cancelled
        self.after: collections.deque[Any] = collections.deque()  # items past the bound, got once the rest are

    async def put(self, item: Any) -> None:
        if self.left:
            return
        try:
            await super().put(item)
        except asyncio.CancelledError:
            self.unsent = [item]
            raise

    def end(self, item: Any) -> None:
        if self.left:
            return
        for one in (*self.unsent, item):
            if self.after or self.full():
                self.after.append(one)
            else:
                self.put_nowait(one)
        self.unsent = []

    async def get(self) -> Any:
        if self.empty() and self.after:
            return self.after.popleft()
        return await super().get()


#: Smallest answer body compressed (when the client accepts gzip).
GZIP_MIN_BYTES = 1024

#: Events a stream's producer may run ahead of a slow client.
STREAM_BUFFER_EVENTS = 64
#: The events that open a stream, sent with the first event after them (`_handle_stream_request`).
LIFECYCLE_EVENTS = frozenset({"response.created", "response.in_progress"})
_END = object()
#: The path of the request a stream answers (`/responses` or `/invocations`).
_route: contextvars.ContextVar[str] = contextvars.ContextVar("route", default="/invocations")


def build_app(agent: LangGraphResponsesAgent) -> FastAPI:
    """The Agent Server's FastAPI app, with `agent` answering `/invocations` and `/responses`.

    Binds `agent` to this module's handlers (one agent per process; a second
    call rebinds). The caller keeps ownership of `agent` and closes it.

    Every error answer has the body of its route (`serving.errors.answer_body`: OpenAI's
    on `/responses` and `/conversations`, `{"error_code", "message"}` elsewhere): the agent's errors, MLflow's and FastAPI's `HTTPException`s (bad JSON,
    invalid parameters, unknown routes, wrong methods), request validation
    errors, and any other exception (500, "Internal error", the traceback only in
    the log).

    Returns:
        A FastAPI app to serve with uvicorn (`agent.serving.app` does).
    """
    global _bound_agent
    _bound_agent = agent
    app = _ResponsesAgentServer("ResponsesAgent").app
    app.add_exception_handler(AgentError, _agent_error_response)
    app.add_exception_handler(StarletteHTTPException, _http_error_response)
    app.add_exception_handler(RequestValidationError, _validation_error_response)
    app.add_exception_handler(Exception, _unexpected_error_response)
    # Inside the body limits (added first, so it runs after them): a turn waits with its body read and checked.
    app.add_middleware(
        TurnAdmission,
        max_running=agent.settings.max_running_turns,
        max_waiting=agent.settings.max_waiting_turns,
        lag_target=agent.settings.loop_lag_target_seconds,
    )
    app.add_middleware(
        RequestBodyLimits, max_bytes=body_limit(agent.settings.max_request_bytes), timeout=agent.settings.body_timeout
    )
    if agent.settings.user_id_header:  # added late, so it runs early: a doubled header is refused before the body is read
        app.add_middleware(TrustedUserHeader, name=agent.settings.user_id_header)
    # Compress answers of 1 kB or more for clients that accept gzip (a long thread's state is mostly repeated JSON
    # keys). Starlette leaves text/event-stream alone, so streamed turns still stream event by event. Level 6:
    # nearly level 9's ratio on JSON for much less CPU.
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6)
    # Before the body is read: a write that another site's page made a browser send, or a host not served, is
    # refused unread (`serving.origins`). Inside CORS, which answers preflights (they only read).
    app.add_middleware(
        BrowserGuard, cors_origins=agent.settings.cors_origins, allowed_hosts=agent.settings.allowed_hosts
    )
    if agent.settings.cors_origins:  # outermost: a preflight is answered before anything else runs
        app.add_middleware(
            CORSMiddleware,
            allow_origins=agent.settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],  # the openai client's own headers, Idempotency-Key, content-type
        )

    _replace_agent_info(app, agent)
    app.include_router(openai_router(agent))
    mount_web_page(app, agent.settings.user_id_header)
    with_typed_openapi(app)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 when the database answers, 503 otherwise (for load balancers' readiness probes), within
        `connect_timeout` + `reply_timeout`."""
        # The storage bounds each round trip; this bounds the whole check (a checkout waiting on a full pool),
        # leaving its thread to end on its own.
        bound = agent.settings.connect_timeout + agent.settings.reply_timeout
        try:
            up = await asyncio.wait_for(agent.operation_context.in_io(agent.storage.ready), bound)
        except TimeoutError:
            up = False
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
async def _agent_error_response(request: Request, exc: AgentError) -> JSONResponse:
    body, status = answer_body(request.url.path, exc), http_status(exc)
    log_error_answer(request.method, request.url.path, status, body, exc)
    return JSONResponse(body, status_code=status)


async def _http_error_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc.__context__, AgentError):  # an AgentError some MLflow code wrapped
        return await _agent_error_response(request, exc.__context__)
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail, default=str)
    body = status_answer_body(request.url.path, exc.status_code, message)
    log_error_answer(request.method, request.url.path, exc.status_code, body, exc)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _validation_error_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    body = status_answer_body(request.url.path, 400, f"Invalid request: {validation_problems(list(exc.errors()))}")
    log_error_answer(request.method, request.url.path, 400, body)
    return JSONResponse(body, status_code=400)


async def _unexpected_error_response(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises the exception after this answer, and uvicorn logs it with its traceback.
    body = status_answer_body(request.url.path, 500, f"Internal error ({type(exc).__name__}); see the server log.")
    return JSONResponse(body, status_code=500)


def _error_event(exc: BaseException, route: str, sequence_number: int) -> dict[str, Any]:
    # `type`/`code`/`message`/`param`/`sequence_number` is the Responses API's error event; the `error`
    # object (the route's error body) makes the openai client raise APIError with its message and code.
    if isinstance(exc, AgentError):
        body, status = answer_body(route, exc), http_status(exc)
    else:
        body, status = status_answer_body(route, 500, f"Internal error ({type(exc).__name__}); see the server log."), 500
    log_error_answer("POST", f"{route} (stream, after its first event)", status, body, exc)
    if speaks_openai(route):
        error = body["error"]
        return {"type": "error", "sequence_number": sequence_number, "code": error["code"], "message": error["message"],
                "param": error["param"], "error": error}  # fmt: skip
    return {"type": "error", "code": body["error_code"], "message": body["message"], "error": body}


def _tag_trace_from(custom_outputs: dict[str, Any] | None) -> None:
    # Turns tag their trace themselves; actions run on the storage thread pool,
    # out of the span's context, so the server tags their trace from what they answered.
    if custom_outputs and custom_outputs.get("thread_id"):
        tag_trace(custom_outputs["thread_id"], custom_outputs.get("checkpoint_id"), custom_outputs.get("parent_checkpoint_id"))
