"""`LangGraphResponsesAgent`: the plain `Agent` plus MLflow's `ResponsesAgent` interface.

A thin translation layer: it parses a request once (`requests.parse_request`),
runs a turn (`TurnRunner`) or the operation the request names (through the
same door as the Python methods, `Operation.call`), and builds Responses
objects with MLflow's types (`agent.response_events`). It holds no memory or
branching logic; the time-travel methods are `Agent`'s.

* One body: `_aevents` is the turn (or action) as an async iterator of
  Responses stream events. An action that is a turn (`Operation.stream`:
  `merge_branch`) goes the turn's way (`_turn_events`): streamed token by token,
  recorded for resuming, answered with its messages as `output`. `apredict` / `apredict_stream` (the HTTP server's,
  on its event loop: the model call is awaited and no thread is held while it
  runs) iterate it; `predict` / `predict_stream` (MLflow's interface for
  in-process callers and `mlflow models serve`) iterate the same body through
  the turn runner's bridge (`agent.operations.turns.bridge`).
* A request's `previous_response_id` is resolved to its thread here
  (`_resolved`), once, before the turn (see `agent.requests` for the OpenAI fields).
* Errors: everything raised is an `AgentError`. From `predict`/`predict_stream`
  it is also an `MlflowException` (`agent.mlflow_errors.as_mlflow_exception`),
  so MLflow's scoring server answers with its status instead of a 500; an
  unexpected exception is logged and re-raised as a plain `AgentError`.
* Dict requests: `ResponsesAgent.__init_subclass__` wraps the `predict` and
  `predict_stream` a subclass defines (tracing, then pydantic validation of a
  dict, which raises a bare `MlflowException`). Ours are `_DictRequests`
  descriptors, which it does not wrap (they are not callable): they validate a
  dict our way (`InvalidRequest`, the OpenAI client's `input="Hi"`, input item ids
  kept) and then call the traced method MLflow would have made.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

import mlflow
import mlflow.exceptions
from mlflow.entities import SpanType
from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.agent import Agent, agent_errors
from agent.errors import (
    AgentError,
    InvalidRequest,
    PreviousResponseNotFound,
    ResponseInProgress,
    ResponseNotFound,
    shown_id,
)
from agent.mlflow_errors import as_mlflow_exception
from agent.operations.access import check_start
from agent.operations.conversations import thread_of_response
from agent.operations.history import head
from agent.operations.render import STATE, with_state
from agent.operations.turns import TurnArgs
from agent.operations.turns.bridge import LoopThreads
from agent.requests import ParsedRequest, asks_for_turn, keeping_item_ids, parse_request, with_string_input
from agent.response_events import StreamEvents, action_events, custom_outputs, response, response_object
from agent.runs import Runs
from agent.runs.places import keep_request_place
from agent.runs.service import RECORD_ENDS_SECONDS, LocalRun
from agent.tracing import scrub_trace_inputs, tag_trace
from agent.messages import to_output_items
from agent.types import NewMessages, StoredResponse, TurnResult
from agent.validation import validation_problems

logger = logging.getLogger(__name__)


class _DictRequests:
    """A `predict`/`predict_stream` that validates a dict request our way first (module docstring).

    Not callable itself, so `ResponsesAgent.__init_subclass__` leaves it alone; it traces the method
    as MLflow would (`mlflow.trace`, with the stream's output reducer).
    """

    def __init__(self, method: Callable, *, name: str, stream: bool) -> None:
        options = {"output_reducer": ResponsesAgent.responses_agent_output_reducer} if stream else {}
        self.method = method
        self.traced = mlflow.trace(span_type=SpanType.AGENT, name=name, **options)(method)
        functools.update_wrapper(self, method)
        self.name = name
        # `help(agent.predict)` shows `predict(request)`, not the implementation's name and `self`.
        signature = inspect.signature(method)
        self.signature = signature.replace(parameters=list(signature.parameters.values())[1:])

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.traced

        def bound(request: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(request, dict):
                request = _validated_request(request)
            if not traces(request, instance.settings):
                return self.method(instance, request, *args, **kwargs)
            return self.traced(instance, request, *args, **kwargs)

        bound.__name__ = bound.__qualname__ = self.name
        bound.__doc__ = self.__doc__
        bound.__signature__ = self.signature  # type: ignore[attr-defined]
        return bound


def traces(request: ResponsesAgentRequest, settings: Any) -> bool:
    """Whether `request` gets a trace: a turn does; an action (a read, a state edit) only with
    `settings.trace_actions` (`agent.tracing`, "What is traced"). Anything that is not a request (None, a
    list) is not traced: the method refuses it with its own error."""
    if not isinstance(request, ResponsesAgentRequest):
        return False
    return settings.trace_actions or asks_for_turn({"custom_inputs": request.custom_inputs})


class LangGraphResponsesAgent(Agent, ResponsesAgent):
    """A conversational agent with checkpoint memory you can branch from, as an MLflow `ResponsesAgent`.

    Build one with `agent.create_agent(...)`. Close it with `close()` or use it
    as a context manager; it owns a connection pool. Its Python methods are
    `agent.Agent`'s; this class adds the Responses API.
    """

    # -- Responses API ---------------------------------------------------------------
    def _predict(self, request: ResponsesAgentRequest) -> ResponsesAgentResponse:
        """Run one turn, or one `custom_inputs.action`, and return the whole response.

        In: a Responses request; `custom_inputs` as documented in `agent.requests` (a turn may
        also carry `edit_message_id`, `regenerate` or `regenerate_message_id`; see `agent.operations.edits`).
        Out: `output` items for the new messages; `custom_outputs` with
        `thread_id`, `checkpoint_id` (the head after the turn) and
        `parent_checkpoint_id` (where the turn started), or the action's results.

        Raises: `InvalidRequest`, `ThreadNotFound`, `CheckpointNotFound`,
        `ThreadBusy`, `TurnCancelled`, `ModelError`, `StorageUnavailable` (all `AgentError`).
        """
        with _mlflow_errors():
            parsed = self._parse(request)
            if parsed.envelope.background:
                (answer,) = self._bridge().iterate(_one(self._background(parsed, own_loop=True)))
                return answer
            (answer,) = self._bridge().iterate(_one(self._aresponse(parsed)))
            return answer

    def _predict_stream(self, request: ResponsesAgentRequest) -> Generator[ResponsesAgentStreamEvent, None, None]:
        """Run one turn and yield events as they happen; the last event carries `custom_outputs`.

        Actions (`custom_inputs.action`) yield a single event with their `custom_outputs`.
        Closing the generator early ends the turn: nothing of it is written.
        """
        with _mlflow_errors():
            parsed = self._parse(request)
            yield from self._bridge().iterate(self._aevents(parsed))

    predict = _DictRequests(_predict, name="predict", stream=False)
    predict_stream = _DictRequests(_predict_stream, name="predict_stream", stream=True)

    @functools.cached_property
    def runs(self) -> Runs:
        """Background runs and resumable streams on this agent's storage (`agent.runs`)."""
        return Runs(self.operation_context.storage, self.settings)

    def close(self) -> None:
        """Stop this agent's run service (`runs`: lease renewal, cancel checks, the sweep of old runs) when it
        was started, then close the agent as `Agent.close` does (its pools and store). Idempotent.

        A `background` run of this agent still going is stopped first, as a server's shutdown stops one
        (`Runs.stop_all`): nothing of it is written, its thread is free at once, and it reads `failed` with code
        `server_shutdown`; `close` waits (at most `RECORD_ENDS_SECONDS`) until that end is recorded. Before, the
        run's end could not be recorded once the storage threads were gone, and it read `in_progress` until its
        lease expired, with a traceback in the log.
        """
        if "runs" in self.__dict__:
            if self.runs.local_ids():
                self.runs.stop_and_wait(RECORD_ENDS_SECONDS)
            self.runs.close()
        super().close()

    async def apredict(
        self,
        request: ResponsesAgentRequest | dict,
        *,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        trusted_user: bool = False,
    ) -> ResponsesAgentResponse:
        """`predict` on the event loop (for servers). `user_id`: one the host authenticated (a trusted header);
        `trusted_user`: that header is the only source of the caller (`user_id` None: anonymous);
        `idempotency_key`: the request's `Idempotency-Key` header."""
        with agent_errors():
            parsed = self._parse(request, user_id=user_id, idempotency_key=idempotency_key, trusted_user=trusted_user)
            if parsed.envelope.background:
                return await self._background(parsed)
            return await self._aresponse(parsed)

    async def apredict_stream(
        self,
        request: ResponsesAgentRequest | dict,
        *,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        trusted_user: bool = False,
        openai_events: bool = False,
    ) -> AsyncIterator[ResponsesAgentStreamEvent]:
        """`predict_stream` on the event loop (for servers). Cancelling the consumer ends the turn, writing nothing.
        `user_id`, `idempotency_key` and `trusted_user` as for `apredict`; `openai_events`: the whole event set of
        OpenAI's Responses API (`response.created` … `response.completed`, `agent.response_events`), as `POST
        /responses` streams, instead of MLflow's (text deltas, `output_item.done`, `response.completed`)."""
        with agent_errors():
            parsed = self._parse(request, user_id=user_id, idempotency_key=idempotency_key, trusted_user=trusted_user)
            if parsed.envelope.background:  # OpenAI's `background` + `stream`: the run's events, followed
                queued = await self._background(parsed)
                context = self.operation_context
                async for event in self.runs.follow(queued.id, parsed.envelope.user_id, -1, context.in_io):
                    yield ResponsesAgentStreamEvent(**event)
                return
            # Closed at once when the consumer leaves (not by the garbage collector, which may run after the
            # event loop closed and leave the turn's claim held).
            async with contextlib.aclosing(self._aevents(parsed, lifecycle=openai_events)) as events:
                async for event in events:
                    yield event

    # -- the one body -------------------------------------------------------------------------
    async def _aresponse(self, parsed: ParsedRequest) -> ResponsesAgentResponse:
        """The whole response of `parsed`: a turn's output items and `custom_outputs`, or an action's."""
        context = self.operation_context
        model = self.settings.model
        parsed = await context.in_io(self._resolved, parsed)
        if not parsed.is_turn and parsed.operation.stream is None:
            outputs = await self._in_pool(parsed)(self._run_action, parsed)
            return response([], outputs, None, model=model)
        output: list[dict] = []
        result: TurnResult | None = None
        async for event in self._turn_events(parsed, stream_tokens=False):  # consumed to its end
            if isinstance(event, NewMessages):
                output.extend(to_output_items(event.messages))
            elif isinstance(event, TurnResult):
                result = await self._finished(self._tagged(event, parsed), parsed)
                output.extend(interrupt.as_item() for interrupt in result.interrupts)
            elif isinstance(event, StoredResponse):
                event = await self._finished(self._tagged(event, parsed), parsed)
                return response(event.output, event.custom_outputs, parsed, model=model)
        return response(output, custom_outputs(result), parsed, model=model)

    async def _aevents(
        self, parsed: ParsedRequest, *, lifecycle: bool = False, background_id: str | None = None
    ) -> AsyncIterator[ResponsesAgentStreamEvent]:
        """The stream events of `parsed`: a turn's as they happen, or an action's `response.completed` (after
        `response.created` and `response.in_progress` with `lifecycle`: `StreamEvents`). A stored turn's
        events are recorded as it runs (`agent.runs`), for a client that resumes; `background_id`: the
        background run this turn is."""
        context = self.operation_context
        stream = StreamEvents(parsed, model=self.settings.model, lifecycle=lifecycle, response_id=background_id)
        recorder = self.runs.recorder(parsed, background_id=background_id, lifecycle=lifecycle) if parsed.envelope.store else None
        error: BaseException | None = None
        try:
            parsed = stream.parsed = await context.in_io(self._resolved, parsed)
            if recorder is not None:
                recorder.thread_id = parsed.envelope.thread_id  # a run that fails still names its thread
            if not parsed.is_turn and parsed.operation.stream is None:
                outputs = await self._in_pool(parsed)(self._run_action, parsed)
                for event in action_events(outputs, model=self.settings.model, lifecycle=lifecycle):
                    yield event
                return
            async with contextlib.aclosing(self._turn_events(parsed, stream_tokens=True)) as turn:
                async for event in turn:
                    event = await self._finished(self._tagged(event, parsed), parsed)
                    if recorder is not None:
                        await recorder.record(event, context.in_io)
                    for out in stream.events(event):
                        yield out
        except BaseException as exc:
            error = exc
            cancelled = recorder.cancelled(exc) if recorder is not None else None
            if cancelled is not None:  # POST /responses/{id}/cancel: the stream ends with its error event
                error = cancelled
                raise cancelled from None
            raise
        finally:
            if recorder is not None:
                await recorder.ended(error, context.in_io)

    async def _background(self, parsed: ParsedRequest, *, own_loop: bool = False) -> ResponsesAgentResponse:
        """Queue `parsed` as a background run and start it; its `queued` response (`agent.runs`).

        The run is a task on the running loop (the server's); `own_loop` (a sync `predict`, whose bridged loop
        ends with the call): on a loop thread of its own instead.
        """
        context = self.operation_context
        parsed = await context.in_io(self._resolved, parsed)  # an unknown previous_response_id answers now
        if not parsed.is_turn:
            raise InvalidRequest("background applies to turns only")
        envelope = parsed.envelope
        if envelope.thread_id is not None:  # an unknown thread or checkpoint answers now, with no run recorded
            await context.in_io(check_start, context.storage, envelope.thread_id, envelope.checkpoint_id, envelope.user_id)
        response_id = await context.in_io(self.runs.queue, parsed)

        # Under `tt-agent serve` the run takes its request's place under the admission bound, and waits for it
        # when the request got a waiting one (`agent.runs.places`); None elsewhere (no admission).
        place = None if own_loop else keep_request_place()

        async def run() -> None:
            # Its lease is renewed from now on, also while it waits for its thread (`agent.runs.service`).
            self.runs.attach(response_id, LocalRun(asyncio.get_running_loop(), asyncio.current_task()))
            try:
                with contextlib.suppress(BaseException):  # recorded as the run's status (`Recorder.ended`)
                    if place is not None:
                        await place.wait()  # `queued` meanwhile; a cancel then stops the wait (`Runs.cancel`)
                    async for _ in self._aevents(parsed, lifecycle=True, background_id=response_id):
                        pass
            finally:
                if place is not None:
                    place.release()

        if own_loop:
            threading.Thread(target=asyncio.run, args=(run(),), name="tt-background-run", daemon=True).start()
        else:
            task = asyncio.get_running_loop().create_task(run())
            self.runs.tasks.add(task)
            task.add_done_callback(self.runs.tasks.discard)
        fields = response_object([], response_id, "queued", parsed=parsed, model=self.settings.model)
        with warnings.catch_warnings():  # MLflow's status check (`responses_helpers`) does not know OpenAI's "queued"
            warnings.simplefilter("ignore", UserWarning)
            custom = {"response_id": response_id, "background": True, "thread_id": parsed.envelope.thread_id}
            return ResponsesAgentResponse(**fields, custom_outputs=custom)

    # -- internals -------------------------------------------------------------------------
    def _turn_events(self, parsed: ParsedRequest, *, stream_tokens: bool) -> AsyncIterator[Any]:
        """The events of the turn `parsed` asks for: a turn's (`TurnRunner.arun`), or those of an operation that
        is a turn (`Operation.stream`: `merge_branch`), which are streamed and answered the same way."""
        context = self.operation_context
        if parsed.is_turn:
            return context.turns.arun(_turn_args(parsed), stream_tokens=stream_tokens)
        envelope = parsed.envelope
        if envelope.thread_id is not None:
            tag_trace(envelope.thread_id, user_id=envelope.user_id)
        return parsed.operation.stream(context, parsed.args, stream_tokens=stream_tokens)

    def _bridge(self) -> LoopThreads:
        return self.operation_context.turns.bridge

    def _parse(
        self, request: Any, *, user_id: str | None = None, idempotency_key: str | None = None, trusted_user: bool = False
    ) -> ParsedRequest:
        try:
            return parse_request(
                request, self.settings, user_id=user_id, idempotency_key=idempotency_key, trusted_user=trusted_user
            )
        except InvalidRequest:
            scrub_trace_inputs()  # a refused request may hold text MLflow cannot export
            raise

    def _resolved(self, parsed: ParsedRequest) -> ParsedRequest:
        """`parsed` with the thread of its `previous_response_id` filled in, after checking that a
        `conversation` exists (a turn would otherwise create it). A storage read; nothing else changes.

        Raises: `PreviousResponseNotFound`, `ThreadNotFound` (unknown, or another user's), `ResponseInProgress`
        (its run has not finished).
        """
        envelope = parsed.envelope
        storage = self.operation_context.storage
        if envelope.thread_of_checkpoint:
            checkpoint_id = envelope.checkpoint_id
            try:
                record = thread_of_response(storage, checkpoint_id, user_id=envelope.user_id)
            except ResponseNotFound as exc:
                # A background run's id names its checkpoint through the run (`agent.runs`), while it is kept.
                checkpoint_id = self._checkpoint_of_run(f"resp_{envelope.checkpoint_id}", envelope.user_id)
                if checkpoint_id is None:
                    # OpenAI's wording and code (`previous_response_not_found`): clients look for them to resend
                    # the whole history instead.
                    raise PreviousResponseNotFound(
                        f"Previous response with id {shown_id('resp_' + envelope.checkpoint_id)} not found.", **exc.ids
                    ) from None
                record = thread_of_response(storage, checkpoint_id, user_id=envelope.user_id)
            envelope = dataclasses.replace(envelope, thread_id=record.thread_id, checkpoint_id=checkpoint_id)
            return dataclasses.replace(parsed, envelope=envelope)
        if envelope.existing_thread:
            head(storage, envelope.thread_id, user_id=envelope.user_id)
        return parsed

    def _checkpoint_of_run(self, response_id: str, user_id: str | None) -> str | None:
        """The checkpoint a completed run of `user_id` wrote (None: no such run, failed, cancelled, or another's).

        Raises:
            ResponseInProgress: the run is still queued or in progress (it has no checkpoint yet).
        """
        try:
            run = self.runs.get(response_id, user_id)
        except ResponseNotFound:
            return None
        if run is not None and not run.final:
            raise ResponseInProgress(
                f"Previous response with id {shown_id(response_id)} is still {run.status.replace('_', ' ')}; continue "
                "from it once it has completed (GET /responses/{id} reads its status). Nothing was written.",
                response_id=response_id,
            )
        return run.checkpoint_id if run is not None and run.status in ("completed", "incomplete") else None

    def _in_pool(self, parsed: ParsedRequest) -> Callable[..., Any]:
        """Where an action runs: one that writes (and may wait for its thread's claim) on the updates' pool,
        a read on the storage pool (`TurnRunner.in_update`)."""
        context = self.operation_context
        return context.in_update if parsed.operation.writes else context.in_io

    def _run_action(self, parsed: ParsedRequest) -> dict[str, Any]:
        envelope, operation = parsed.envelope, parsed.operation
        if envelope.thread_id is not None:
            tag_trace(envelope.thread_id, user_id=envelope.user_id)
        outputs = operation.as_outputs(operation.call(self.operation_context, parsed.args), parsed.args)
        if outputs.get("thread_id") and outputs.get("checkpoint_id"):  # an action that wrote a checkpoint
            tag_trace(
                outputs["thread_id"], outputs["checkpoint_id"], outputs.get("parent_checkpoint_id"), user_id=envelope.user_id
            )
        return outputs

    async def _finished(self, event: Any, parsed: ParsedRequest) -> Any:
        """`event`, a turn's result carrying `state` when the request has `include: ["state"]`
        (`agent.operations.render`); any other event as it is."""
        options = parsed.args
        if not isinstance(event, (TurnResult, StoredResponse)) or options is None or STATE not in options.include:
            return event
        context = self.operation_context
        return await context.in_io(functools.partial(with_state, user_id=parsed.envelope.user_id), context.storage, event)

    @staticmethod
    def _tagged(event: Any, parsed: ParsedRequest) -> Any:
        """`event`, after tagging the trace with the checkpoints of a TurnResult or StoredResponse."""
        if isinstance(event, TurnResult):
            tag_trace(event.thread_id, event.checkpoint_id, event.parent_checkpoint_id, user_id=parsed.envelope.user_id)
        elif isinstance(event, StoredResponse):
            outputs = event.custom_outputs
            tag_trace(
                outputs["thread_id"], outputs.get("checkpoint_id"), outputs.get("parent_checkpoint_id"), user_id=parsed.envelope.user_id
            )
        return event


def _turn_args(parsed: ParsedRequest) -> TurnArgs:
    """The turn a parsed request asks for."""
    envelope, options = parsed.envelope, parsed.args
    return TurnArgs(
        messages=envelope.messages,
        thread_id=envelope.thread_id,
        user_id=envelope.user_id,
        checkpoint_id=envelope.checkpoint_id,
        strategy=envelope.multitask_strategy,
        idempotency_key=envelope.idempotency_key,
        request_hash=envelope.request_hash,
        instructions=envelope.instructions,
        store=envelope.store,
        max_context_tokens=options.max_context_tokens if options else None,
        edit_message_id=options.edit_message_id if options else None,
        regenerate=options.regenerate if options else False,
        regenerate_message_id=options.regenerate_message_id if options else None,
        metadata=options.metadata if options else None,
        resume=options.resume if options else None,
        cancel_interrupts=options.cancel_interrupts if options else False,
    )



async def _one(result: Awaitable[Any]) -> AsyncIterator[Any]:
    """`result` as an async iterator of one item, for the bridge (which iterates)."""
    yield await result


class _mlflow_errors:
    """`agent_errors`, with the `AgentError` raised as its `MlflowException` twin (for MLflow's scoring server)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, mlflow.exceptions.MlflowException):
            return False
        if not isinstance(exc, AgentError):
            logger.exception("Unexpected error in the agent")
            error = AgentError(f"Internal error ({type(exc).__name__}); see the server log.")
            raise as_mlflow_exception(error) from exc
        raise as_mlflow_exception(exc) from exc.__cause__


def _validated_request(raw: dict) -> ResponsesAgentRequest:
    raw = with_string_input(raw)
    try:
        # The same two steps as mlflow.pyfunc.utils.data_validation.wrap_non_list_predict_pydantic,
        # keeping the input items' ids (requests.ItemIdsRequest).
        ResponsesAgentRequest.model_validate(raw, strict=True)
        return keeping_item_ids(raw)
    except Exception as exc:  # pydantic's ValidationError, or whatever MLflow's validators raise
        errors = getattr(exc, "errors", None)
        if callable(errors):  # pydantic's ValidationError: one line, without its documentation links
            reason = validation_problems(errors(include_url=False))
        else:
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        raise as_mlflow_exception(
            InvalidRequest(f"Invalid dictionary input for a ResponsesAgent; expected the ResponsesRequest schema: {reason}")
        ) from None
