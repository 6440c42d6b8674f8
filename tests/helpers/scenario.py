"""Shared scenario builders: one user turn, the text of a reply, the trip scenario."""

from __future__ import annotations

from typing import Any

TRIP = ("I'm planning for an upcoming trip!", "I'm headed to SF!", "Where did I say I'm going?")


def request(text: str | None = None, **custom_inputs: Any) -> dict:
    """A Responses request with one user message (or none) and the given custom_inputs (None values dropped)."""
    custom = {k: v for k, v in custom_inputs.items() if v is not None}
    items = [] if text is None else [{"role": "user", "content": text}]
    body: dict[str, Any] = {"input": items}
    if custom:
        body["custom_inputs"] = custom
    return body


def say(agent, text: str, **custom_inputs: Any):
    """Send one user message with `agent.predict`; returns the ResponsesAgentResponse."""
    return agent.predict(request(text, **custom_inputs))


def text_of(response) -> str:
    """The concatenated assistant text of a response (pydantic or dict)."""
    items = response.output if hasattr(response, "output") else response["output"]
    parts = []
    for item in items:
        item = item.model_dump() if hasattr(item, "model_dump") else item
        if item.get("type") == "message":
            parts.extend(c["text"] for c in item["content"] if "text" in c)
    return " ".join(parts)


def outputs(response) -> dict:
    """custom_outputs of a response (pydantic or dict)."""
    return response.custom_outputs if hasattr(response, "custom_outputs") else response["custom_outputs"]


def run_trip(agent, **custom_inputs: Any) -> dict:
    """Turns 1-3 of the trip scenario; returns the ids: thread_id, root (the empty checkpoint turn 1
    started from), after_turn1, after_turn2, after_turn3, and answer (the third reply's text)."""
    first = say(agent, TRIP[0], **custom_inputs)
    thread_id = outputs(first)["thread_id"]
    second = say(agent, TRIP[1], thread_id=thread_id, **custom_inputs)
    third = say(agent, TRIP[2], thread_id=thread_id, **custom_inputs)
    return {
        "thread_id": thread_id,
        "root": outputs(first)["parent_checkpoint_id"],
        "after_turn1": outputs(first)["checkpoint_id"],
        "after_turn2": outputs(second)["checkpoint_id"],
        "after_turn3": outputs(third)["checkpoint_id"],
        "answer": text_of(third),
    }
