"""How each error answers: its HTTP status, MLflow error code and OpenAI error type, in one table.

Below every caller (the MLflow adapter's error twins, the HTTP servers, the
OpenAI routes), so that none of them reaches up into another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import (
    AgentError,
    ConfigurationError,
    Conflict,
    EncryptionKeyError,
    InvalidRequest,
    NotFound,
    PreviousResponseNotFound,
    ResponseInProgress,
    RunCancelled,
    ServerBusy,
    ServerStopping,
    Unavailable,
)


@dataclass(frozen=True)
class ErrorAnswer:
    """How a server answers one class of error."""

    status: int
    mlflow_code: str
    openai_type: str
    openai_code: str
    #: The request field OpenAI's error names (`param`), when the class of error is about one.
    openai_param: str | None = None


# Checked in order: the first class the error is an instance of wins.
ERROR_ANSWERS: tuple[tuple[type[AgentError], ErrorAnswer], ...] = (
    # Before ConfigurationError: the server's keys cannot open its own data, which no request can fix.
    (EncryptionKeyError, ErrorAnswer(500, "INTERNAL_ERROR", "server_error", "internal_error")),
    (InvalidRequest, ErrorAnswer(400, "INVALID_PARAMETER_VALUE", "invalid_request_error", "invalid_request")),
    (ConfigurationError, ErrorAnswer(400, "INVALID_PARAMETER_VALUE", "invalid_request_error", "invalid_request")),
    # OpenAI's code, which clients look for to resend the whole history instead. OpenAI answers 400; a 404
    # here, as for every id that names nothing (the openai client raises NotFoundError, with this code).
    (
        PreviousResponseNotFound,
        ErrorAnswer(404, "RESOURCE_DOES_NOT_EXIST", "invalid_request_error", "previous_response_not_found", "previous_response_id"),
    ),
    (NotFound, ErrorAnswer(404, "RESOURCE_DOES_NOT_EXIST", "invalid_request_error", "not_found")),
    # Before Conflict: the code a run's stream ends with when it is cancelled (`agent.runs`), the same on the stream
    # the turn was started with and on a resumed one.
    (RunCancelled, ErrorAnswer(409, "RESOURCE_CONFLICT", "invalid_request_error", "cancelled")),
    # Before Conflict: a client retrying with the same previous_response_id once the run is done can tell this
    # from a busy thread by its code and param.
    (
        ResponseInProgress,
        ErrorAnswer(409, "RESOURCE_CONFLICT", "invalid_request_error", "response_in_progress", "previous_response_id"),
    ),
    (Conflict, ErrorAnswer(409, "RESOURCE_CONFLICT", "invalid_request_error", "conflict")),
    # Before Unavailable. OpenAI's own answer to too many requests (type "requests", code "rate_limit_exceeded"),
    # so a client that backs off from OpenAI's 429 backs off from ours; MLflow's code whose status is 429.
    (ServerBusy, ErrorAnswer(429, "REQUEST_LIMIT_EXCEEDED", "requests", "rate_limit_exceeded")),
    # The code a run stopped at shutdown ends with (`agent.runs`), on its status and on its streams.
    (ServerStopping, ErrorAnswer(503, "TEMPORARILY_UNAVAILABLE", "server_error", "server_shutdown")),
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
    """The HTTP status for `error` (400, 404, 409, 429, 503, or 500 for anything else)."""
    return answer_for(error).status


def status_answer(status: int) -> ErrorAnswer | None:
    """The table's answer with HTTP `status` (its first row), for an error answer no `AgentError` caused
    (an unknown route, a body too large); None when no row has that status."""
    for _, answer in ERROR_ANSWERS:
        if answer.status == status and answer.openai_param is None:
            return answer
    return None
