"""The agent's error types: one small hierarchy, plain Python, each error carrying the ids that caused it.

Every error the agent raises on purpose is an `AgentError`. The classes say
*what* went wrong; how a server answers each one (HTTP status, MLflow error
code, OpenAI error type) is decided in one table, `agent.serving.errors`, so
this module imports nothing heavy and `import agent` stays light. It also words
pydantic's complaints for people (`validation_problems`), for the settings and
the request parsers alike.

Errors about a request are raised before anything is written. Each message
says whether anything was written where that is not obvious.

    AgentError
    ├── InvalidRequest          the request is malformed
    ├── ConfigurationError      a setting is invalid
    │   └── EncryptionKeyError  stored data cannot be decrypted with the configured keys
    ├── NotFound
    │   ├── ThreadNotFound      no such thread (or not the caller's)
    │   ├── CheckpointNotFound  no such checkpoint in this thread
    │   ├── ResponseNotFound    no such response id (or not the caller's)
    │   │   └── PreviousResponseNotFound  a request's previous_response_id names none
    │   └── MemoryNotFound      no such long-term memory (or not the caller's)
    ├── Conflict
    │   ├── ThreadBusy          another turn holds the thread
    │   │   └── LeaseExpired    this turn's claim on the thread expired before it committed
    │   ├── TurnCancelled       a newer turn rolled this one back (multitask_strategy "rollback")
    │   ├── ResponseInProgress  a request's previous_response_id names a run that has not finished
    │   ├── UserBeingDeleted    the user's data is being deleted (delete_user_data) while this request ran
    │   └── ThreadExists        an import names a thread (or checkpoints) already in use with other content
    ├── Unavailable
    │   ├── StorageUnavailable  the database failed
    │   ├── ModelError          the chat model failed
    │   ├── ServerBusy          the server runs and queues as many turns as it may; retry later
    │   └── ServerStopping      the server shut down before the turn finished; retry on another
"""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    """Base class of every error the agent raises on purpose; any other failure inside the agent."""

    def __init__(self, message: str, **ids: str | None) -> None:
        super().__init__(message)
        self.message = message
        #: The ids that caused the error (thread_id, checkpoint_id, …), for callers that branch on them.
        self.ids = ids

    def __reduce__(self):  # keep `ids` when pickled (MLflow and multiprocessing pickle errors)
        return (_rebuild, (type(self), self.message, self.ids))


def _rebuild(cls: type[AgentError], message: str, ids: dict) -> AgentError:
    return cls(message, **ids)


class InvalidRequest(AgentError):
    """The request is malformed: empty input, ids that are not strings, bad messages, too large, unknown fields."""


class ConfigurationError(AgentError):
    """A setting is invalid: an unknown database URL scheme, a bad value, a model that cannot be configured."""


class EncryptionKeyError(ConfigurationError):
    """Stored (or imported) data is encrypted and the configured keys cannot open it: no key is set, the key
    that wrote it is not among them, or it was altered (`agent.encryption`). A server answers 500: the
    deployment's keys are wrong, not the request."""


class NotFound(AgentError):
    """Something the request names does not exist (or is not the caller's)."""


class ThreadNotFound(NotFound):
    """The thread does not exist, has no checkpoints, or belongs to another user."""


class CheckpointNotFound(NotFound):
    """The checkpoint does not exist in this thread (it may not exist at all, or belong to another thread)."""


class ResponseNotFound(NotFound):
    """The response id (`resp_<checkpoint_id>`) names no checkpoint, or one of another user's thread (worded the same)."""


class PreviousResponseNotFound(ResponseNotFound):
    """A request's `previous_response_id` names no response, or one of another user's thread (worded the same);
    OpenAI's code for it is `previous_response_not_found`, which clients look for to resend the whole history."""


class MemoryNotFound(NotFound):
    """The long-term memory does not exist, or belongs to another user (worded the same)."""


