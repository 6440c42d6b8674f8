"""A turn's results as Responses API objects: the response, and the events of a stream (MLflow's types).

* Streaming yields `response.output_text.delta` events as the model produces
  tokens and `response.output_item.done` per finished item. The last
  `output_item.done` is held back until the turn is committed, so that it can
  carry `custom_outputs` with the new `checkpoint_id` (the Databricks reference
  drops `custom_outputs` on streams). A turn's stream then ends with
  `response.completed`: the whole response (every item again, as OpenAI's) with
  its `id`, known only after the commit.
* A turn's response `id` is `resp_<checkpoint_id>` (also `custom_outputs.response_id`),
  so the `openai` client's `previous_response_id` names a checkpoint.
* A retry with an idempotency key whose first request committed gets that
  request's response again (`StoredResponse`); streamed, it is replayed as
  events: a text delta and an `output_item.done` per item, the last carrying
  `custom_outputs`.
"""

from __future__ import annotations

from typing import Any

from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentResponse, ResponsesAgentStreamEvent

from agent.errors import AgentError
from agent.messages import to_output_items
from agent.requests import ParsedRequest
from agent.types import NewMessages, StoredResponse, TextDelta, TurnResult


class StreamEvents:
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
            return replay_events(event, self.parsed)
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
            custom = custom_outputs(event)
            # The held reply, then the questions the graph stopped at; the last of them carries custom_outputs.
            last = ([self.held] if self.held is not None else []) + [interrupt.as_item() for interrupt in event.interrupts]
            self.items.extend(last[1:] if self.held is not None else last)
            for index, item in enumerate(last):
                extra = {"custom_outputs": custom} if index == len(last) - 1 else {}
                out.append(ResponsesAgentStreamEvent(type="response.output_item.done", item=item, **extra))
            out.append(completed_event(custom, self.items, self.parsed))
        return out


def replay_events(stored: StoredResponse, parsed: ParsedRequest) -> list[ResponsesAgentStreamEvent]:
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
    out.append(completed_event(stored.custom_outputs, stored.output, parsed))
    return out


def response_fields(custom_outputs: dict[str, Any], parsed: ParsedRequest | None) -> dict[str, Any]:
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


def response(output: list[dict], custom_outputs: dict[str, Any], parsed: ParsedRequest) -> ResponsesAgentResponse:
    return ResponsesAgentResponse(output=output, custom_outputs=custom_outputs, **response_fields(custom_outputs, parsed))


def completed_event(
    custom_outputs: dict[str, Any], output: list[dict] | None = None, parsed: ParsedRequest | None = None
) -> ResponsesAgentStreamEvent:
    # MLflow validates a `response.completed` event against the Responses schema, which requires a
    # `response` with its `output`. A turn's carries every item again (as OpenAI's does) and the `id`;
    # an action's has none (its results are in `custom_outputs`).
    response = {"output": list(output or []), **response_fields(custom_outputs, parsed)}
    if parsed is None:
        response = {"output": [], "status": "completed"}
    return ResponsesAgentStreamEvent(type="response.completed", response=response, custom_outputs=custom_outputs)


def custom_outputs(result: TurnResult | None) -> dict[str, Any]:
    if result is None:  # pragma: no cover - a turn always ends with a TurnResult
        raise AgentError("The turn ended without a result.")
    return result.as_dict()
