"""The OpenAI-dialect endpoints besides `POST /responses`: stored responses and the Conversations API.

Routes (what the `openai` client calls; shapes in `agent.operations.conversations`):

| route | `openai` client | does |
|---|---|---|
| `GET /responses/{id}` | `responses.retrieve(id)` | the response at checkpoint `id` (`resp_<checkpoint_id>`): that turn's output items (its questions' `mcp_approval_request` items included); a run's status while it is queued or runs, or why it failed (`run_views`) |
| `GET /responses/{id}?stream=true&starting_after=N` | `responses.retrieve(id, stream=True, starting_after=N)` | its events after N, then live to its end, from any replica (`agent.runs`) |
| `POST /responses/{id}/cancel` | `responses.cancel(id)` | stops a queued or running turn from any replica, nothing written |
| `DELETE /responses/{id}` | `responses.delete(id)` | deletes its stored run record (status, events); its checkpoint stays (`run_views`) |
| `GET /responses/{id}/input_items` | `responses.input_items.list(id)` | the items that led to it, paged |
| `POST /conversations` | `conversations.create(metadata=, items=)` | a new thread, with those messages (one checkpoint) |
| `GET /conversations/{id}` | `conversations.retrieve(id)` | the thread as a conversation |
| `POST /conversations/{id}` | `conversations.update(id, metadata=)` | replaces its metadata |
| `DELETE /conversations/{id}` | `conversations.delete(id)` | deletes the thread, every checkpoint of it |
| `GET /conversations/{id}/items` | `conversations.items.list(id, limit=, after=, order=)` | the head's messages, paged |
| `POST /conversations/{id}/items` | `conversations.items.create(id, items=)` | `update_checkpoint_state` on the head; a `function_call_output` must answer a call, as in a turn's input |
| `GET /conversations/{id}/items/{item_id}` | `conversations.items.retrieve(item_id, conversation_id=id)` | one of the head's messages |
| `DELETE /conversations/{id}/items/{item_id}` | `conversations.items.delete(item_id, conversation_id=id)` | `update_checkpoint_state(remove_message_ids=[item_id])` on the head |

A conversation id is the thread id itself (see `agent.operations.conversations`), and a thread id may
hold `/` (`custom_inputs.thread_id="team/alice-1"`). The `openai` client percent-encodes it
(`team%2Falice-1`), but the ASGI server decodes the path before Starlette routes it, so a
`{conversation_id}` parameter (one path segment) never matched such an id: every conversation route
answered a bare 404. The routes take the id with Starlette's `path` converter instead, the routes
with a suffix (`/items`, `/items/{item_id}`) first, so the suffix is the route's and the rest the id. Left
ambiguous: an id whose last or last but one part is `items` (`team/items` reads as the items of `team`);
such a thread is reached with `custom_inputs.thread_id`. Refusing `/` in thread ids was not this dialect's choice to make: ids are
chosen through every API, and this one only reads them.

**Who is calling.** GET and DELETE requests have no body, so the caller's
user_id comes from the trusted header named by the `user_id_header` setting
(e.g. `X-Forwarded-User`, which Databricks Apps set after authenticating the
user). When it is set, that header is the caller on every route of the server,
`/responses` and `/invocations` included: a `user_id` in a request body must
equal it, and a request without it is anonymous (a body may not name a user
in its place). When it is not set, these routes act as an anonymous caller:
they see only threads that have no owner. Another user's response or
conversation answers 404, exactly as one that does not exist.

Errors answer in OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`
(`serving.errors.openai_error_body`), so the `openai` client raises its typed
errors (`NotFoundError`, `BadRequestError`) with the agent's message. Request
bodies are checked strictly: an unknown field is a 400, never ignored. The ids
in a path (`response_id`, `conversation_id`) are checked before anything is read,
as a body's ids are (`agent.validation.check_id`): one holding a control character
(`/responses/resp_%00abc`), or longer than 256 characters, is a 400 on every route
and backend. Unchecked, a NUL reached Postgres, whose text cannot hold one (a 500),
while SQLite answered 404.
Blocking storage work runs on the agent's storage thread pool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agent.errors import AgentError, InvalidRequest, ResponseNotFound, shown_id
from agent.operations import conversations as ops
from agent.operations.branches import get_checkpoint_state
from agent.operations.thread_values import check_metadata
from agent.serving import run_views
from agent.serving.errors import http_status, log_error_answer, openai_error_body
from agent.messages import to_langchain
from agent.requests import check_request_size
from agent.validation import check_id, encoded_size, required_id

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

#: Most items one `POST /conversations` or `.../items` may add (OpenAI's limit).
MAX_ITEMS_PER_CALL = 20


def caller(agent: LangGraphResponsesAgent, request: Request) -> str | None:
    """The caller's user_id: the `user_id_header` value (None when the setting or the header is absent)."""
    header = agent.settings.user_id_header
    if not header:
        return None
    return check_id(f"the {header} header", request.headers.get(header)) if request.headers.get(header) else None


