"""MLflow tracing: one span per turn, one per model call, each trace tagged with its thread.

`create_agent(tracing=True)` calls `enable_tracing()`; `tracing=False` calls
`disable_tracing()` (the default follows `AgentSettings.tracing`). Both act on the whole process,
because MLflow's tracing switch is global: `ResponsesAgent` traces every
`predict` call on its own, so turning tracing off must be global too.

**What a turn's trace holds, and why so little.** The turn's span is MLflow's
own: `ResponsesAgent` traces `predict` / `predict_stream` (in-process callers),
and the Agent Server starts a span around its handler (`tt-agent serve`). Inside
it, `model_call_span` (called by the agent node of `agent.graph`) adds ONE span
of type `CHAT_MODEL` per model call. Its inputs are a bounded summary of what
the model was sent (message count, the last user message cut to
`PREVIEW_CHARS`, the input token count), its outputs the reply. LangChain
autolog (`mlflow.langchain.autolog()`, used before) recorded a span per
runnable with the whole message list as inputs and outputs, so a traced turn
cost more the longer its thread (figures: docs/performance.md, "Tracing").
The summary costs the same on the first turn of a thread and on the thousandth.

**What is traced: turns.** A request that names a `custom_inputs.action` (a read
such as `get_checkpoint_state`, whose output is a whole rendered thread, or a state
edit) is not traced unless `trace_actions` is set: a chat UI reads far more often
than it sends, and a read's trace held its whole answer (113 kB for one render of
a 50-turn thread). The callers decide (`agent.responses`, `agent.serving.agent_server`).

**What a trace costs, by destination** (figures: docs/performance.md, "Tracing").
Export runs after the turn's answer, on MLflow's async trace logging thread
(`MLFLOW_ENABLE_ASYNC_TRACE_LOGGING`, on by default), so it is off the turn's
critical path, but its CPU is the serving process's all the same. Sent to a
tracking server (`http(s)://`) or Databricks, a trace costs the serving process
one HTTP request. Written into a store by the process itself (a `sqlite:///` file,
as the default `.agent/mlflow.db`, or any database URI) it costs MLflow's
SQLAlchemy store about 56 statements and three commits (`start_trace`,
`log_spans`: some 20 to 30 ms of CPU in mlflow 3.17), several times what the
turn itself costs. So the default ratio (`trace_sample_ratio=None`) depends on
the destination: every turn to a tracking server, `LOCAL_TRACE_SAMPLE_RATIO` of
the turns into a local store, which keeps a server's CPU per turn within twice
its CPU without tracing. `trace_sample_ratio=1` traces every turn there too.

**Sampling.** `trace_sample_ratio` (0 to 1) is MLflow's own trace sampling
(`MLFLOW_TRACE_SAMPLING_RATIO`, mlflow >= 3.x: a `ParentBased` ratio sampler
decides once per trace at its root span, and the spans inside follow it).
`enable_tracing(ratio)` sets that variable and rebuilds MLflow's tracer
provider when the ratio changes, so, like the on/off switch, the ratio is one
per process. A turn that is not sampled creates no span at all here (no
active span), and its tags are skipped.

Where traces go: MLflow's tracking URI. When neither `MLFLOW_TRACKING_URI` nor
`mlflow.set_tracking_uri(...)` chose one, `enable_tracing()` points MLflow at
`sqlite:///<cwd>/.agent/mlflow.db` (next to the embedded checkpoint store),
instead of MLflow's own default, a `mlflow.db` and an `mlruns/` directory in
whatever the current directory is. Writing a trace into a SQLite store costs
the writing process several times what sending it to a tracking server costs
(MLflow's SQLAlchemy store: `start_trace` and `log_spans`, whatever the trace
holds; figures: docs/performance.md, "Tracing").

**MLflow is imported when something records.** Importing it costs more CPU
than importing LangGraph (docs/performance.md, "Start-up"), so this module does not: `enable_tracing` and
`use_default_tracking_uri` import it (they set up recording), while the helpers
called on every turn (`model_call_span`, `tag_trace`, `scrub_trace_inputs`)
look for an MLflow that is already imported and do nothing without one, since
no span can be active in a process that never imported MLflow.
`disable_tracing` switches off an imported MLflow and, without one, has
nothing to switch off yet: MLflow starts with tracing on when it is imported,
so the switch is remembered and applied by `apply_tracing_switch()` once MLflow
is imported. The agent `create_agent` returns imports MLflow only when it first
becomes a `ResponsesAgent` (`agent.deferred`), after tracing was configured, and
calls `apply_tracing_switch()` then, before anything of it is traced.

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
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.config import AgentSettings

logger = logging.getLogger(__name__)

#: The tracking store used when the user configured none (relative to the current directory).
DEFAULT_TRACKING_DB = Path(".agent") / "mlflow.db"
#: Where that store keeps artifacts (trace payloads, logged models).
DEFAULT_ARTIFACTS_DIR = Path(".agent") / "mlartifacts"
#: MLflow's trace sampling ratio variable (read when its tracer provider is built).
SAMPLING_RATIO_ENV = "MLFLOW_TRACE_SAMPLING_RATIO"
#: The share of turns traced by default into a store the process writes itself (module docstring).
LOCAL_TRACE_SAMPLE_RATIO = 0.2
#: Tracking URI schemes whose store is another process: a trace costs the server one request.
REMOTE_TRACKING_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")

_lock = threading.Lock()
_applied_ratio: float | None = None
#: `disable_tracing()` was called while MLflow was not imported: `apply_tracing_switch()` applies it.
_disable_when_imported = False


def _imported_mlflow() -> ModuleType | None:
    """The `mlflow` module if this process imported it (whole), else None; never imports it."""
    module = sys.modules.get("mlflow")
    # A module that is still being imported has no `get_current_active_span` yet.
    return module if module is not None and hasattr(module, "get_current_active_span") else None


def _active_span() -> Any:
    """MLflow's active span, or None (also when MLflow is not imported: then no span can be active)."""
    mlflow = _imported_mlflow()
    return None if mlflow is None else mlflow.get_current_active_span()


