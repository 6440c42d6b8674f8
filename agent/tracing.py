"""MLflow tracing: LangChain/LangGraph autolog, and each trace tagged with its thread.

`create_agent(tracing=True)` calls `enable_tracing()`; `tracing=False` calls
`disable_tracing()` (the default follows `AgentSettings.tracing`). Both act on the whole process,
because MLflow's tracing switch is global: `ResponsesAgent` traces every
`predict` call on its own, so turning tracing off must be global too.

Where traces go: MLflow's tracking URI. When neither `MLFLOW_TRACKING_URI` nor
`mlflow.set_tracking_uri(...)` chose one, `enable_tracing()` points MLflow at
`sqlite:///<cwd>/.agent/mlflow.db` (next to the embedded checkpoint store),
instead of MLflow's own default, a `mlflow.db` and an `mlruns/` directory in
whatever the current directory is.

What a trace carries (`tag_trace`), so the MLflow UI groups a thread's turns:

| trace metadata key | value |
|---|---|
| `mlflow.trace.session` | the thread_id (MLflow's session) |
| `mlflow.trace.user` | the user_id, when the request has one |
| `checkpoint_id` | the thread head after the turn |
| `parent_checkpoint_id` | the checkpoint the turn started from (absent on a new thread) |
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

from agent.config import AgentSettings

logger = logging.getLogger(__name__)

#: The tracking store used when the user configured none (relative to the current directory).
DEFAULT_TRACKING_DB = Path(".agent") / "mlflow.db"
#: Where that store keeps artifacts (trace payloads, logged models).
DEFAULT_ARTIFACTS_DIR = Path(".agent") / "mlartifacts"

_lock = threading.Lock()
_autologged = False


def configure_tracing(settings: AgentSettings) -> None:
    """Turn tracing on or off for this process, as `settings.tracing` says."""
    if settings.tracing:
        enable_tracing()
    else:
        disable_tracing()


def enable_tracing() -> None:
    """Turn on MLflow tracing and `mlflow.langchain.autolog()` (once per process).

    Also applies `use_default_tracking_uri()`, so traces never land in a stray
    `mlflow.db` in the current directory.
    """
    global _autologged
    with _lock:
        use_default_tracking_uri()
        mlflow.tracing.enable()
        if not _autologged:
            mlflow.langchain.autolog()
            _autologged = True


def disable_tracing() -> None:
    """Turn MLflow tracing off for this process."""
    with _lock:
        mlflow.tracing.disable()


def use_default_tracking_uri() -> str:
    """Point MLflow at `sqlite:///<cwd>/.agent/mlflow.db` unless a tracking URI is already chosen.

    A URI is chosen when `MLFLOW_TRACKING_URI` is set or `mlflow.set_tracking_uri`
    was called; then nothing changes. The path is made absolute now, so a later
    `chdir` does not scatter traces.

    Returns:
        The tracking URI MLflow uses from now on.
    """
    if mlflow.is_tracking_uri_set():
        return mlflow.get_tracking_uri()
    database = DEFAULT_TRACKING_DB.resolve()
    database.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{database}"
    if not database.exists():
        _create_tracking_store(uri, DEFAULT_ARTIFACTS_DIR.resolve())
    mlflow.set_tracking_uri(uri)
    return uri


@contextmanager
def mlflow_info_silenced() -> Iterator[None]:
    """MLflow's INFO lines ("Creating initial MLflow database tables", "Predicting on input example")
    are not printed inside this block, unless `MLFLOW_LOGGING_LEVEL` asks for them; warnings are."""
    mlflow_logger = logging.getLogger("mlflow")
    level = mlflow_logger.level
    if not os.environ.get("MLFLOW_LOGGING_LEVEL"):
        mlflow_logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        mlflow_logger.setLevel(level)


def _create_tracking_store(uri: str, artifacts: Path) -> None:
    # MLflow creates a missing SQLite store lazily, with its "Default" experiment's
    # artifacts (trace payloads) in ./mlruns of whatever the current directory is.
    # Creating it here with an artifact root under .agent/ keeps everything in one place.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    try:
        with mlflow_info_silenced():
            SqlAlchemyStore(uri, artifacts.as_uri())
    except Exception:  # MLflow will still create the store on first use, with its own artifact root.
        logger.warning("Could not create the MLflow tracking store %s", uri, exc_info=True)


def tag_trace(
    thread_id: str,
    checkpoint_id: str | None = None,
    parent_checkpoint_id: str | None = None,
    *,
    user_id: str | None = None,
) -> None:
    """Tag the active MLflow trace with its thread (as the MLflow session) and checkpoints.

    Sets trace metadata `mlflow.trace.session` = `thread_id`, `mlflow.trace.user`
    = `user_id`, and `checkpoint_id` / `parent_checkpoint_id`; None values are
    left out. Does nothing when no trace is active (tracing off, or a call
    outside `predict`). Never raises: a tracing problem must not fail a turn.
    """
    if mlflow.get_current_active_span() is None:
        return
    metadata = {
        key: value
        for key, value in (("checkpoint_id", checkpoint_id), ("parent_checkpoint_id", parent_checkpoint_id))
        if value is not None
    }
    try:
        mlflow.update_current_trace(session_id=thread_id, user=user_id, metadata=metadata)
    except Exception:
        logger.warning("Could not tag the trace of thread %r", thread_id, exc_info=True)


def scrub_trace_inputs() -> None:
    """Shrink the active span's recorded inputs to a short, UTF-8-safe preview.

    Called when a request is refused. MLflow records a request before the
    agent validates it, so a refused request would otherwise be stored whole:
    an oversized one fills the tracking store, and a lone UTF-16 surrogate
    makes the trace's export fail with UnicodeEncodeError, and the export of
    the next trace with it (seen with mlflow 3.17). Strings are cut to
    `PREVIEW_CHARS`, lists to `PREVIEW_ITEMS`, surrogates become `\\udXXX`
    text. Does nothing without an active span; never raises.
    """
    span = mlflow.get_current_active_span()
    if span is None:
        return
    try:
        inputs = span.inputs
        preview = _preview(inputs)
        if preview != inputs:
            span.set_inputs(preview)
    except Exception:
        logger.warning("Could not scrub the trace inputs", exc_info=True)


#: How much of a refused request a trace keeps.
PREVIEW_CHARS = 200
PREVIEW_ITEMS = 20


def _preview(value: Any, depth: int = 0) -> Any:
    if depth > 20:
        return "…"
    if isinstance(value, str):
        cut = value[:PREVIEW_CHARS] + ("…" if len(value) > PREVIEW_CHARS else "")
        return cut.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_preview(k, depth + 1): _preview(v, depth + 1) for k, v in list(value.items())[:PREVIEW_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [_preview(v, depth + 1) for v in value[:PREVIEW_ITEMS]]
    return value
