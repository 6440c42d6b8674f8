"""`LangGraphResponsesAgent`: the MLflow `ResponsesAgent` adapter over `agent.operations.Threads`.

A thin translation layer: it parses a request once (`requests.parse_request`),
dispatches through `agent.operations.ACTIONS`, and builds Responses items with
MLflow's helpers. It holds no memory or branching logic.

* `predict` / `predict_stream` are MLflow's interface (in-process callers,
  `mlflow models serve`); `apredict` / `apredict_stream` are the same on the
  event loop, for the HTTP server (`agent.serving`): the model call is awaited
  and no thread is held while it runs.
* Streaming yields `response.output_text.delta` events as the model produces
  tokens and `response.output_item.done` per finished item. The last
  `output_item.done` is held back until the turn is committed, so that it can
  carry `custom_outputs` with the new `checkpoint_id` (the Databricks reference
  drops `custom_outputs` on streams). A turn's stream then ends with
  `response.completed`: the whole response (every item again, as OpenAI's) with
  its `id`, known only after the commit.
* A turn's response `id` is `resp_<checkpoint_id>` (also `custom_outputs.response_id`),
  so the `openai` client's `previous_response_id` names a checkpoint; the request's
  `previous_response_id` is resolved to its thread here (`_resolved`), once, before
  the turn (see `agent.requests` for the OpenAI fields).
* A retry with an idempotency key whose first request committed gets that
  request's response again (`StoredResponse`); streamed, it is replayed as
  events: a text delta and an `output_item.done` per item, the last carrying
  `custom_outputs`.
* Errors: everything raised is an `AgentError`. From `predict`/`predict_stream`
  it is also an `MlflowException` (`agent.serving.errors.as_mlflow_exception`),
  so MLflow's scoring server answers with its status instead of a 500; an
  unexpected exception is logged here and re-raised as a plain `AgentError`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from datetime import datetime
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.config import AgentSettings
from agent.errors import AgentError, InvalidRequest
from agent.messages import to_langchain, to_output_items
from agent.operations import Threads, TurnArgs
from agent.requests import ParsedRequest, keeping_item_ids, parse_request, with_string_input
from agent.serving.errors import as_mlflow_exception
from agent.tracing import scrub_trace_inputs, tag_trace
from agent.types import AgentInfo, NewMessages, StoredResponse, TextDelta, TurnResult
from agent.validation import check_id, check_limit, check_user_id, encoded_size, required_id, validation_problems

logger = logging.getLogger(__name__)


class LangGraphResponsesAgent(ResponsesAgent):
    """A conversational agent with checkpoint memory you can branch from.

    Build one with `agent.create_agent(...)`. Close it with `close()` or use it
    as a context manager; it owns a connection pool.
    """

    def __init__(self, threads: Threads, settings: AgentSettings) -> None:
        self.threads = threads
        self.settings = settings

    @property
    def storage(self):
        """The `agent.storage.ThreadStorage` this agent keeps its threads in."""
        return self.threads.storage

    def info(self) -> AgentInfo:
        """What is running: name, version, the store (`store`: an absolute SQLite path or a masked
        Postgres URL; `store_kind`), the model's name, and whether tracing is on."""
        from agent.version import __version__
        from agent.config import store_kind, store_label

        url = self.settings.database_url
        return AgentInfo(
            name="timetravel-agent",
            version=__version__,
            store=store_label(url),
            store_kind=store_kind(url),
            model=self.settings.model,
            tracing=bool(self.settings.tracing),
        )

    @property
    def graph(self):
        """The compiled LangGraph graph (for drawing it; read state with `get_checkpoint_state`: LangGraph's
        latest checkpoint is not the head after `set_head`)."""
        return self.threads.graph

    # -- Responses API ---------------------------------------------------------------
    def predict(self, request: ResponsesAgentRequest) -> ResponsesAgentResponse:
        """Run one turn, or one `custom_inputs.action`, and return the whole response.

        In: a Responses request; `custom_inputs` as documented in `agent.requests` (a turn may
        also carry `edit_message_id` or `regenerate`; see `agent.operations.edits`).
        Out: `output` items for the new messages; `custom_outputs` with
        `thread_id`, `checkpoint_id` (the head after the turn) and
        `parent_checkpoint_id` (where the turn started), or the action's results.

        Raises: `InvalidRequest`, `ThreadNotFound`, `CheckpointNotFound`,
        `ThreadBusy`, `TurnCancelled`, `ModelError`, `StorageUnavailable` (all `AgentError`).
        """
        with _agent_errors(mlflow=True):
            parsed = self._resolved(self._parse(request))
            if parsed.action.run is not None:
                return ResponsesAgentResponse(output=[], custom_outputs=self._run_action(parsed))
            output: list[dict] = []
            result: TurnResult | None = None
            for event in self.threads.run_turn(_turn_args(parsed), stream_tokens=False):
                if isinstance(event, NewMessages):
                    output.extend(to_output_items(event.messages))
                elif isinstance(event, TurnResult):
                    result = self._tagged(event, parsed)
                    output.extend(interrupt.as_item() for interrupt in result.interrupts)
                elif isinstance(event, StoredResponse):
                    return self._replayed(event, parsed)
            return _response(output, _custom_outputs(result), parsed)

    def predict_stream(self, request: ResponsesAgentRequest) -> Generator[ResponsesAgentStreamEvent, None, None]:
        """Run one turn and yield events as they happen; the last event carries `custom_outputs`.

        Actions (`custom_inputs.action`) yield a single event with their `custom_outputs`.
        Closing the generator early ends the turn: nothing of it is written.
        """
        with _agent_errors(mlflow=True):
            parsed = self._resolved(self._parse(request))
            if parsed.action.run is not None:
                yield _completed_event(self._run_action(parsed))
                return
            stream = _StreamEvents(parsed)
            for event in self.threads.run_turn(_turn_args(parsed), stream_tokens=True):
                yield from stream.events(self._tagged(event, parsed))

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
        with _agent_errors():
            parsed = self._parse(request, user_id=user_id, idempotency_key=idempotency_key, trusted_user=trusted_user)
            parsed = await self.threads.in_io(self._resolved, parsed)
            if parsed.action.run is not None:
                return ResponsesAgentResponse(output=[], custom_outputs=await self._arun_action(parsed))
            output: list[dict] = []
            result: TurnResult | None = None
            async for event in self.threads.arun_turn(_turn_args(parsed), stream_tokens=False):
                if isinstance(event, NewMessages):
                    output.extend(to_output_items(event.messages))
                elif isinstance(event, TurnResult):
                    result = self._tagged(event, parsed)
                    output.extend(interrupt.as_item() for interrupt in result.interrupts)
                elif isinstance(event, StoredResponse):
                    return self._replayed(event, parsed)
            return _response(output, _custom_outputs(result), parsed)

    async def apredict_stream(
        self,
        request: ResponsesAgentRequest | dict,
        *,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        trusted_user: bool = False,
    ) -> AsyncIterator[ResponsesAgentStreamEvent]:
        """`predict_stream` on the event loop (for servers). Cancelling the consumer ends the turn, writing nothing.
        `user_id`, `idempotency_key` and `trusted_user` as for `apredict`."""
        with _agent_errors():
            parsed = self._parse(request, user_id=user_id, idempotency_key=idempotency_key, trusted_user=trusted_user)
            parsed = await self.threads.in_io(self._resolved, parsed)
            if parsed.action.run is not None:
                yield _completed_event(await self._arun_action(parsed))
                return
            stream = _StreamEvents(parsed)
            async for event in self.threads.arun_turn(_turn_args(parsed), stream_tokens=True):
                for out in stream.events(self._tagged(event, parsed)):
                    yield out

    # -- time travel (Python API) -------------------------------------------------------
    def get_checkpoint_history(
        self, thread_id: str, limit: int = 10, before: str | None = None, *, user_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The thread's checkpoints, newest first, all branches interleaved.

        Each entry: `checkpoint_id`, `parent_checkpoint_id`, `thread_id`,
        `timestamp` (ISO 8601, UTC), `next_nodes` (node names), `message_count`,
        `last_message` and `last_user_message` (at most 100 characters each),
        `source` (`root` for the thread's empty first checkpoint, `loop` for a
        turn, `update` for a state update), `step` and `is_head`. `before` (a
        checkpoint_id) pages backwards.

        Raises: `InvalidRequest` (bad ids or limit), `ThreadNotFound`, `CheckpointNotFound` (`before`).
        """
        with _agent_errors():
            entries = self.threads.history(
                required_id("thread_id", thread_id),
                user_id=self._user(user_id),
                limit=check_limit(limit),
                before=check_id("before", before),
            )
            return [entry.as_dict() for entry in entries]

    def update_checkpoint_state(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        new_messages: Sequence[dict] | None = None,
        *,
        remove_message_ids: Sequence[str] | None = None,
        edit_message_id: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, str | None]:
        """Create a checkpoint whose parent is `checkpoint_id` (None: the head), with Responses-style
        `new_messages` (e.g. `[{"role": "user", "content": "I'm headed to Tokyo!"}]`) applied.

        An item whose `id` names a message of the checkpoint replaces it (LangGraph's
        `add_messages`); others are appended. `remove_message_ids` (message ids, or a
        `function_call` item's id) are removed first; removing a tool call removes its
        result too. `edit_message_id` with exactly one item: that item replaces the message
        with that id, in place. It becomes the thread head. Returns `thread_id`,
        `checkpoint_id` (the new one) and `parent_checkpoint_id`.

        Raises: `InvalidRequest` (also: an id to remove is not in the checkpoint, or nothing
        would be left), `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
        """
        with _agent_errors():
            if new_messages is not None and not isinstance(new_messages, (list, tuple)):
                raise InvalidRequest("new_messages must be a list of Responses message items")
            if remove_message_ids is not None and not isinstance(remove_message_ids, (list, tuple)):
                raise InvalidRequest("remove_message_ids must be a list of message ids")
            encoded_size("new_messages", new_messages)  # refuses lone surrogates, as requests do
            messages = to_langchain(list(new_messages or []))
            if edit_message_id is not None and len(messages) != 1:
                raise InvalidRequest("With edit_message_id, update_checkpoint_state takes exactly one new message")
            result = self.threads.update_state(
                required_id("thread_id", thread_id),
                check_id("checkpoint_id", checkpoint_id),
                messages,
                user_id=self._user(user_id),
                edit_message_id=check_id("edit_message_id", edit_message_id),
                remove_message_ids=[
                    required_id(f"remove_message_ids[{i}]", value) for i, value in enumerate(remove_message_ids or ())
                ],
            )
            return result.as_dict()

    def get_checkpoint_state(
        self, thread_id: str, checkpoint_id: str | None = None, *, user_id: str | None = None
    ) -> dict[str, Any]:
        """The head (or `checkpoint_id`) with its messages: what a chat UI renders.

        Out: the history entry's fields (`checkpoint_id`, `parent_checkpoint_id`,
        `message_count`, `last_user_message`, `is_head`, …) and `messages`, the whole
        list as Responses items (`message`, `function_call`, `function_call_output`),
        oldest first, each with its `id` and: `checkpoint_id` (where the message first
        appeared), `branch_checkpoint_id` (the checkpoint before it: where an edit or a
        regeneration of it branches from; the thread's root for the first message) and
        `siblings` (`{"index", "count", "checkpoint_ids"}`: every alternative at that
        position, this one included, oldest first). At the root: no messages. A checkpoint
        where the graph waits on `interrupt()` also has `interrupts` (`[{"id", "value", "node"}]`:
        what `custom_inputs.resume` answers).

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
        """
        with _agent_errors():
            state = self.threads.get_checkpoint_state(
                required_id("thread_id", thread_id), check_id("checkpoint_id", checkpoint_id), user_id=self._user(user_id)
            )
            return state.as_dict()

    def list_branches(self, thread_id: str, *, user_id: str | None = None) -> list[dict[str, Any]]:
        """One entry per branch (a leaf of the checkpoint tree), newest first.

        Each: the leaf's history-entry fields (`checkpoint_id`, `message_count`,
        `last_user_message`, `is_head`, …), `fork_checkpoint_id` (where the branch leaves
        its nearest other branch; None for a thread without branches) and `updated_at`
        (the leaf's timestamp, ISO 8601 UTC).

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound`.
        """
        with _agent_errors():
            branches = self.threads.list_branches(required_id("thread_id", thread_id), user_id=self._user(user_id))
            return [branch.as_dict() for branch in branches]

    def set_head(self, thread_id: str, checkpoint_id: str, *, user_id: str | None = None) -> dict[str, str]:
        """Switch the thread to another branch: `checkpoint_id` (any checkpoint of it) becomes the head,
        without writing a checkpoint; the next turn continues there.

        Returns `thread_id`, `checkpoint_id` and `previous_checkpoint_id` (the head before).

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
        """
        with _agent_errors():
            move = self.threads.set_head(
                required_id("thread_id", thread_id), required_id("checkpoint_id", checkpoint_id), user_id=self._user(user_id)
            )
            return move.as_dict()

    def fork_thread(
        self,
        thread_id: str,
        checkpoint_id: str | None = None,
        *,
        new_thread_id: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        """A new thread, owned by the same user, whose history is the ancestor chain of `checkpoint_id`
        (default: the head), with the same messages; independent of the source afterwards.

        Returns `thread_id` and `checkpoint_id` (the new thread and its head) and
        `forked_from` (`{"thread_id", "checkpoint_id"}`, also kept in the new thread's record).

        Raises: `InvalidRequest` (bad ids, or `new_thread_id` in use), `ThreadNotFound`, `CheckpointNotFound`.
        """
        with _agent_errors():
            result = self.threads.fork_thread(
                required_id("thread_id", thread_id),
                check_id("checkpoint_id", checkpoint_id),
                new_thread_id=check_id("new_thread_id", new_thread_id),
                user_id=self._user(user_id),
            )
            return result.as_dict()

    def compare_checkpoints(
        self, thread_id: str, checkpoint_a: str, checkpoint_b: str, *, user_id: str | None = None
    ) -> dict[str, Any]:
        """Two checkpoints of a thread side by side.

        Returns `thread_id`, `checkpoint_a`, `checkpoint_b`, `common_ancestor_checkpoint_id` and
        `only_a` / `only_b`: the messages (items as in `get_checkpoint_state`) each side has after
        the leading messages both share.

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
        """
        with _agent_errors():
            diff = self.threads.compare_checkpoints(
                required_id("thread_id", thread_id),
                required_id("checkpoint_a", checkpoint_a),
                required_id("checkpoint_b", checkpoint_b),
                user_id=self._user(user_id),
            )
            return diff.as_dict()

    def get_usage(
        self, thread_id: str, checkpoint_id: str | None = None, *, user_id: str | None = None
    ) -> dict[str, Any]:
        """Tokens the model used, as it reported them: `thread_usage` (every branch of the thread) and
        `branch_usage` (from the root to `checkpoint_id`, default the head), each `{"input_tokens",
        "output_tokens"}`, with `thread_id` and `checkpoint_id`.

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
        """
        with _agent_errors():
            usage = self.threads.token_usage(
                required_id("thread_id", thread_id),
                user_id=self._user(user_id),
                checkpoint_id=check_id("checkpoint_id", checkpoint_id),
            )
            return usage.as_dict()

    def delete_thread(self, thread_id: str, *, user_id: str | None = None) -> None:
        """Delete every checkpoint, write and the ownership record of a thread.

        Raises: `InvalidRequest`, `ThreadNotFound` (unknown, or not the caller's).
        """
        with _agent_errors():
            self.threads.delete_thread(required_id("thread_id", thread_id), user_id=self._user(user_id))

    def delete_user_data(self, user_id: str) -> list[str]:
        """Delete every thread `user_id` owns and all the user's long-term memories; returns the deleted
        thread ids, sorted."""
        with _agent_errors():
            return self.threads.delete_user_data(required_id("user_id", user_id))

    # -- the thread catalogue (Python API) ------------------------------------------------------
    def list_threads(
        self,
        *,
        user_id: str | None = None,
        limit: int = 20,
        before: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """The caller's threads, newest activity first (`updated_at` DESC, then `thread_id` DESC).

        Each: `thread_id`, `user_id`, `title` (default: the first user message, shortened to 60
        characters), `created_at`, `updated_at` (last activity; ISO 8601, UTC), `checkpoint_id` (the
        head), `message_count`, `metadata`, `forked_from`, `ttl_seconds`, and `cursor`: pass the last
        thread's as `before` for the next page (an empty page: no more). Paging neither repeats nor
        skips a thread while others write, except that a thread given new activity meanwhile moves to
        the top of a fresh first page (see `agent.operations.catalogue`). `limit`: 1 to 100.
        `metadata`: only threads whose metadata holds all these pairs.

        Raises: `InvalidRequest` (bad limit, cursor or metadata), `ThreadNotFound` (`before` is a
        thread id the caller does not own).
        """
        with _agent_errors():
            return self.threads.list_threads(
                user_id=self._user(user_id), limit=limit, before=before, metadata=metadata
            )

    def get_thread(self, thread_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """One thread, as `list_threads` lists it (without `cursor`).

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound` (unknown, or not the caller's).
        """
        with _agent_errors():
            return self.threads.get_thread(required_id("thread_id", thread_id), user_id=self._user(user_id))

    def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, str] | None = None,
        ttl_seconds: float | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        """Set the thread's `title` (1 to 256 characters), `metadata` (replaces the whole object: at most
        16 pairs, string keys up to 64 characters, string values up to 512, as OpenAI's) and/or
        `ttl_seconds` (idle seconds before retention may remove it); None leaves a field as it is.
        `updated_at` (the last activity) does not change. Returns the thread as `get_thread` does.

        Raises: `InvalidRequest` (a value out of bounds; nothing is written), `ThreadNotFound`.
        """
        with _agent_errors():
            return self.threads.update_thread(
                required_id("thread_id", thread_id),
                user_id=self._user(user_id),
                title=title,
                metadata=metadata,
                ttl_seconds=ttl_seconds,
            )

    # -- export and import (Python API) -----------------------------------------------------
    def export_thread(self, thread_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """The whole thread as a versioned, JSON-serializable document (`agent.operations.transfer`).

        Out: `{"format": "timetravel-agent.thread", "version": 1, "exported_at", "thread": {thread_id,
        title, metadata, checkpoint_id (the head), forked_from, ttl_seconds, message_count, created_at,
        updated_at}, "checkpoints": [...]}`: every checkpoint, the root included, oldest first, with
        `checkpoint_id`, `parent_checkpoint_id`, `ts`, `metadata` and its channel values (`messages` as
        LangChain message dicts). The owner is not in it.

        Raises: `InvalidRequest` (bad ids), `ThreadNotFound` (unknown, or not the caller's).
        """
        with _agent_errors():
            return self.threads.export_thread(required_id("thread_id", thread_id), user_id=self._user(user_id))

    def import_thread(
        self, document: dict[str, Any], *, user_id: str | None = None, thread_id: str | None = None
    ) -> dict[str, Any]:
        """Restore a document from `export_thread` (from any backend) as a thread owned by `user_id`.

        Under the document's thread id: the same checkpoint ids, parents, timestamps and messages, the
        same head, title, metadata and `forked_from`. Under `thread_id`: a copy with new checkpoint ids
        (in the same order). Returns the thread: `thread_id`, `user_id`, `title`, `created_at`,
        `updated_at`, `checkpoint_id` (the head), `message_count`, `metadata`, `forked_from`,
        `ttl_seconds`. Importing the same document again returns the thread and writes nothing.

        Raises: `InvalidRequest` (a malformed document: nothing written), `ThreadExists` (the thread id
        is in use with other content or by another user, or another thread holds its checkpoint ids),
        `ThreadBusy`.
        """
        with _agent_errors():
            return self.threads.import_thread(
                document, user_id=self._user(user_id), thread_id=check_id("thread_id", thread_id)
            )

    # -- retention (Python API) ----------------------------------------------------------------
    def sweep_expired_threads(self, *, now: datetime | None = None) -> dict[str, Any]:
        """Delete, or trim to their head, the threads idle longer than their time to live.

        A thread expires `ttl_seconds` (its own, set with `update_thread`, else the
        `thread_ttl_seconds` setting; neither: never) after its last write (`updated_at`).
        `thread_ttl_strategy` says what happens: `delete` (the whole thread, as `delete_thread`)
        or `keep_latest` (only the head checkpoint stays, its messages whole; the thread stays usable).
        A thread busy with a turn is skipped; replicas sweeping at once handle each thread once.

        Args:
            now: judge expiry as of this timezone-aware time instead of the database's clock
                (Postgres) or this machine's (SQLite); for tests.

        Returns:
            `{"deleted_thread_ids": [str], "trimmed": [{"thread_id": str, "removed_checkpoints": int}]}`,
            oldest activity first.

        Raises: `InvalidRequest` (a naive `now`), `StorageUnavailable`.
        """
        with _agent_errors():
            return self.threads.sweep_expired_threads(now=now).as_dict()

    # -- long-term memory (Python API) ------------------------------------------------------
    def list_memories(self, user_id: str, query: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The user's long-term memories, in every `memory_scope`: newest first, or most relevant first
        for `query` (keyword search: only memories sharing a word with it; semantic: all, by similarity).

        Each entry: `memory_id`, `content`, `thread_id` and `checkpoint_id` (the turn that saved it),
        `created_at` (ISO 8601, UTC). `limit`: 1 to 1000.

        Raises: `InvalidRequest` (bad user_id, query or limit).
        """
        from agent.operations.memories import MAX_MEMORY_LIMIT, check_query

        with _agent_errors():
            found = self.threads.list_memories(
                required_id("user_id", user_id), check_query(query), check_limit(limit, maximum=MAX_MEMORY_LIMIT)
            )
            return [memory.as_dict() for memory in found]

    def delete_memory(self, user_id: str, memory_id: str) -> None:
        """Delete one of the user's long-term memories.

        Raises: `InvalidRequest` (bad ids), `MemoryNotFound` (no such memory among the user's; another
        user's memory answers the same, and is not deleted).
        """
        with _agent_errors():
            self.threads.delete_memory(required_id("user_id", user_id), required_id("memory_id", memory_id))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release the connection pool. The agent is unusable afterwards."""
        self.threads.close()

    def __enter__(self) -> LangGraphResponsesAgent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------
    def _user(self, user_id: Any) -> str | None:
        return check_user_id(user_id, require=self.settings.require_user_id)

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

        Raises: `ResponseNotFound`, `ThreadNotFound` (unknown, or another user's).
        """
        envelope = parsed.envelope
        if envelope.thread_of_checkpoint:
            thread_id = self.threads.thread_of_response(envelope.checkpoint_id, user_id=envelope.user_id)
            return dataclasses.replace(parsed, envelope=dataclasses.replace(envelope, thread_id=thread_id))
        if envelope.existing_thread:
            self.threads.head(envelope.thread_id, user_id=envelope.user_id)
        return parsed

    def _run_action(self, parsed: ParsedRequest) -> dict[str, Any]:
        envelope = parsed.envelope
        if envelope.thread_id is not None:
            tag_trace(envelope.thread_id, user_id=envelope.user_id)
        outputs = parsed.action.run(self.threads, envelope, parsed.args)
        if outputs.get("thread_id") and outputs.get("checkpoint_id"):  # an action that wrote a checkpoint
            tag_trace(
                outputs["thread_id"], outputs["checkpoint_id"], outputs.get("parent_checkpoint_id"), user_id=envelope.user_id
            )
        return outputs

    async def _arun_action(self, parsed: ParsedRequest) -> dict[str, Any]:
        return await self.threads.in_io(self._run_action, parsed)

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

    def _replayed(self, stored: StoredResponse, parsed: ParsedRequest) -> ResponsesAgentResponse:
        self._tagged(stored, parsed)
        return _response(stored.output, stored.custom_outputs, parsed)


class _StreamEvents:
    """Turns a turn's events into Responses stream events, holding back the last message item
    until the commit so that it can carry `custom_outputs`, and ending with `response.completed`:
    the whole response with its `id` (known only once the turn's checkpoint is written)."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self.parsed = parsed
        self.held: dict | None = None
        self.items: list[dict] = []

    def events(self, event: TextDelta | NewMessages | TurnResult | StoredResponse) -> list[ResponsesAgentStreamEvent]:
        out: list[ResponsesAgentStreamEvent] = []
        if isinstance(event, StoredResponse):
            return _replay_events(event, self.parsed)
        if isinstance(event, TextDelta):
            out.append(ResponsesAgentStreamEvent(**ResponsesAgent.create_text_delta(delta=event.text, item_id=event.item_id)))
        elif isinstance(event, NewMessages):
            for item in to_output_items(event.messages):
                self.items.append(item)
                if self.held is not None:
                    out.append(ResponsesAgentStreamEvent(type="response.output_item.done", item=self.held))
                    self.held = None
                # Only an assistant text can be the turn's last item; tool calls and results go out at once.
                if item.get("type") == "message":
                    self.held = item
                else:
                    out.append(ResponsesAgentStreamEvent(type="response.output_item.done", item=item))
        else:
            custom = _custom_outputs(event)
            # The held reply, then the questions the graph stopped at; the last of them carries custom_outputs.
            last = ([self.held] if self.held is not None else []) + [interrupt.as_item() for interrupt in event.interrupts]
            self.items.extend(last[1:] if self.held is not None else last)
            for index, item in enumerate(last):
                extra = {"custom_outputs": custom} if index == len(last) - 1 else {}
                out.append(ResponsesAgentStreamEvent(type="response.output_item.done", item=item, **extra))
            out.append(_completed_event(custom, self.items, self.parsed))
        return out


def _replay_events(stored: StoredResponse, parsed: ParsedRequest) -> list[ResponsesAgentStreamEvent]:
    """A stored response as the events of a stream: per item a text delta (messages) and its
    `output_item.done` (the last one with `custom_outputs`), then `response.completed`."""
    out: list[ResponsesAgentStreamEvent] = []
    for index, item in enumerate(stored.output):
        if item.get("type") == "message":
            text = "".join(part.get("text", "") for part in item.get("content") or [])
            if text:
                out.append(ResponsesAgentStreamEvent(**ResponsesAgent.create_text_delta(delta=text, item_id=item["id"])))
        last = index == len(stored.output) - 1
        extra = {"custom_outputs": stored.custom_outputs} if last else {}
        out.append(ResponsesAgentStreamEvent(type="response.output_item.done", item=item, **extra))
    out.append(_completed_event(stored.custom_outputs, stored.output, parsed))
    return out


def _response_fields(custom_outputs: dict[str, Any], parsed: ParsedRequest | None) -> dict[str, Any]:
    """The Responses API fields of a turn's response besides its output: `id` (`resp_<checkpoint_id>`,
    from `custom_outputs`), `status`, and the `instructions` and `previous_response_id` it was asked with."""
    fields: dict[str, Any] = {"object": "response"}
    if custom_outputs.get("response_id"):
        fields["id"] = custom_outputs["response_id"]
    fields["status"] = "incomplete" if custom_outputs.get("status") == "interrupted" else "completed"
    envelope = parsed.envelope if parsed is not None else None
    if envelope is not None and envelope.instructions is not None:
        fields["instructions"] = envelope.instructions
    if envelope is not None and envelope.thread_of_checkpoint:
        fields["previous_response_id"] = f"resp_{envelope.checkpoint_id}"
    return fields


def _response(output: list[dict], custom_outputs: dict[str, Any], parsed: ParsedRequest) -> ResponsesAgentResponse:
    return ResponsesAgentResponse(output=output, custom_outputs=custom_outputs, **_response_fields(custom_outputs, parsed))


def _turn_args(parsed: ParsedRequest) -> TurnArgs:
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
        metadata=options.metadata if options else None,
        resume=options.resume if options else None,
        cancel_interrupts=options.cancel_interrupts if options else False,
    )


def _completed_event(
    custom_outputs: dict[str, Any], output: list[dict] | None = None, parsed: ParsedRequest | None = None
) -> ResponsesAgentStreamEvent:
    # MLflow validates a `response.completed` event against the Responses schema, which requires a
    # `response` with its `output`. A turn's carries every item again (as OpenAI's does) and the `id`;
    # an action's has none (its results are in `custom_outputs`).
    response = {"output": list(output or []), **_response_fields(custom_outputs, parsed)}
    if parsed is None:
        response = {"output": [], "status": "completed"}
    return ResponsesAgentStreamEvent(type="response.completed", response=response, custom_outputs=custom_outputs)


def _custom_outputs(result: TurnResult | None) -> dict[str, Any]:
    if result is None:  # pragma: no cover - a turn always ends with a TurnResult
        raise AgentError("The turn ended without a result.")
    return result.as_dict()


class _agent_errors:
    """Let `AgentError` through (as an `MlflowException` twin when `mlflow`); turn anything else into an
    `AgentError` without a traceback for the client, logging it here."""

    def __init__(self, *, mlflow: bool = False) -> None:
        self.mlflow = mlflow

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, MlflowException):
            return False
        if not isinstance(exc, AgentError):
            logger.exception("Unexpected error in the agent")
            error = AgentError(f"Internal error ({type(exc).__name__}); see the server log.")
            raise (as_mlflow_exception(error) if self.mlflow else error) from exc
        if self.mlflow:
            raise as_mlflow_exception(exc) from exc.__cause__
        return False


def _validated_before_mlflow(method: Callable) -> Callable:
    # ResponsesAgent validates dict requests with pydantic before our code runs
    # and raises a bare MlflowException (or lets through what its validators
    # raise on odd input, such as a TypeError). Callers should see InvalidRequest,
    # and the OpenAI client's `input="Hi"` should work. So a dict is validated
    # here, and MLflow's wrapper gets a ResponsesAgentRequest, which it passes through.
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if len(args) == 1 and isinstance(args[0], dict):
            args = (_validated_request(args[0]),)
        return method(self, *args, **kwargs)

    return wrapper


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


# After the class body, because ResponsesAgent.__init_subclass__ wraps `predict` and
# `predict_stream` (tracing, then pydantic validation of dicts) when the class is created;
# this wraps that, so a dict is validated our way first.
LangGraphResponsesAgent.predict = _validated_before_mlflow(LangGraphResponsesAgent.predict)
LangGraphResponsesAgent.predict_stream = _validated_before_mlflow(LangGraphResponsesAgent.predict_stream)
