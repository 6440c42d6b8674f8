"""`LangGraphResponsesAgent`: the MLflow `ResponsesAgent` adapter over `Threads`.

A thin translation layer: it parses the request once (`requests.parse_request`),
calls `Threads`, and builds Responses items with MLflow's helpers. It holds no
memory or branching logic.

Streaming (`predict_stream`) yields `response.output_text.delta` events as the
model produces tokens and `response.output_item.done` per finished item. The
last `output_item.done` is held back until the turn is committed, so that it
can carry `custom_outputs` with the new `checkpoint_id` (the Databricks
reference drops `custom_outputs` on streams).

Errors: everything raised is an `AgentError` (an `MlflowException`), so MLflow's
servers answer with its status and message and never with a traceback; an
unexpected exception is logged here and re-raised as a plain `AgentError`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Sequence
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.config import AgentSettings
from agent.errors import AgentError, InvalidRequest
from agent.messages import to_langchain, to_output_items
from agent.requests import ParsedRequest, check_id, check_limit, check_user_id, encoded_size, parse_request
from agent.storage import Store
from agent.threads import NewMessages, TextDelta, Threads, TurnIds
from agent.tracing import scrub_trace_inputs, tag_trace

logger = logging.getLogger(__name__)


class LangGraphResponsesAgent(ResponsesAgent):
    """A conversational agent with checkpoint memory you can branch from.

    Build one with `agent.create_agent(...)`. Close it with `close()` or use it
    as a context manager; it owns a connection pool.
    """

    def __init__(self, store: Store, threads: Threads, settings: AgentSettings) -> None:
        self.store = store
        self.threads = threads
        self.settings = settings

    @property
    def graph(self):
        """The compiled LangGraph graph (for `get_state`, drawing, and the like)."""
        return self.threads.graph

    # -- Responses API ---------------------------------------------------------------
    def predict(self, request: ResponsesAgentRequest) -> ResponsesAgentResponse:
        """Run one turn, or one `custom_inputs.action`, and return the whole response.

        In: a Responses request; `custom_inputs` as documented in `agent.requests`.
        Out: `output` items for the new messages; `custom_outputs` with
        `thread_id`, `checkpoint_id` (the head after the turn) and
        `parent_checkpoint_id` (where the turn started), plus `history` for
        the `get_checkpoint_history` action.

        Raises: `InvalidRequest`, `ThreadNotFound`, `CheckpointNotFound`,
        `ThreadBusy`, `ModelError`, `StorageUnavailable` (all `AgentError`).
        """
        parsed = self._parse(request)
        if parsed.action != "turn":
            return ResponsesAgentResponse(output=[], custom_outputs=self._run_action(parsed))
        output: list[dict] = []
        ids: TurnIds | None = None
        for event in self._turn_events(parsed, stream_tokens=False):
            if isinstance(event, NewMessages):
                output.extend(to_output_items(event.messages))
            elif isinstance(event, TurnIds):
                ids = event
        return ResponsesAgentResponse(output=output, custom_outputs=_custom_outputs(ids))

    def predict_stream(self, request: ResponsesAgentRequest) -> Generator[ResponsesAgentStreamEvent, None, None]:
        """Run one turn and yield events as they happen; the last event carries `custom_outputs`.

        Actions (`custom_inputs.action`) yield a single event with their `custom_outputs`.
        """
        parsed = self._parse(request)
        if parsed.action != "turn":
            yield _completed_event(self._run_action(parsed))
            return
        held: dict | None = None
        for event in self._turn_events(parsed, stream_tokens=True):
            if isinstance(event, TextDelta):
                yield ResponsesAgentStreamEvent(**self.create_text_delta(delta=event.text, item_id=event.item_id))
            elif isinstance(event, NewMessages):
                for item in to_output_items(event.messages):
                    if held is not None:
                        yield ResponsesAgentStreamEvent(type="response.output_item.done", item=held)
                        held = None
                    # Only an assistant text can be the turn's last item; tool
                    # calls and results go out at once.
                    if item.get("type") == "message":
                        held = item
                    else:
                        yield ResponsesAgentStreamEvent(type="response.output_item.done", item=item)
            elif isinstance(event, TurnIds):
                if held is None:  # pragma: no cover - a turn always ends with a reply
                    yield _completed_event(_custom_outputs(event))
                else:
                    yield ResponsesAgentStreamEvent(
                        type="response.output_item.done", item=held, custom_outputs=_custom_outputs(event)
                    )

    # -- time travel (Python API) -------------------------------------------------------
    def get_checkpoint_history(
        self, thread_id: str, limit: int = 10, before: str | None = None, *, user_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The thread's checkpoints, newest first (see `Threads.history` for the entry fields).

        Raises: `InvalidRequest` (bad ids or limit), `ThreadNotFound`, `CheckpointNotFound` (`before`).
        """
        with _agent_errors():
            return self.threads.history(
                _required_id("thread_id", thread_id),
                user_id=check_user_id(user_id, require=self.settings.require_user_id),
                limit=check_limit(limit),
                before=check_id("before", before),
            )

    def update_checkpoint_state(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        new_messages: Sequence[dict] | None = None,
        *,
        user_id: str | None = None,
    ) -> dict[str, str | None]:
        """Create a checkpoint whose parent is `checkpoint_id` (None: the head), with Responses-style
        `new_messages` (e.g. `[{"role": "user", "content": "I'm headed to Tokyo!"}]`) applied.

        It becomes the thread head. Returns `thread_id`, `checkpoint_id` (the new one)
        and `parent_checkpoint_id`.

        Raises: `InvalidRequest`, `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
        """
        with _agent_errors():
            if new_messages is not None and not isinstance(new_messages, (list, tuple)):
                raise InvalidRequest("new_messages must be a list of Responses message items")
            encoded_size("new_messages", new_messages)  # refuses lone surrogates, as requests do
            ids = self.threads.update_state(
                _required_id("thread_id", thread_id),
                check_id("checkpoint_id", checkpoint_id),
                to_langchain(list(new_messages or [])),
                user_id=check_user_id(user_id, require=self.settings.require_user_id),
            )
        return ids.as_dict()

    def delete_thread(self, thread_id: str, *, user_id: str | None = None) -> None:
        """Delete every checkpoint, write and the ownership record of a thread.

        Raises: `InvalidRequest`, `ThreadNotFound` (unknown, or not the caller's).
        """
        with _agent_errors():
            self.threads.delete_thread(
                _required_id("thread_id", thread_id),
                user_id=check_user_id(user_id, require=self.settings.require_user_id),
            )

    def delete_user_data(self, user_id: str) -> list[str]:
        """Delete every thread `user_id` owns; returns the deleted thread ids."""
        with _agent_errors():
            return self.threads.delete_user_data(_required_id("user_id", user_id))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release the connection pool. The agent is unusable afterwards."""
        self.store.close()

    def __enter__(self) -> LangGraphResponsesAgent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------
    def _parse(self, request: Any) -> ParsedRequest:
        with _agent_errors():
            try:
                return parse_request(
                    request,
                    max_request_bytes=self.settings.max_request_bytes,
                    require_user_id=self.settings.require_user_id,
                )
            except InvalidRequest:
                scrub_trace_inputs()  # a refused request may hold text MLflow cannot export
                raise

    def _turn_events(self, parsed: ParsedRequest, *, stream_tokens: bool):
        with _agent_errors():
            for event in self.threads.run_turn(
                parsed.messages,
                thread_id=parsed.thread_id,
                user_id=parsed.user_id,
                checkpoint_id=parsed.checkpoint_id,
                strategy=parsed.multitask_strategy,
                stream_tokens=stream_tokens,
            ):
                if isinstance(event, TurnIds):
                    tag_trace(event.thread_id, event.checkpoint_id, event.parent_checkpoint_id, user_id=parsed.user_id)
                yield event

    def _run_action(self, parsed: ParsedRequest) -> dict[str, Any]:
        if parsed.thread_id is not None:
            tag_trace(parsed.thread_id, user_id=parsed.user_id)
        with _agent_errors():
            if parsed.action == "get_checkpoint_history":
                history = self.threads.history(
                    parsed.thread_id, user_id=parsed.user_id, limit=parsed.limit, before=parsed.before
                )
                return {"thread_id": parsed.thread_id, "history": history}
            if parsed.action == "update_checkpoint_state":
                ids = self.threads.update_state(
                    parsed.thread_id,
                    parsed.checkpoint_id,
                    parsed.messages,
                    user_id=parsed.user_id,
                    strategy=parsed.multitask_strategy,
                )
                tag_trace(ids.thread_id, ids.checkpoint_id, ids.parent_checkpoint_id, user_id=parsed.user_id)
                return ids.as_dict()
            if parsed.action == "delete_thread":
                self.threads.delete_thread(parsed.thread_id, user_id=parsed.user_id)
                return {"thread_id": parsed.thread_id, "deleted": True}
            deleted = self.threads.delete_user_data(parsed.user_id)
            return {"user_id": parsed.user_id, "deleted_thread_ids": deleted}


def _completed_event(custom_outputs: dict[str, Any]) -> ResponsesAgentStreamEvent:
    # MLflow validates a `response.completed` event against the Responses schema,
    # which requires a `response` with its `output`; the items went out before.
    return ResponsesAgentStreamEvent(
        type="response.completed", response={"output": [], "status": "completed"}, custom_outputs=custom_outputs
    )


def _custom_outputs(ids: TurnIds | None) -> dict[str, str | None]:
    if ids is None:  # pragma: no cover - run_turn always ends with TurnIds
        raise AgentError("The turn ended without a result.")
    return ids.as_dict()


def _required_id(name: str, value: Any) -> str:
    checked = check_id(name, value)
    if checked is None:
        raise InvalidRequest(f"{name} is required")
    return checked


class _agent_errors:
    """Let `AgentError` through; turn anything else into an `AgentError` without a traceback for the client."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, AgentError) or not isinstance(exc, Exception):
            return False
        logger.exception("Unexpected error in the agent")
        raise AgentError(f"Internal error ({type(exc).__name__}); see the server log.") from exc


