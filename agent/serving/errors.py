"""The one mapping from the agent's errors to what a server answers: HTTP status, MLflow error code, OpenAI error.

| error | HTTP | MLflow `error_code` | OpenAI `type` / `code` |
|---|---|---|---|
| `InvalidRequest`, `ConfigurationError` | 400 | `INVALID_PARAMETER_VALUE` | `invalid_request_error` / `invalid_request` |
| `PreviousResponseNotFound` (a request's `previous_response_id`) | 404 | `RESOURCE_DOES_NOT_EXIST` | `invalid_request_error` / `previous_response_not_found`, `param` `previous_response_id` |
| `ThreadNotFound`, `CheckpointNotFound`, `ResponseNotFound`, `MemoryNotFound` | 404 | `RESOURCE_DOES_NOT_EXIST` | `invalid_request_error` / `not_found` |
| `ThreadBusy`, `LeaseExpired`, `TurnCancelled`, `UserBeingDeleted`, `ThreadExists`, `InterruptPending` | 409 | `RESOURCE_CONFLICT` | `invalid_request_error` / `conflict` |
| `RunCancelled` (a `TurnCancelled`: `POST /responses/{id}/cancel`) | 409 | `RESOURCE_CONFLICT` | `invalid_request_error` / `cancelled` |
| `ResponseInProgress` (a request's `previous_response_id` names an unfinished run) | 409 | `RESOURCE_CONFLICT` | `invalid_request_error` / `response_in_progress`, `param` `previous_response_id` |
| `ServerBusy` (the turn admission's queue is full: `serving.admission`) | 429 | `REQUEST_LIMIT_EXCEEDED` | `requests` / `rate_limit_exceeded` |
| `ServerStopping` (the server shut down before the turn finished: `serving.drain`) | 503 | `TEMPORARILY_UNAVAILABLE` | `server_error` / `server_shutdown` |
| `StorageUnavailable`, `ModelError` | 503 | `TEMPORARILY_UNAVAILABLE` | `server_error` / `unavailable` |
| `EncryptionKeyError` (the deployment's keys cannot open its data) | 500 | `INTERNAL_ERROR` | `server_error` / `internal_error` |
| any other `AgentError` | 500 | `INTERNAL_ERROR` | `server_error` / `internal_error` |

Bodies: the MLflow routes (`/invocations`, and every route outside the two below) answer
`{"error_code": ..., "message": ...}` (MLflow's shape, also what `mlflow models serve`
answers); every route under `/responses` and `/conversations` (`OPENAI_PATHS`, `POST /responses`
included) answers OpenAI's `{"error": {"message", "type", "code", "param"}}`, so that the `openai`
client's `exc.code`, `exc.type` and `exc.param` say what happened (`answer_body`).

Answers that are not an `AgentError` (the body middleware's, MLflow's and
FastAPI's own `HTTPException`s, unknown routes, wrong methods) get the same
body, with the `error_code` of their status (`status_error_body`), and on the
OpenAI routes the `type` and `code` of the table's row with that status
(`error_answers.status_answer`: 400 `invalid_request`, 404 `not_found`, 500 `internal_error` …), else
`invalid_request_error` (`server_error` for a 5xx) and the `error_code` below in lower case:

| HTTP | `error_code` |
|---|---|
| 400, 422 | `INVALID_PARAMETER_VALUE` |
| 404 | `ENDPOINT_NOT_FOUND` |
| 405 and any other 4xx | `BAD_REQUEST` |
| 408 | `DEADLINE_EXCEEDED` |
| 429 | `REQUEST_LIMIT_EXCEEDED` |
| 503 | `TEMPORARILY_UNAVAILABLE` |
| 500 and any other 5xx | `INTERNAL_ERROR` |

The table itself is `agent.error_answers` (below every caller); MLflow's error
twins, for `mlflow models serve`, are `agent.mlflow_errors`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from agent.error_answers import ERROR_ANSWERS, INTERNAL, ErrorAnswer, answer_for, http_status, status_answer
from agent.errors import AgentError, ServerStopping

__all__ = [
    "ERROR_ANSWERS",
    "INTERNAL",
    "OPENAI_PATHS",
    "ErrorAnswer",
    "answer_body",
    "answer_for",
    "error_body",
    "http_status",
    "log_error_answer",
    "send_error_answer",
    "speaks_openai",
    "status_answer_body",
]


logger = logging.getLogger("agent.serving")


def error_body(error: AgentError) -> dict[str, str]:
    """`{"error_code": <MLflow code>, "message": <message>}`, the body of the Agent Server's own routes."""
    return {"error_code": answer_for(error).mlflow_code, "message": error.message}


