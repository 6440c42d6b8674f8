"""A turn's results as Responses API objects: the response, and the events of a stream (MLflow's types).

The wire format is OpenAI's whole (`openai.types.responses.Response` and
`ResponseStreamEvent` validate every object here, and the `openai` client's
`responses.stream()` helper consumes a stream), carried in MLflow's
`ResponsesAgentStreamEvent` / `ResponsesAgentResponse`, which allow the extra fields:

* A response has `id`, `object`, `created_at` (when its turn took its thread: the time in
  its id), `status`, `model` (the server's), `output`, and the request settings it ran with
  (`agent.dialect.RESPONSE_SETTINGS`: `tools: []`, `tool_choice: "auto"`,
  `parallel_tool_calls: true`; the agent's own tools are not client tools), plus
  `instructions` and `previous_response_id` when the request had them.
* A turn's response `id` is `resp_<checkpoint_id>` (also `custom_outputs.response_id`), so the
  `openai` client's `previous_response_id` names a checkpoint. It is known once the turn holds its
  thread (`TurnStarted`), before the model runs: the turn's checkpoint is given that id when it
  commits (`agent.storage.records.Turn.name_head`). Except for a turn that stops at the graph's
  `interrupt()`: its checkpoint keeps LangGraph's id (LangGraph derives the interrupts' ids from
  it), so its `response.completed` names another id than `response.created` did.
* A stream numbers its events (`sequence_number` 0, 1, 2, ...) and goes: `response.created`,
  `response.in_progress`; per output item `response.output_item.added`, for a message
  `response.content_part.added`, its `response.output_text.delta`s (as the model produces tokens),
  `response.output_text.done` and `response.content_part.done`; then `response.output_item.done`;
  last `response.completed` with the whole response (every item again, as OpenAI's). Items and
  deltas carry their `output_index`; deltas their `content_index` and `logprobs` (`[]`).
* The last message's `output_item.done` is held back until the turn is committed, so that it can
  carry `custom_outputs` with the new `checkpoint_id` (the Databricks reference drops
  `custom_outputs` on streams); `response.completed` carries them too, in the event and in its
  `response` (as `retrieve` has them, for the `openai` client's `get_final_response`), and the event
  alone carries their `state` (`include: ["state"]`, `agent.operations.render`), so that the stream
  holds it once.
* A retry with an idempotency key whose first request committed gets that request's response
  again (`StoredResponse`); streamed, it is replayed as the same events, each message's text as
  one delta.
* An action (`custom_inputs.action`) answers with a response whose `output` is empty and whose
  results are in `custom_outputs`; streamed, its three lifecycle events come at once, when it is done.
  Except an action that is a turn (`Operation.stream`: `merge_branch`): it yields a turn's events,
  so its response and its stream are a turn's, made here the same way.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.dialect import RESPONSE_SETTINGS
from agent.errors import AgentError
from agent.items import STATUS_TYPES
from agent.messages import to_output_items
from agent.requests import ParsedRequest
from agent.types import NewMessages, StoredResponse, TextDelta, TurnResult, TurnStarted

#: 100 ns intervals from 1582-10-15 (the uuid epoch) to 1970-01-01.
GREGORIAN_TO_UNIX = 0x01B21DD213814000

#: The events of MLflow's own streams (`ResponsesAgent.predict_stream`): a stream without the lifecycle has only these.
MLFLOW_EVENTS = frozenset({"response.output_text.delta", "response.output_item.done", "response.completed"})



class StreamEvents:
    """Turns a turn's events into Responses stream events (module docstring): numbered, each item
    opened and closed, the last message's `output_item.done` held until the commit so that it can
    carry `custom_outputs`, and `response.completed` last.

    `lifecycle=False` (MLflow's stream: `predict_stream`, `/invocations`) leaves out the events
    MLflow's own streams do not have (`MLFLOW_EVENTS` are kept), numbering the rest.
    """

    def __init__(
        self, parsed: ParsedRequest | None, *, model: str, lifecycle: bool = True, response_id: str | None = None
    ) -> None:
        self.parsed = parsed
        self.model = model
        self.lifecycle = lifecycle
        #: A background run's id (`agent.runs`), which its response keeps to the end; None: the turn's.
        self.fixed_id = response_id
        self.response_id: str | None = response_id
        self.sequence = 0
        #: The response's output items, by output_index (a streamed message: as it stands so far).
        self.items: list[dict] = []
        #: Messages whose text is streaming: item id -> output_index.
        self.open: dict[str, int] = {}
        #: The held `output_item.done` of the last message: its output_index.
        self.held: int | None = None

    def events(
        self, event: TurnStarted | TextDelta | NewMessages | TurnResult | StoredResponse
    ) -> list[ResponsesAgentStreamEvent]:
        """The stream events for one event of a turn."""
        if isinstance(event, StoredResponse):
            return self.numbered(self.replay(event))
        if isinstance(event, TurnStarted):
            return self.numbered(self.started(event.response_id))
        if isinstance(event, TextDelta):
            return self.numbered(self.delta(event.item_id, event.text))
        if isinstance(event, NewMessages):
            return self.items_done(to_output_items(event.messages))
        tail = [interrupt.as_item() for interrupt in event.interrupts]
        return self.result_done(custom_outputs(event), tail, interrupted=event.status == "interrupted")

    def items_done(self, items: list[dict]) -> list[ResponsesAgentStreamEvent]:
        """The stream events for output items a step of the turn finished (a `NewMessages`'s)."""
        out: list[dict[str, Any]] = []
        for item in items:  # each item releases the message held before it, one of this step's too
            out += self.release() + self.finished_item(item)
        return self.numbered(out)

    def result_done(self, custom: dict[str, Any], tail: list[dict], *, interrupted: bool) -> list[ResponsesAgentStreamEvent]:
        """The stream events for a turn's end (a `TurnResult`'s): `custom` its `custom_outputs`."""
        return self.numbered(self.finished(custom, tail, interrupted=interrupted))

    def numbered(self, events: list[dict[str, Any]]) -> list[ResponsesAgentStreamEvent]:
        """`events` (those of this kind of stream), numbered on from the last one, as MLflow's type."""
        out = []
        for event in events:
            if self.lifecycle or event["type"] in MLFLOW_EVENTS:
                out.append(ResponsesAgentStreamEvent(**event, sequence_number=self.sequence))
                self.sequence += 1
        return out

    # -- the steps of a stream ---------------------------------------------------------------------
    def started(self, response_id: str) -> list[dict[str, Any]]:
        self.response_id = self.fixed_id or response_id
        return [
            self.event("response.created", response=self.response("in_progress")),
            self.event("response.in_progress", response=self.response("in_progress")),
        ]

    def delta(self, item_id: str, text: str) -> list[dict[str, Any]]:
        """A text delta, after opening its message (and releasing the one held) when it is the first."""
        out = []
        if item_id not in self.open:
            out = self.release() + self.opened(ResponsesAgent.create_text_output_item(text="", id=item_id))
        index = self.open[item_id]
        self.items[index]["content"][0]["text"] += text
        out.append(self.text_delta(item_id, index, text))
        return out

    def finished_item(self, item: dict, **extra: Any) -> list[dict[str, Any]]:
        """The events that finish `item` (opening it first unless its text streamed); a message's
        `output_item.done` is held (`release`) unless `extra` (its `custom_outputs`) is given."""
        index = self.open.pop(item.get("id"), None) if item.get("type") == "message" else None
        out: list[dict[str, Any]] = []
        if index is None:
            out += self.opened(item)
            index = len(self.items) - 1
            self.open.pop(item.get("id"), None)
            if item.get("type") == "message" and message_text(item):
                out.append(self.text_delta(item["id"], index, message_text(item)))
        self.items[index] = item
        if item.get("type") == "message":
            out += self.text_done(item, index)
            if not extra:
                self.held = index
                return out
        out.append(self.event("response.output_item.done", item=item, output_index=index, **extra))
        return out

    def release(self) -> list[dict[str, Any]]:
        """The held `output_item.done`, once another item follows its message."""
        if self.held is None:
            return []
        index, self.held = self.held, None
        return [self.event("response.output_item.done", item=self.items[index], output_index=index)]

    def finished(self, custom: dict[str, Any], tail: list[dict], *, interrupted: bool = False) -> list[dict[str, Any]]:
        """The end of a committed turn: messages still streaming closed (an interrupted turn keeps their
        text), the held message and `tail` (the graph's questions) done, the last of them with
        `custom_outputs`, then `response.completed`."""
        out: list[dict[str, Any]] = []
        for index in list(self.open.values()):
            item = {**self.items[index], "status": "incomplete" if interrupted else "completed"}
            out += self.release() + self.finished_item(item)
        last = [self.held] if self.held is not None else []
        self.held = None
        for item in tail:
            out += self.opened(item)
            last.append(len(self.items) - 1)
        for position, index in enumerate(last):
            extra = {"custom_outputs": _on_item(custom)} if position == len(last) - 1 else {}
            out.append(self.event("response.output_item.done", item=self.items[index], output_index=index, **extra))
        status = "incomplete" if custom.get("status") == "interrupted" else "completed"
        # The announced id, except for a turn stopped at the graph's `interrupt()` (`Turn.name_head`).
        self.response_id = self.fixed_id or custom.get("response_id") or self.response_id
        # In the response too (without `state`), as `retrieve` and an unstreamed response have them: the `openai`
        # client's stream helper (`get_final_response`) reads the event's response only.
        response = {**self.response(status), "custom_outputs": _on_item(custom)}
        out.append(self.event("response.completed", response=response, custom_outputs=custom))
        return out

    def replay(self, stored: StoredResponse) -> list[dict[str, Any]]:
        """A stored response as the events of a stream, its last item's `output_item.done` with `custom_outputs`."""
        custom = stored.custom_outputs
        out = self.started(custom.get("response_id") or new_response_id())
        for position, item in enumerate(stored.output):
            last = position == len(stored.output) - 1
            out += self.release() + self.finished_item(item, **({"custom_outputs": _on_item(custom)} if last else {}))
        return out + self.finished(custom, [])

    # -- building blocks ---------------------------------------------------------------------------
    @staticmethod
    def event(type: str, **fields: Any) -> dict[str, Any]:
        return {"type": type, **fields}

    def opened(self, item: dict) -> list[dict[str, Any]]:
        """`output_item.added` for a new item (in progress: a message without its text yet), and a
        message's `content_part.added`."""
        index = len(self.items)
        self.items.append(item)
        if item.get("type") != "message":
            added = {**item, "status": "in_progress"} if item.get("type") in STATUS_TYPES else item
            return [self.event("response.output_item.added", item=added, output_index=index)]
        self.open[item["id"]] = index
        self.items[index] = {**item, "status": "in_progress", "content": [empty_text_part()]}
        return [
            self.event("response.output_item.added", item={**item, "status": "in_progress", "content": []}, output_index=index),
            self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                       part=empty_text_part()),
        ]  # fmt: skip

    def text_delta(self, item_id: str, index: int, text: str) -> dict[str, Any]:
        return self.event(**ResponsesAgent.create_text_delta(delta=text, item_id=item_id), output_index=index,
                          content_index=0, logprobs=[])  # fmt: skip

    def text_done(self, item: dict, index: int) -> list[dict[str, Any]]:
        part = (item.get("content") or [empty_text_part()])[0]
        return [
            self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=message_text(item), logprobs=[]),
            self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
        ]  # fmt: skip

    def response(self, status: str) -> dict[str, Any]:
        output = list(self.items) if status != "in_progress" else []
        return response_object(output, self.response_id, status, parsed=self.parsed, model=self.model)


