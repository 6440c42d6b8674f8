"""The one mapping from the agent's errors to what a server answers: HTTP status, MLflow error code, OpenAI error.

| error | HTTP | MLflow `error_code` | OpenAI `type` / `code` |
|---|---|---|---|
| `InvalidRequest`, `ConfigurationError` | 400 | `INVALID_PARAMETER_VALUE` | `invalid_request_error` / `invalid_request` |
| `ThreadNotFound`, `CheckpointNotFound`, `ResponseNotFound`, `MemoryNotFound` | 404 | `RESOURCE_DOES_NOT_EXIST` | `invalid_request_error` / `not_found` |
| `ThreadBusy`, `LeaseExpired`, `TurnCancelled`, `ThreadExists`, `InterruptPending` | 409 | `RESOURCE_CONFLICT` | `invalid_request_error` / `conflict` |
| `StorageUnavailable`, `ModelError` | 503 | `TEMPORARILY_UNAVAILABLE` | `server_error` / `unavailable` |
| any other `AgentError` | 500 | `INTERNAL_ERROR` | `server_error` / `internal_error` |

Bodies: the Agent Server's own routes answer `{"error_code": ..., "message": ...}`
(MLflow's shape, also what `mlflow models serve` answers); the OpenAI-dialect
routes answer `{"error": {"message", "type", "code", "param"}}`.

Answers that are not an `AgentError` (the body middleware's, MLflow's and
FastAPI's own `HTTPException`s, unknown routes, wrong methods) get the same
body, with the `error_code` of their status (`status_error_body`):

| HTTP | `error_code` |
|---|---|
| 400, 422 | `INVALID_PARAMETER_VALUE` |
| 404 | `ENDPOINT_NOT_FOUND` |
| 405 and any other 4xx | `BAD_REQUEST` |
| 408 | `DEADLINE_EXCEEDED` |
| 503 | `TEMPORARILY_UNAVAILABLE` |
| 500 and any other 5xx | `INTERNAL_ERROR` |

`mlflow models serve` only knows `MlflowException`: anything else becomes a 500.
`as_mlflow_exception` therefore gives an error a twin class that derives from
both its own class and `MlflowException`, so the scoring server answers with
the status above while in-process callers can still `except CheckpointNotFound`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.errors import (
    AgentError,
    ConfigurationError,
    Conflict,
    InvalidRequest,
    NotFound,
    Unavailable,
)


@dataclass(frozen=True)
class ErrorAnswer:
    """How a server answers one class of error."""

    status: int
    mlflow_code: str
    openai_type: str
    openai_code: str


logger = logging.getLogger("agent.serving")

# Checked in order: the first class the error is an instance of wins.
ERROR_ANSWERS: tuple[tuple[type[AgentError], ErrorAnswer], ...] = (
    (InvalidRequest, ErrorAnswer(400, "INVALID_PARAMETER_VALUE", "invalid_request_error", "invalid_request")),
    (ConfigurationError, ErrorAnswer(400, "INVALID_PARAMETER_VALUE", "invalid_request_error", "invalid_request")),
    (NotFound, ErrorAnswer(404, "RESOURCE_DOES_NOT_EXIST", "invalid_request_error", "not_found")),
    (Conflict, ErrorAnswer(409, "RESOURCE_CONFLICT", "invalid_request_error", "conflict")),
    (Unavailable, ErrorAnswer(503, "TEMPORARILY_UNAVAILABLE", "server_error", "unavailable")),
)
INTERNAL = ErrorAnswer(500, "INTERNAL_ERROR", "server_error", "internal_error")


def answer_for(error: BaseException) -> ErrorAnswer:
    """The answer for `error`: from the table above; `INTERNAL` (500) for anything else."""
    for cls, answer in ERROR_ANSWERS:
        if isinstance(error, cls):
            return answer
    return INTERNAL


def http_status(error: BaseException) -> int:
    """The HTTP status for `error` (400, 404, 409, 503, or 500 for anything else)."""
    return answer_for(error).status


def error_body(error: AgentError) -> dict[str, str]:
    """`{"error_code": <MLflow code>, "message": <message>}`, the body of the Agent Server's own routes."""
    return {"error_code": answer_for(error).mlflow_code, "message": error.message}


#: The `error_code` of an answer that is not an AgentError, by HTTP status (table above).
STATUS_ERROR_CODES = {
    400: "INVALID_PARAMETER_VALUE",
    404: "ENDPOINT_NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    422: "INVALID_PARAMETER_VALUE",
    503: "TEMPORARILY_UNAVAILABLE",
}


def status_error_body(status: int, message: str) -> dict[str, str]:
    """`{"error_code", "message"}` for an answer with HTTP `status` that no `AgentError` caused."""
    default = "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST"
    return {"error_code": STATUS_ERROR_CODES.get(status, default), "message": message}


def openai_error_body(error: AgentError, *, param: str | None = None) -> dict[str, dict[str, str | None]]:
    """`{"error": {"message", "type", "code", "param"}}`, the body the OpenAI API (and its client) uses."""
    answer = answer_for(error)
    return {"error": {"message": error.message, "type": answer.openai_type, "code": answer.openai_code, "param": param}}


_TWINS: dict[type[AgentError], type] = {}


def as_mlflow_exception(error: AgentError) -> AgentError:
    """`error` as an instance of a class deriving from both its class and `MlflowException`.

    MLflow's scoring server turns an `MlflowException` into the HTTP status of its
    `error_code` (the table above) and any other exception into a 500; the twin
    keeps `isinstance(err, type(error))`, `err.message` and `err.ids`.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    if isinstance(error, MlflowException):
        return error
    cls = type(error)
    twin = _TWINS.get(cls)
    if twin is None:
        twin = type(cls.__name__, (cls, MlflowException), {"__module__": cls.__module__, "__reduce__": _reduce_twin})
        _TWINS[cls] = twin
    instance = twin.__new__(twin)
    MlflowException.__init__(instance, error.message, error_code=getattr(databricks_pb2, answer_for(error).mlflow_code))
    instance.ids = dict(error.ids)
    instance.__cause__ = error.__cause__
    return instance


def _reduce_twin(self):
    return (_rebuild_twin, (type(self).__mro__[1], self.message, self.ids))


def _rebuild_twin(cls: type[AgentError], message: str, ids: dict) -> AgentError:
    return as_mlflow_exception(cls(message, **ids))


def log_error_answer(method: str, path: str, status: int, body: dict[str, str], error: BaseException | None = None) -> None:
    """Log an error answer: a 4xx as one INFO line (the client's mistake: no traceback), a 5xx as an
    ERROR with the traceback of `error` (the server's problem, to be fixed; the client never sees it)."""
    line = "%s %s -> %d %s: %s"
    # One line even when the message has several (pydantic's do): a log line per answer.
    args = (method, path, status, body.get("error_code"), " ".join(str(body.get("message")).split()))
    if status < 500:
        logger.info(line, *args)
    else:
        logger.error(line, *args, exc_info=error if error is not None and error.__traceback__ else None)
