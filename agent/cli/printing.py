"""Sending one user message from the command line, and printing the reply as it streams."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.text import Text

from agent.cli.app import console
from agent.views import short_id

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

#: `send_turn(resume=...)` unset: a message, not an answer (None is an answer: JSON null).
NO_RESUME: Any = object()


def send_turn(
    agent: LangGraphResponsesAgent,
    text: str,
    *,
    echo: bool = False,
    thread_id: str | None = None,
    checkpoint_id: str | None = None,
    user_id: str | None = None,
    edit_message_id: str | None = None,
    regenerate: bool = False,
    regenerate_message_id: str | None = None,
    resume: Any = NO_RESUME,
    cancel_interrupts: bool = False,
) -> dict[str, Any]:
    """Send one user message with `predict_stream` (with `regenerate` or `resume`, none), printing the reply as it
    arrives, and any question the graph stops at (`interrupt()`) as a card.

    `edit_message_id`: the message sends `text` in place of that one (a sibling branch). `regenerate_message_id`
    (implies `regenerate`): the answer to regenerate, else the last one. `resume`: answer the
    thread's pending interrupt with this JSON value (`custom_inputs.resume`). `cancel_interrupts`: send the
    message although an interrupt waits (it stays unanswered).

    Returns `custom_outputs` (thread_id, checkpoint_id, parent_checkpoint_id, and `interrupts` when the turn
    stopped at one) plus `text`, the reply.

    Raises:
        AgentError: the agent refused the turn (for example `InterruptPending`); nothing was written.
    """
    if echo:
        console.print(Text.assemble(("  you › ", "bold cyan"), text))
    custom: dict[str, Any] = {
        "thread_id": thread_id, "checkpoint_id": checkpoint_id, "user_id": user_id, "edit_message_id": edit_message_id,
        "regenerate_message_id": regenerate_message_id,
    }  # fmt: skip
    custom = {k: v for k, v in custom.items() if v is not None}
    regenerate = regenerate or regenerate_message_id is not None
    if regenerate:
        custom["regenerate"] = True
    if cancel_interrupts:
        custom["cancel_interrupts"] = True
    if resume is not NO_RESUME:
        custom["resume"] = resume
    request = {
        "input": [] if regenerate or resume is not NO_RESUME else [{"role": "user", "content": text}],
        "custom_inputs": custom,
    }
    out = _ReplyPrinter()
    outputs: dict[str, Any] = {}
    for event in agent.predict_stream(request):
        data = event.model_dump(exclude_none=True)
        if data["type"] == "response.output_text.delta":
            out.text(data["item_id"], data["delta"])
        elif data["type"] == "response.output_item.done":
            out.item(data["item"])
        outputs = data.get("custom_outputs") or outputs
    out.end()
    parent = outputs.get("parent_checkpoint_id")
    if thread_id is None:
        console.print(Text(f"  new thread_id {outputs.get('thread_id')}", style="dim"))
    where = f"parent {short_id(parent)}" if thread_id else f"the thread's first, after its root {short_id(parent)}"
    console.print(Text(f"  saved as checkpoint {outputs.get('checkpoint_id')} ({where})", style="dim"))
    return {**outputs, "text": out.reply}


class _ReplyPrinter:
    """Prints streamed text as it arrives, then the items that were not streamed (tool calls, unstreamed replies)."""

    def __init__(self) -> None:
        self.streamed: set[str] = set()
        self.open = False  # a reply line is being written
        self.reply = ""  # the assistant text of this turn

    def text(self, item_id: str, delta: str) -> None:
        if item_id not in self.streamed:
            self.streamed.add(item_id)
            self.start()
        self.reply += delta
        console.print(delta, end="", markup=False, soft_wrap=True)

    def item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "message" and item.get("id") not in self.streamed:
            text = "".join(part.get("text", "") for part in item.get("content", []))
            self.start()
            self.reply += text
            console.print(text, end="", markup=False, soft_wrap=True)
        elif kind == "function_call":
            self.line(f"  ↳ tool call {item.get('name')}({item.get('arguments')})")
        elif kind == "function_call_output":
            self.line(f"  ↳ tool result {item.get('output')}")
        elif kind == "mcp_approval_request":
            self.question(item)

    def question(self, item: dict[str, Any]) -> None:
        """The card of a graph's `interrupt()` (an `mcp_approval_request` item): its question, how to answer."""
        self.end()
        try:
            value = json.loads(item.get("arguments") or "null")
        except ValueError:
            value = item.get("arguments")
        question = value.get("question") if isinstance(value, dict) else None
        shown = question if isinstance(question, str) else json.dumps(value, ensure_ascii=False)
        console.print(
            Text.assemble(
                ("  ? ", "bold yellow"),
                (shown, "bold"),
                (f"  (waiting at {item.get('name')}, interrupt {item.get('id')})", "dim"),
            )
        )
        console.print(
            Text("    answer with /resume <value> (e.g. /resume yes); /cancel leaves it unanswered", style="dim")
        )

    def start(self) -> None:
        if self.open:
            console.print()
        console.print(Text("  agent › ", style="bold green"), end="")
        self.open = True

    def line(self, text: str) -> None:
        self.end()
        console.print(Text(text, style="dim"))

    def end(self) -> None:
        if self.open:
            console.print()
            self.open = False


class TurnPrinter(_ReplyPrinter):
    """Prints a turn's events (`agent.types`: text deltas, new messages) as they happen: for an operation that is a
    turn (`merge_branch`), whose events come from its own body rather than from `predict_stream`. Call it with
    each event, then `end()`."""

    def __call__(self, event: Any) -> None:
        from agent.messages import to_output_items
        from agent.types import NewMessages, TextDelta

        if isinstance(event, TextDelta):
            self.text(event.item_id, event.text)
        elif isinstance(event, NewMessages):
            for item in to_output_items(event.messages):
                self.item(item)