def response_object(
    output: list[dict], response_id: str | None, status: str, *, parsed: ParsedRequest | None, model: str
) -> dict[str, Any]:
    """A Responses API `response` (module docstring): `id` (a fresh one that names nothing when
    `response_id` is None), `status`, `model`, `created_at` (`created_at`), `output`, the request
    settings, and the `instructions` and `previous_response_id` the request had."""
    response_id = response_id or new_response_id()
    fields: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at(response_id),
        "status": status,
        "model": model,
        "output": output,
        **RESPONSE_SETTINGS,
    }
    envelope = parsed.envelope if parsed is not None else None
    if envelope is not None and envelope.instructions is not None:
        fields["instructions"] = envelope.instructions
    if envelope is not None and envelope.thread_of_checkpoint:
        fields["previous_response_id"] = f"resp_{envelope.checkpoint_id}"
    return fields


def response(
    output: list[dict], custom_outputs: dict[str, Any], parsed: ParsedRequest | None, *, model: str
) -> ResponsesAgentResponse:
    """The whole response of a turn (`custom_outputs.response_id` its id) or of an action (a fresh id)."""
    status = "incomplete" if custom_outputs.get("status") == "interrupted" else "completed"
    fields = response_object(output, custom_outputs.get("response_id"), status, parsed=parsed, model=model)
    return ResponsesAgentResponse(custom_outputs=custom_outputs, **fields)