def openai_router(agent: LangGraphResponsesAgent) -> APIRouter:
    """The routes of the module docstring, bound to `agent`. `build_app` mounts it on every server."""
    router = APIRouter()
    context = agent.operation_context
    storage = context.storage

    async def answer(request: Request, work: Callable[[str | None, dict[str, Any]], Any]) -> JSONResponse:
        """Run `work(user_id, body)`: a read (GET) on the storage pool, a write (it may wait for its thread's
        claim: a conversation's items) on the updates' pool; an AgentError answers in OpenAI's shape."""
        raw = await request.body() if request.method == "POST" else b""
        try:
            _path_ids(request)
            user_id = caller(agent, request)
            body = _json_object(raw) if request.method == "POST" else {}
            check_request_size(body, agent.settings)  # as turns and actions are
            run = context.in_io if request.method == "GET" else context.in_update
            return JSONResponse(await run(work, user_id, body))
        except AgentError as exc:
            code = http_status(exc)
            body = openai_error_body(exc)
            log_error_answer(request.method, request.url.path, code, body, exc)
            return JSONResponse(body, status_code=code)

    @router.get("/responses/{response_id}", response_model=None)
    async def retrieve_response(response_id: str, request: Request) -> JSONResponse | StreamingResponse:
        """The response `response_id`: a run's status (`agent.runs`: queued, in_progress, failed, cancelled) or,
        once done, the whole response; `?stream=true&starting_after=N`: its events after N, live to its end."""
        if request.query_params.get("stream", "false") == "true":
            return await resume_stream(response_id, request)

        def retrieve(user: str | None, body: dict) -> dict[str, Any]:
            _query(request, allowed=("include", "stream", "starting_after"))
            if request.query_params.get("stream", "false") != "false" or request.query_params.getlist("include"):
                raise InvalidRequest("stream must be true or false, and include is not supported")
            return run_views.retrieve(agent, response_id, user)

        return await answer(request, retrieve)

    async def resume_stream(response_id: str, request: Request) -> JSONResponse | StreamingResponse:
        """The run's stream events after `starting_after` (-1: all), as server-sent events ending with `[DONE]`."""
        try:
            _path_ids(request)
            _query(request, allowed=("stream", "starting_after", "include"))
            after = _starting_after(request)
            user = caller(agent, request)
            if await context.in_io(agent.runs.get, response_id, user) is None:  # unknown or foreign: 404 now
                raise ResponseNotFound(f"Response {shown_id(response_id)} has no stored events (it was not streamed, or "
                                       "ended more than response_events_seconds ago).", response_id=response_id)  # fmt: skip
        except AgentError as exc:
            code, body = http_status(exc), openai_error_body(exc)
            log_error_answer(request.method, request.url.path, code, body, exc)
            return JSONResponse(body, status_code=code)

        async def sse() -> Any:
            events = agent.runs.follow(response_id, user, after, context.in_io)
            try:
                async for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
            except AgentError as exc:  # swept between the check and the read: OpenAI's error event
                yield f"data: {json.dumps({'type': 'error', **openai_error_body(exc)['error'], 'sequence_number': after + 1})}\n\n"
            finally:
                await events.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    @router.post("/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, request: Request) -> JSONResponse:
        """Stop a queued or running response from any replica; nothing of it is written."""

        def cancel(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            _fields(body, allowed=())
            return run_views.cancel(agent, response_id, user)

        return await answer(request, cancel)

    @router.delete("/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> JSONResponse:
        """Delete the response's stored record (its run: status and events); its checkpoint is kept (`run_views`)."""

        def delete(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            return run_views.delete(agent, response_id, user)

        return await answer(request, delete)

    @router.get("/responses/{response_id}/input_items")
    async def response_input_items(response_id: str, request: Request) -> JSONResponse:
        """The items that led to the response, paged (`after`, `limit`, `order`; newest first by default)."""
        return await answer(
            request, lambda user, body: ops.response_input_items(storage, response_id, user_id=user, **_paging(request))
        )

    @router.post("/conversations")
    async def create_conversation(request: Request) -> JSONResponse:
        """A new thread owned by the caller, with `items` (one checkpoint) and `metadata`."""

        def create(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            _fields(body, allowed=("items", "metadata"))
            items = _items(body.get("items") or [])
            metadata = _metadata(body.get("metadata"))
            thread_id = str(uuid.uuid4())
            encoded_size("items", items)  # refuses lone surrogates, as turns do
            context.turns.update_state(
                thread_id, None, to_langchain(items), user_id=user, new_thread=True, metadata=metadata or None,
                answered_tool_results=True,  # an orphan function_call_output: refused, as in a turn's input
            )
            return ops.conversation_object(ops.get_conversation(storage, thread_id, user_id=user))

        return await answer(request, create)

    # The item routes come first: `{conversation_id:path}` also matches `<id>/items`, and Starlette takes the
    # first route that matches (the module docstring says which ids this leaves ambiguous).
    @router.get("/conversations/{conversation_id:path}/items/{item_id}")
    async def retrieve_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
        """The item `item_id` of the head's messages."""

        def retrieve(user: str | None, body: dict) -> dict[str, Any]:
            _query(request, allowed=("include",))
            if request.query_params.getlist("include"):
                raise InvalidRequest("include is not supported: no extra output data is available")
            return ops.conversation_item(storage, conversation_id, item_id, user_id=user)

        return await answer(request, retrieve)

    @router.delete("/conversations/{conversation_id:path}/items/{item_id}")
    async def delete_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
        """Remove the item from the head: a new checkpoint without it (`update_checkpoint_state` with
        `remove_message_ids`), which becomes the head; the conversation, as OpenAI answers."""

        def delete(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            ops.conversation_item(storage, conversation_id, item_id, user_id=user)  # unknown: 404 naming it
            agent.update_checkpoint_state(conversation_id, None, [], remove_message_ids=[item_id], user_id=user)
            return ops.conversation_object(ops.get_conversation(storage, conversation_id, user_id=user))

        return await answer(request, delete)

    @router.get("/conversations/{conversation_id:path}/items")
    async def list_items(conversation_id: str, request: Request) -> JSONResponse:
        """The head's messages as items, paged (`after`, `limit`, `order`; newest first by default)."""
        return await answer(
            request, lambda user, body: ops.conversation_items(storage, conversation_id, user_id=user, **_paging(request))
        )

    @router.post("/conversations/{conversation_id:path}/items")
    async def create_items(conversation_id: str, request: Request) -> JSONResponse:
        """Append `items` to the head: a new checkpoint (`update_checkpoint_state`), which becomes the head."""

        def add(user: str | None, body: dict) -> dict[str, Any]:
            _query(request, allowed=("include",))
            if request.query_params.getlist("include"):
                raise InvalidRequest("include is not supported: no extra output data is available")
            _fields(body, allowed=("items",), required=("items",))
            items = _items(body["items"])
            if not items:
                raise InvalidRequest("items must hold at least one item")
            ops.get_conversation(storage, conversation_id, user_id=user)  # unknown: 404, not a new thread
            encoded_size("items", items)  # refuses lone surrogates, as turns do
            # The state update with the turn's check of tool results: an output for a call the head does not
            # wait on is refused (naming its call_id), as in a turn's input, not stored for a model that never sees it.
            result = context.turns.update_state(
                conversation_id, None, to_langchain(items), user_id=user, answered_tool_results=True
            )
            state = get_checkpoint_state(storage, conversation_id, result.checkpoint_id, user_id=user, alternatives=False)
            return ops.added_items(state)

        return await answer(request, add)

    @router.get("/conversations/{conversation_id:path}")
    async def retrieve_conversation(conversation_id: str, request: Request) -> JSONResponse:
        def retrieve(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            return ops.conversation_object(ops.get_conversation(storage, conversation_id, user_id=user))

        return await answer(request, retrieve)

    @router.post("/conversations/{conversation_id:path}")
    async def update_conversation(conversation_id: str, request: Request) -> JSONResponse:
        """Replace the conversation's metadata (OpenAI's rule: the whole map)."""

        def update(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            _fields(body, allowed=("metadata",), required=("metadata",))
            agent.update_thread(conversation_id, metadata=_metadata(body["metadata"]), user_id=user)
            return ops.conversation_object(ops.get_conversation(storage, conversation_id, user_id=user))

        return await answer(request, update)

    @router.delete("/conversations/{conversation_id:path}")
    async def delete_conversation(conversation_id: str, request: Request) -> JSONResponse:
        def delete(user: str | None, body: dict) -> dict[str, Any]:
            _query(request)
            agent.delete_thread(conversation_id, user_id=user)
            return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

        return await answer(request, delete)

    return router


# -- request parsing (inside `answer`, so that a refusal answers in OpenAI's shape) ----------------------
def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    return body


def _fields(body: dict[str, Any], *, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequest(f"Unknown or unsupported fields {unknown}; this endpoint takes {list(allowed)}")
    missing = [key for key in required if body.get(key) is None]
    if missing:
        raise InvalidRequest(f"Missing fields {missing}")


def _items(items: Any) -> list[dict]:
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise InvalidRequest("items must be a list of Responses input items")
    if len(items) > MAX_ITEMS_PER_CALL:
        raise InvalidRequest(f"items has {len(items)} items; at most {MAX_ITEMS_PER_CALL} may be added at a time")
    return items


def _metadata(metadata: Any) -> dict[str, str]:
    return check_metadata(metadata) or {}  # the catalogue's rule (OpenAI's limits)


def _path_ids(request: Request) -> None:
    """Check the ids in the route's path (every path parameter of these routes is one) as a body's are.

    Raises:
        InvalidRequest: an id holds a control character (a NUL: Postgres text cannot hold one), or is too long.
    """
    for name, value in request.path_params.items():
        required_id(name, value)


def _query(request: Request, *, allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise InvalidRequest(f"Unknown query parameters {unknown}")


def _starting_after(request: Request) -> int:
    value = request.query_params.get("starting_after", "-1")
    try:
        number = int(value)
    except ValueError:
        raise InvalidRequest(f"starting_after must be an integer (a sequence_number), got {value!r}") from None
    if number < -1:
        raise InvalidRequest(f"starting_after must be -1 or more, got {number}")
    return number


def _paging(request: Request) -> dict[str, Any]:
    _query(request, allowed=("after", "limit", "order", "include"))
    params = request.query_params
    if params.getlist("include"):
        raise InvalidRequest("include is not supported: no extra output data is available")
    limit = params.get("limit", str(ops.DEFAULT_PAGE))
    try:
        number = int(limit)
    except ValueError:
        raise InvalidRequest(f"limit must be an integer from 1 to {ops.MAX_PAGE}, got {limit!r}") from None
    return {"after": params.get("after"), "limit": number, "order": params.get("order", "desc")}