def configure_tracing(settings: AgentSettings) -> None:
    """Turn tracing on (sampling `settings.trace_sample_ratio` of the turns) or off, as `settings.tracing` says."""
    if settings.tracing:
        enable_tracing(settings.trace_sample_ratio)
    else:
        disable_tracing()


def default_sample_ratio(tracking_uri: str) -> float:
    """The share of turns traced when `trace_sample_ratio` is None: 1.0 when `tracking_uri` is another
    process (a tracking server, Databricks), `LOCAL_TRACE_SAMPLE_RATIO` when this process writes the store."""
    scheme = tracking_uri.split(":", 1)[0].lower()
    return 1.0 if scheme in REMOTE_TRACKING_SCHEMES else LOCAL_TRACE_SAMPLE_RATIO


def enable_tracing(sample_ratio: float | None = 1.0) -> None:
    """Turn on MLflow tracing for this process, keeping `sample_ratio` (0 to 1) of the traces
    (None: `MLFLOW_TRACE_SAMPLING_RATIO` when the user set it, else `default_sample_ratio` of the
    tracking URI in use).

    Also applies `use_default_tracking_uri()`, so traces never land in a stray
    `mlflow.db` in the current directory. The ratio goes to MLflow's
    `MLFLOW_TRACE_SAMPLING_RATIO`, which MLflow reads when it builds its tracer
    provider; when the ratio changes, or tracing was off, the provider is reset
    (`mlflow.tracing.reset()`), and MLflow builds it again on the first span.
    Building it opens the tracking store (for a SQLite store, SQLAlchemy and
    its migrations check) and reads the git and Databricks environment, which
    is most of what tracing costs a server's start-up: it is paid by the first
    traced turn, not by a process that never traces (`tt-agent serve` pays it at
    start-up instead, `build_tracer_now`: on its event loop it stalled every request).

    Raises:
        ValueError: `sample_ratio` is not between 0 and 1.
    """
    global _applied_ratio, _disable_when_imported
    if sample_ratio is not None and not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"sample_ratio must be between 0 and 1, got {sample_ratio}")
    import mlflow
    from mlflow.tracing.provider import is_tracing_enabled

    with _lock:
        _disable_when_imported = False
        uri = use_default_tracking_uri()
        if sample_ratio is None:
            chosen = os.environ.get(SAMPLING_RATIO_ENV) if _applied_ratio is None else None
            # MLflow's own variable, set by the user before this process set it, is the user's choice.
            sample_ratio = float(chosen) if chosen else default_sample_ratio(uri)
        if sample_ratio != _applied_ratio:
            os.environ[SAMPLING_RATIO_ENV] = repr(float(sample_ratio))
            _applied_ratio = sample_ratio
            mlflow.tracing.reset()
        elif not is_tracing_enabled():
            mlflow.tracing.reset()


def build_tracer_now() -> None:
    """Build MLflow's tracer provider now, when tracing is on, rather than on the first traced turn.

    A server calls this at start-up (`serving.app.with_lifespan`, in a worker thread once it answers, so
    that `/ready` does not wait for it): building the
    provider opens the tracking store and probes the git and Databricks environment (it imports IPython),
    about a second of CPU on the process's one event loop, during which nothing else of the process runs;
    paid by the first traced turn of a burst, it was a one-second stall of `GET /health` and of every other
    request (`bench.users`). A no-op when tracing is off or MLflow is not imported.
    """
    mlflow = _imported_mlflow()
    if mlflow is None:
        return
    from mlflow.tracing.provider import is_tracing_enabled

    if not is_tracing_enabled():
        return
    try:
        # mlflow has no public "initialize now"; `_get_tracer` builds the provider once per process
        # (`get_or_init_tracer`) and is what `mlflow.start_span` calls first.
        from mlflow.tracing.provider import _get_tracer
    except ImportError:  # another mlflow version: the first traced turn builds it, as before
        return
    _get_tracer(__name__)