#: The `error_code` of an answer that is not an AgentError, by HTTP status (table above).
STATUS_ERROR_CODES = {
    400: "INVALID_PARAMETER_VALUE",
    404: "ENDPOINT_NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    422: "INVALID_PARAMETER_VALUE",
    429: "REQUEST_LIMIT_EXCEEDED",
    503: "TEMPORARILY_UNAVAILABLE",
}


def status_error_body(status: int, message: str) -> dict[str, str]:
    """`{"error_code", "message"}` for an answer with HTTP `status` that no `AgentError` caused."""
    default = "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST"
    return {"error_code": STATUS_ERROR_CODES.get(status, default), "message": message}


def openai_error_body(error: AgentError, *, param: str | None = None) -> dict[str, dict[str, str | None]]:
    """`{"error": {"message", "type", "code", "param"}}`, the body the OpenAI API (and its client) uses;
    `param` defaults to the request field the error names (its `param` id: a refused or unknown field),
    else to the field the table names for the error's class."""
    answer = answer_for(error)
    param = param or error.ids.get("param") or answer.openai_param
    return {"error": {"message": error.message, "type": answer.openai_type, "code": answer.openai_code, "param": param}}


#: The routes that speak OpenAI's dialect, and answer errors in its shape (each path and everything under it).
OPENAI_PATHS = ("/responses", "/conversations")


def speaks_openai(path: str) -> bool:
    """Whether the route at `path` answers errors in OpenAI's shape (`OPENAI_PATHS`)."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in OPENAI_PATHS)


def answer_body(path: str, error: AgentError) -> dict[str, Any]:
    """The body of the answer to `error` on the route at `path`: OpenAI's shape or MLflow's."""
    return openai_error_body(error) if speaks_openai(path) else error_body(error)


def status_answer_body(path: str, status: int, message: str) -> dict[str, Any]:
    """The body of an answer with HTTP `status` that no `AgentError` caused, on the route at `path`."""
    if not speaks_openai(path):
        return status_error_body(status, message)
    answer = status_answer(status)
    if answer is not None:
        kind, code = answer.openai_type, answer.openai_code
    else:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        code = status_error_body(status, message)["error_code"].lower()
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def error_code(body: dict[str, Any]) -> str | None:
    """The code of an error body of either shape (for the log line)."""
    return body.get("error_code") or (body.get("error") or {}).get("code")


def log_error_answer(method: str, path: str, status: int, body: dict[str, str], error: BaseException | None = None) -> None:
    """Log an error answer: a 4xx as one INFO line (the client's mistake: no traceback), a 5xx as an
    ERROR with the traceback of `error` (the server's problem, to be fixed; the client never sees it),
    except `ServerStopping`, one WARNING line (the server was told to stop)."""
    line = "%s %s -> %d %s: %s"
    # One line even when the message has several (pydantic's do): a log line per answer.
    message = body.get("message") or (body.get("error") or {}).get("message")
    args = (method, _printable(path), status, error_code(body), " ".join(str(message).split()))
    if status < 500:
        logger.info(line, *args)
    elif isinstance(error, ServerStopping):  # the shutdown's own doing (`serving.drain`): nothing to fix
        logger.warning(line, *args)
    else:
        logger.error(line, *args, exc_info=error if error is not None and error.__traceback__ else None)


def _printable(text: str) -> str:
    """`text` with each control character escaped (`\\x00`): a path arrives percent-decoded, and a raw NUL or
    ESC from a client must not reach the log (or the terminal that shows it)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


async def send_error_answer(
    scope: dict[str, Any], send: Any, status: int, body: dict[str, Any], *,
    headers: Iterable[tuple[bytes, bytes]] = (), error: BaseException | None = None,
) -> None:  # fmt: skip
    """Log and send an error answer from ASGI middleware, before any route runs (the body of `answer_body`
    or `status_answer_body`; `headers` added to its content type and length)."""
    log_error_answer(scope["method"], scope.get("path", ""), status, body, error)
    payload = json.dumps(body).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": payload})