class Conflict(AgentError):
    """The request conflicts with another one on the same thread."""


class ThreadBusy(Conflict):
    """Another turn holds the thread: refused under `reject`, or waited past the timeout under `enqueue`."""


class LeaseExpired(ThreadBusy):
    """The turn's claim on its thread expired (or was taken over) before it committed; nothing was written."""


class InterruptPending(Conflict):
    """The thread waits for an answer to the graph's `interrupt()`: resume it, or cancel the interrupt."""


class TurnCancelled(Conflict):
    """A newer turn on the thread rolled this turn back (`multitask_strategy="rollback"`), or the turn was cancelled
    (`POST /responses/{id}/cancel`, a client that left) while it waited for its thread; nothing was written."""


class RunCancelled(TurnCancelled):
    """The run was cancelled (`POST /responses/{id}/cancel`) before or while it ran; nothing was written."""


class ResponseInProgress(Conflict):
    """A request's `previous_response_id` names a streamed or background run that is still queued or in
    progress: it has no checkpoint to continue from yet; nothing was written. Retry once it has completed
    (`GET /responses/{id}` says when); OpenAI refuses to continue from an unfinished response too."""


class UserBeingDeleted(Conflict):
    """`delete_user_data` is deleting the user's data: a turn or write for that user (or a second deletion) is
    refused until it ends; nothing was written."""


class ThreadExists(Conflict):
    """An imported thread's id (or one of its checkpoint ids) is already in use, with other content or by
    another user; nothing was written."""


class Unavailable(AgentError):
    """A service the agent depends on failed; the message says whether anything was written."""


class StorageUnavailable(Unavailable):
    """The database could not be reached, refused the operation, or dropped the connection."""


class ModelError(Unavailable):
    """The chat model failed (HTTP error, timeout, invalid reply); the turn wrote nothing."""


class ServerBusy(Unavailable):
    """The server process runs `max_running_turns` turns and `max_waiting_turns` more wait: the turn was
    refused before it started, nothing written; a server answers 429 with `Retry-After`."""


class ServerStopping(Unavailable):
    """The server was stopped (SIGTERM, SIGINT) and its `shutdown_grace_seconds` ended before the turn did:
    the turn was stopped, nothing written, its thread free; its run reads failed (code `server_shutdown`)."""


# -- wording ------------------------------------------------------------------------------------
#: Ids up to this long are quoted whole in messages: every id the agent makes (a UUID, `resp_<uuid>`) fits.
SHOWN_ID_CHARS = 64
#: How much of a longer id a message quotes.
CLIPPED_ID_CHARS = 40


def shown_id(value: object) -> str:
    """`value` quoted for an error message (`repr`): whole when it is at most `SHOWN_ID_CHARS` long, else its
    first `CLIPPED_ID_CHARS` characters, "…" and its length, `'aaaa…' (256 characters)`. A request may name
    ids of up to 256 characters (`validation.MAX_ID_CHARS`), and a message echoed to a person (a 404 on the
    web page, a log line) has no use for all of them; the error's `ids` keep the whole id for code."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= SHOWN_ID_CHARS:
        return repr(text)
    return f"{text[:CLIPPED_ID_CHARS] + '…'!r} ({len(text)} characters)"


def validation_problems(errors: list[dict[str, Any]], *, most: int = 3) -> str:
    """pydantic's `ValidationError.errors()` as one line for people: `input.0.role: Input should be …; …`.

    Locations drop pydantic's validator and union tags (`function-after[…]`, `list[…]`), repeated
    locations (a union reports one error per member) are said once, and at most `most` are listed.
    """
    seen: dict[str, str] = {}
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if "[" not in str(part)) or "request"
        seen.setdefault(where, str(error.get("msg", "invalid")))
    problems = [f"{where}: {msg}" for where, msg in seen.items()]
    more = f" (and {len(problems) - most} more)" if len(problems) > most else ""
    return "; ".join(problems[:most]) + more
