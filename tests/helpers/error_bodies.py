"""Error bodies as the server answers them: OpenAI's on `/responses` and `/conversations`, MLflow's elsewhere.

    message = assert_error_body("/responses", response.json(), "RESOURCE_DOES_NOT_EXIST")

Tests name the error by its MLflow code; on an OpenAI route the body must have OpenAI's shape and the
matching `type` and `code` (this table, written out here so that the tests check `agent.error_answers`).
"""

from __future__ import annotations

from typing import Any

#: OpenAI's (`type`, `code`) for each MLflow `error_code`.
OPENAI_ERRORS = {
    "INVALID_PARAMETER_VALUE": ("invalid_request_error", "invalid_request"),
    "RESOURCE_DOES_NOT_EXIST": ("invalid_request_error", "not_found"),
    "ENDPOINT_NOT_FOUND": ("invalid_request_error", "not_found"),
    "RESOURCE_CONFLICT": ("invalid_request_error", "conflict"),
    "BAD_REQUEST": ("invalid_request_error", "bad_request"),
    "DEADLINE_EXCEEDED": ("invalid_request_error", "deadline_exceeded"),
    "REQUEST_LIMIT_EXCEEDED": ("requests", "rate_limit_exceeded"),
    "TEMPORARILY_UNAVAILABLE": ("server_error", "unavailable"),
    "INTERNAL_ERROR": ("server_error", "internal_error"),
}


def speaks_openai(path: str) -> bool:
    return path.split("?")[0].startswith(("/responses", "/conversations"))


def assert_error_body(path: str, body: Any, error_code: str) -> str:
    """Check that `body` is the error body of the route at `path` for the MLflow code `error_code`; return its message."""
    if speaks_openai(path):
        assert isinstance(body, dict) and set(body) == {"error"}, body
        error = body["error"]
        assert set(error) == {"message", "type", "code", "param"}, body
        assert (error["type"], error["code"]) == OPENAI_ERRORS[error_code], body
        return error["message"]
    assert isinstance(body, dict) and set(body) == {"error_code", "message"} and body["error_code"] == error_code, body
    return body["message"]


def openai_code(error_code: str) -> str:
    """OpenAI's `code` for the MLflow `error_code` (in an OpenAI-shaped stream error event)."""
    return OPENAI_ERRORS[error_code][1]