def traced_share() -> float | None:
    """The share of turns traced (0 to 1) that `enable_tracing` last applied in this process, or None when it
    was never called (`tt-agent serve`'s first line says it: a local store traces 1 turn in 5 by default)."""
    return _applied_ratio


def disable_tracing() -> None:
    """Turn MLflow tracing off for this process. Without an imported MLflow it is not imported for this: the
    switch is remembered, and `apply_tracing_switch()` applies it once MLflow is imported (module docstring)."""
    global _disable_when_imported
    with _lock:
        mlflow = _imported_mlflow()
        if mlflow is None:
            _disable_when_imported = True
            return
        mlflow.tracing.disable()
        # Cleared only once MLflow's switch is off: a thread that sees it cleared may trace at once.
        _disable_when_imported = False


def apply_tracing_switch() -> None:
    """Apply a `disable_tracing()` made before MLflow was imported, now that it is (a no-op otherwise).
    Called when the agent first uses MLflow (`agent.deferred`), before anything of it is traced; a thread
    that comes while another applies it waits until MLflow's switch is off."""
    if _disable_when_imported and _imported_mlflow() is not None:
        disable_tracing()


def use_default_tracking_uri() -> str:
    """Point MLflow at `sqlite:///<cwd>/.agent/mlflow.db` unless a tracking URI is already chosen.

    A URI is chosen when `MLFLOW_TRACKING_URI` is set or `mlflow.set_tracking_uri`
    was called; then nothing changes. The path is made absolute now, so a later
    `chdir` does not scatter traces.

    Returns:
        The tracking URI MLflow uses from now on.
    """
    import mlflow

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
    if _active_span() is None:
        return
    import mlflow

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
    span = _active_span()
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


# -- the model call's span -----------------------------------------------------------------------
#: Most characters of the last user message a model span records.
MODEL_INPUT_PREVIEW_CHARS = 1000


class ModelCallSpan:
    """What `model_call_span` yields: `reply(message)` records the model's answer (a no-op when not traced)."""

    def __init__(self, span: Any, messages: Sequence[BaseMessage]) -> None:
        self._span = span
        self._messages = messages

    def reply(self, message: BaseMessage) -> None:
        """Record `message` as the span's outputs, and the input/output token counts."""
        if self._span is None:
            return
        try:
            usage = getattr(message, "usage_metadata", None) or {}
            input_tokens = usage.get("input_tokens")
            if input_tokens is None:
                from langchain_core.messages.utils import count_tokens_approximately

                input_tokens = count_tokens_approximately(self._messages)
            self._span.set_inputs({**self._span.inputs, "input_tokens": input_tokens})
            outputs: dict[str, Any] = {"type": message.type, "content": message.content}
            if getattr(message, "tool_calls", None):
                outputs["tool_calls"] = message.tool_calls
            self._span.set_outputs(outputs)
            if usage:
                # MLflow's token-usage attribute: the UI sums it per trace.
                self._span.set_attribute(
                    "mlflow.chat.tokenUsage",
                    {k: usage[k] for k in ("input_tokens", "output_tokens", "total_tokens") if k in usage},
                )
        except Exception:
            logger.warning("Could not record the model call's reply in its span", exc_info=True)


@contextmanager
def model_call_span(messages: Sequence[BaseMessage], *, name: str = "chat_model") -> Iterator[ModelCallSpan]:
    """A `CHAT_MODEL` span around one model call, inside the turn's trace.

    Its inputs are a summary that does not grow with the thread: `message_count`,
    `last_user_message` (at most `MODEL_INPUT_PREVIEW_CHARS` characters, None if
    there is none) and, once the reply is in, `input_tokens` (the model's count
    when it reports usage, else `count_tokens_approximately`). Call
    `.reply(message)` on what it yields to record the answer as its outputs. An
    exception inside marks the span as failed and propagates.

    Outside a traced turn (tracing off, the turn not sampled, no turn span, or
    MLflow not imported) no span is made and `.reply` does nothing: the cost is
    one context lookup.
    """
    if _active_span() is None:
        yield ModelCallSpan(None, messages)
        return
    import mlflow
    from mlflow.entities import SpanType

    with mlflow.start_span(name=name, span_type=SpanType.CHAT_MODEL) as span:
        try:
            span.set_inputs({"message_count": len(messages), "last_user_message": _last_user_text(messages)})
        except Exception:
            logger.warning("Could not record the model call's inputs in its span", exc_info=True)
        yield ModelCallSpan(span, messages)


def _last_user_text(messages: Sequence[BaseMessage]) -> str | None:
    for message in reversed(messages):
        if message.type == "human":
            text = message.text
            cut = text[:MODEL_INPUT_PREVIEW_CHARS] + ("…" if len(text) > MODEL_INPUT_PREVIEW_CHARS else "")
            return cut.encode("utf-8", "backslashreplace").decode("utf-8")
    return None