def _mlflow_validation_as_invalid_request(method: Callable) -> Callable:
    # ResponsesAgent validates dict requests with pydantic before our code runs
    # and raises a bare MlflowException, or lets through what its validators
    # raise on odd input (a TypeError for a list where a content part type
    # belongs); callers should see InvalidRequest. So a dict is validated here,
    # as MLflow does it, and MLflow's wrapper gets the validated request.
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if len(args) == 1 and isinstance(args[0], dict):
            args = (_validated_request(args[0]),)
        try:
            return method(self, *args, **kwargs)
        except AgentError:
            raise
        except MlflowException as exc:
            raise InvalidRequest(exc.message) from None

    return wrapper


def _validated_request(raw: dict) -> ResponsesAgentRequest:
    try:
        # The same two steps as mlflow.pyfunc.utils.data_validation.wrap_non_list_predict_pydantic.
        ResponsesAgentRequest.model_validate(raw, strict=True)
        return ResponsesAgentRequest(**raw)
    except Exception as exc:  # pydantic's ValidationError, or whatever MLflow's validators raise
        reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        raise InvalidRequest(
            f"Invalid dictionary input for a ResponsesAgent; expected the ResponsesRequest schema: {reason}"
        ) from None


# Set after the class body so that ResponsesAgent.__init_subclass__ (which adds
# validation and tracing) wraps our methods first and this wraps that.
LangGraphResponsesAgent.predict = _mlflow_validation_as_invalid_request(LangGraphResponsesAgent.predict)
LangGraphResponsesAgent.predict_stream = _mlflow_validation_as_invalid_request(LangGraphResponsesAgent.predict_stream)
