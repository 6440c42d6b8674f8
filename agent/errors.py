"""The agent's error types, and the one place that decides their HTTP status.

Every error the agent raises on purpose is an `AgentError`. `AgentError` is an
`mlflow.exceptions.MlflowException`, so MLflow's scoring server
(`mlflow models serve`) and the MLflow Agent Server turn it into an HTTP status
from its `error_code`, with the message and without a traceback. The mapping is
the `error_code` class attribute of each class below; `http_status()` reads it
back for servers of our own.

Each error is raised before anything is written, and names the id that caused it.
"""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.protos import databricks_pb2


class AgentError(MlflowException):
    """Base class of every error the agent raises on purpose."""

    error_code: int = databricks_pb2.INTERNAL_ERROR

    def __init__(self, message: str, **ids: str | None) -> None:
        super().__init__(message, error_code=self.error_code)
        # The ids that caused the error, for callers that branch on them.
        self.ids = ids

    def __reduce__(self):  # MlflowException's pickling drops subclass fields.
        return (_rebuild, (type(self), self.message, self.ids))


def _rebuild(cls: type[AgentError], message: str, ids: dict) -> AgentError:
    return cls(message, **ids)


class InvalidRequest(AgentError):
    """The request is malformed: empty input, ids that are not strings, bad messages, too large."""

    error_code = databricks_pb2.INVALID_PARAMETER_VALUE


class ThreadNotFound(AgentError):
    """The thread does not exist, has no checkpoints, or belongs to another user."""

    error_code = databricks_pb2.RESOURCE_DOES_NOT_EXIST


class CheckpointNotFound(AgentError):
    """The checkpoint does not exist in this thread (it may not exist at all, or belong to another thread)."""

    error_code = databricks_pb2.RESOURCE_DOES_NOT_EXIST


class ThreadBusy(AgentError):
    """Another turn holds the thread: refused under `reject`, or waited past the timeout under `enqueue`."""

    error_code = databricks_pb2.RESOURCE_CONFLICT


class StorageUnavailable(AgentError):
    """The database could not be reached or dropped the connection; the message says whether anything was written."""

    error_code = databricks_pb2.TEMPORARILY_UNAVAILABLE


class ModelError(AgentError):
    """The chat model failed (HTTP error, timeout, invalid reply); the turn wrote nothing."""

    error_code = databricks_pb2.TEMPORARILY_UNAVAILABLE


class ConfigurationError(AgentError):
    """A setting is invalid, such as an unknown database URL scheme."""

    error_code = databricks_pb2.INVALID_PARAMETER_VALUE


def http_status(error: AgentError) -> int:
    """The HTTP status for `error` (400, 404, 409, 503 or 500), from its MLflow error code."""
    return error.get_http_status_code()
