"""Typed `GET /openapi.json`: the request and answer of every route, from pydantic models that already exist.

MLflow's routes (`/invocations`, `/responses`) and the OpenAI-dialect routes (`serving.openai`) read the raw
`Request` so that their errors keep this project's shapes (a FastAPI body model would answer its own 422), so
FastAPI finds no model to describe them and its schema said nothing of their bodies. `with_typed_openapi`
fills the generated schema in from `ROUTES`: MLflow's `ResponsesAgentRequest`, `ResponsesAgentResponse` and
`ResponsesAgentStreamEvent` (the data of each server-sent event of a streamed turn) for the Agent Server,
the `openai` package's own models (`Response`, `Conversation`, ...) for the OpenAI dialect, and the error
bodies of `serving.errors`. The models are imported and their JSON schemas built on the first request for
the schema, not at start-up (the `openai` types take seconds to import).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, RootModel, TypeAdapter

from agent.operations.conversations import DEFAULT_PAGE, MAX_PAGE

if TYPE_CHECKING:
    from fastapi import FastAPI

#: Where a schema's definitions go (OpenAPI's components).
REF_TEMPLATE = "#/components/schemas/{model}"


class ErrorAnswer(BaseModel):
    """The body of every error answer but the OpenAI dialect's (`serving.errors`): MLflow's error shape."""

    error_code: str = Field(examples=["RESOURCE_DOES_NOT_EXIST"])
    message: str = Field(description="What went wrong, naming the id that caused it; never a traceback.")


class Status(BaseModel):
    """`GET /health` (always `healthy`) and `GET /ready` (`ready`, or `database unreachable` with 503)."""

    status: str


class AgentInfoAnswer(BaseModel):
    """`GET /agent/info`: what runs (`AgentInfo.public_dict`, the store's kind and never its URL), with MLflow's keys."""

    name: str
    version: str
    store: Literal["postgres", "sqlite", "memory"]
    model: str
    use_case: str
    agent_api: str
    mlflow_version: str


class EmptyBody(BaseModel):
    """A request body with no fields (`POST /responses/{id}/cancel`): `{}`, or no body at all."""

    model_config = {"extra": "forbid"}


class ResponseDeleted(BaseModel):
    """`DELETE /responses/{id}`: the response's run record (status and stream events) is removed; its checkpoint,
    part of the thread's history, is kept and named (`serving.run_views`)."""

    id: str
    object: Literal["response.deleted"]
    deleted: bool
    removed: list[Literal["run", "events"]]
    kept: dict[str, str] | None = Field(description="`checkpoint_id` and `thread_id` of the checkpoint kept, if any.")


@dataclass(frozen=True)
class RouteDoc:
    """What one route takes and answers (types pydantic can describe)."""

    response: Any
    request: Any = None
    stream: Any = None
    """The data of each server-sent event when the request asks for `"stream": true`."""
    openai: bool = False
    """Errors in the OpenAI shape (`{"error": {...}}`) rather than `ErrorAnswer`."""
    paged: bool = False
    """Takes OpenAI's paging query parameters (`after`, `limit`, `order`)."""
    errors: tuple[int, ...] = (400, 404, 409, 503)
    error: Any = None
    """The body of those answers; None: `ErrorAnswer` (`OpenAIErrorAnswer` with `openai`)."""


def routes() -> dict[tuple[str, str], RouteDoc]:
    """(method, path) -> its `RouteDoc`, for every route of `build_app`'s app."""
    from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent
    from openai.types.conversations import (
        Conversation,
        ConversationCreateParams,
        ConversationDeletedResource,
        ConversationItem,
        ConversationItemList,
        ConversationUpdateParams,
    )
    from openai.types.responses import Response, ResponseInputItemParam, ResponseItemList

    from agent.serving.openai import MAX_ITEMS_PER_CALL
    from agent.serving.web import WebIdentity

    class ConversationItemsBody(BaseModel):
        """`POST /conversations/{id}/items`: the items to append (OpenAI's `items.create` body)."""

        items: list[ResponseInputItemParam] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)

    class ConversationItemAnswer(RootModel[ConversationItem]):  # a named schema: OpenAI's type is a bare union
        """`GET /conversations/{id}/items/{item_id}`: one item (OpenAI's `ConversationItem`)."""

    turn = RouteDoc(ResponsesAgentResponse, ResponsesAgentRequest, stream=ResponsesAgentStreamEvent)
    return {
        ("post", "/invocations"): turn,
        ("post", "/responses"): turn,
        ("get", "/health"): RouteDoc(Status, errors=()),
        ("get", "/ready"): RouteDoc(Status, errors=(503,), error=Status),
        ("get", "/agent/info"): RouteDoc(AgentInfoAnswer, errors=()),
        ("get", "/web/identity"): RouteDoc(WebIdentity, errors=()),
        ("get", "/responses/{response_id}"): RouteDoc(Response, openai=True, errors=(400, 404)),
        ("post", "/responses/{response_id}/cancel"): RouteDoc(Response, EmptyBody, openai=True),
        ("delete", "/responses/{response_id}"): RouteDoc(ResponseDeleted, openai=True),
        ("get", "/responses/{response_id}/input_items"): RouteDoc(ResponseItemList, openai=True, paged=True, errors=(400, 404)),
        ("post", "/conversations"): RouteDoc(Conversation, ConversationCreateParams, openai=True),
        ("get", "/conversations/{conversation_id}"): RouteDoc(Conversation, openai=True, errors=(400, 404)),
        ("post", "/conversations/{conversation_id}"): RouteDoc(Conversation, ConversationUpdateParams, openai=True),
        ("delete", "/conversations/{conversation_id}"): RouteDoc(ConversationDeletedResource, openai=True),
        ("get", "/conversations/{conversation_id}/items"): RouteDoc(ConversationItemList, openai=True, paged=True, errors=(400, 404)),
        ("post", "/conversations/{conversation_id}/items"): RouteDoc(ConversationItemList, ConversationItemsBody, openai=True),
        ("get", "/conversations/{conversation_id}/items/{item_id}"): RouteDoc(ConversationItemAnswer, openai=True, errors=(400, 404)),
        ("delete", "/conversations/{conversation_id}/items/{item_id}"): RouteDoc(Conversation, openai=True),
    }  # fmt: skip