def created_at(response_id: str) -> float:
    """When the response was created, in Unix seconds: the time in its id when that is a uuid6 (a turn's
    checkpoint id, made when the turn took its thread: `Turn.head_id`), so that a response, its stream and
    its idempotent retries all say the same; now for any other id (an action's)."""
    from langgraph.checkpoint.base.id import UUID

    try:
        uuid = UUID(response_id.removeprefix("resp_"))
    except ValueError:
        return time.time()
    # uuid6 counts 100 ns intervals from the start of the Gregorian calendar (RFC 9562, section 5.6).
    return (uuid.time - GREGORIAN_TO_UNIX) / 1e7 if uuid.version == 6 else time.time()


def action_events(custom_outputs: dict[str, Any], *, model: str, lifecycle: bool = True) -> list[ResponsesAgentStreamEvent]:
    """An action's stream: `response.created`, `response.in_progress` and `response.completed` (with an
    empty `output`, the results in `custom_outputs`), at once; only the last without `lifecycle`."""
    stream = StreamEvents(None, model=model, lifecycle=lifecycle)
    started = stream.started(custom_outputs.get("response_id") or new_response_id())
    return stream.numbered(started + stream.finished(custom_outputs, []))


def new_response_id() -> str:
    """A response id that names nothing (an action's; OpenAI gives unstored responses one too)."""
    return f"resp_{uuid.uuid4().hex}"


def message_text(item: dict) -> str:
    return "".join(part.get("text", "") for part in item.get("content") or [])


def empty_text_part() -> dict[str, Any]:
    return {"type": "output_text", "text": "", "annotations": []}


def _on_item(custom: dict[str, Any]) -> dict[str, Any]:
    """A turn's `custom_outputs` as its last `output_item.done` carries them: without `state`, which
    `response.completed` carries (once per stream)."""
    return {key: value for key, value in custom.items() if key != "state"}


def custom_outputs(result: TurnResult | None) -> dict[str, Any]:
    if result is None:  # pragma: no cover - a turn always ends with a TurnResult
        raise AgentError("The turn ended without a result.")
    return result.as_dict()