#: What each error status means, for the schema's descriptions (`serving.errors` maps the errors).
STATUS_MEANINGS = {
    400: "InvalidRequest: a malformed request or one the agent refuses; nothing was written.",
    404: "ThreadNotFound, CheckpointNotFound, ResponseNotFound: unknown, or another user's.",
    409: "ThreadBusy, TurnCancelled, InterruptPending, ...: a conflict with another request; nothing was written.",
    503: "StorageUnavailable, ModelError: try again later; nothing was written.",
}

#: OpenAI's paging query parameters, with this server's bounds (`operations.conversations.page`).
PAGING = [
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}, "description": "An item id: the page after it."},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}},
    {"name": "order", "in": "query", "required": False, "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"}},
]  # fmt: skip


def with_typed_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` (served at `GET /openapi.json`) FastAPI's schema with `routes()` filled in."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # FastAPI's, from the routes; stored in app.openapi_schema
            typed(schema, routes())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def typed(schema: dict[str, Any], docs: dict[tuple[str, str], RouteDoc]) -> None:
    """Put each route's request, answers and paging parameters into `schema` (an OpenAPI document), in place."""
    from openai.types.shared import ErrorObject

    class OpenAIErrorAnswer(BaseModel):
        """The body of an OpenAI-dialect route's error answer (`serving.errors.openai_error_body`)."""

        error: ErrorObject

    types: dict[str, Any] = {"ErrorAnswer": ErrorAnswer, "OpenAIErrorAnswer": OpenAIErrorAnswer}
    for (method, path), doc in docs.items():
        for part in ("request", "response", "stream", "error"):
            value = getattr(doc, part)
            if value is not None:
                types[f"{method} {path} {part}"] = value
    inputs = [
        (key, "validation" if key.endswith(" request") else "serialization", TypeAdapter(value)) for key, value in types.items()
    ]
    refs, definitions = TypeAdapter.json_schemas(inputs, ref_template=REF_TEMPLATE)
    ref = {key: value for (key, _mode), value in refs.items()}
    schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions.get("$defs", {}))
    for (method, path), doc in docs.items():
        operation = schema["paths"].get(path, {}).get(method)
        if operation is None:  # a route this app does not mount
            continue
        if doc.request is not None:
            body = {"application/json": {"schema": ref[f"{method} {path} request"]}}
            # A body without fields (cancel's) may be left out, as the openai client sends none or `{}`.
            required = not (isinstance(doc.request, type) and issubclass(doc.request, EmptyBody))
            operation["requestBody"] = {"required": required, "content": body}
        answer: dict[str, Any] = {"application/json": {"schema": ref[f"{method} {path} response"]}}
        if doc.stream is not None:
            answer["text/event-stream"] = {"schema": ref[f"{method} {path} stream"]}
        errors = ref[f"{method} {path} error"] if doc.error is not None else ref["OpenAIErrorAnswer" if doc.openai else "ErrorAnswer"]
        operation["responses"] = {
            "200": {
                "description": "Successful answer"
                + ('; with "stream": true, server-sent events (`data: <event>` each, then `data: [DONE]`)' if doc.stream else ""),
                "content": answer,
            },
            **{
                str(status): {"description": STATUS_MEANINGS.get(status, "Not ready"), "content": {"application/json": {"schema": errors}}}
                for status in doc.errors
            },
        }
        if doc.paged:
            named = {p["name"] for p in operation.get("parameters", [])}
            operation["parameters"] = [*operation.get("parameters", []), *(p for p in PAGING if p["name"] not in named)]
    # FastAPI's 422 answer is never given (a request FastAPI refuses answers 400 with ErrorAnswer): its
    # schemas go once no route refers to them.
    if "HTTPValidationError" not in json.dumps(schema["paths"]):
        for name in ("HTTPValidationError", "ValidationError"):
            schema["components"]["schemas"].pop(name, None)
