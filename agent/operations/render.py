"""What a client re-renders after a write, carried by the write's own answer: `include: ["state"]`.

A branching chat client used to make two requests per action: the turn (or
`update_checkpoint_state`, `set_head`, `fork_thread`), then a whole
`get_checkpoint_state` to redraw, every message with its place and alternatives
(88 kB for a 50-turn thread). With `custom_inputs.include = ["state"]` (Python:
`include=["state"]`) the write's answer carries `state`: the new checkpoint as
`get_checkpoint_state` gives it, but only the messages from the first one that
differs from where the write started, with `message_offset` (how many leading
items of the whole list are unchanged: keep them, replace the rest) and `head_checkpoint_id`.
A streamed turn carries it in `custom_outputs` on its last event
(`response.completed`), a non-streamed one and an action in `custom_outputs`.

Where a write started, and so what `state` leaves out:

* a turn and `update_checkpoint_state`: their start, `parent_checkpoint_id` (the
  previous head; the checkpoint before the message for an edit or a
  regeneration, so the edited message and everything after it are sent);
* `set_head`: the previous head (the messages from where the two branches part);
* `fork_thread`: nothing (a new thread: every message, placed in its own tree).

Why opt-in rather than always: an ordinary turn's `state` is its two new
messages with their places and alternatives, the text the output items already
hold again: on a 50-turn thread the turn's answer is 1.5 kB, 4.8 kB with it.
Clients that do not redraw a tree (the `openai` client, a script, the CLI)
would pay three times the bytes on every turn. A branching client asks, and
saves the second request: 130 kB per turn before (the answer, then a whole
`get_checkpoint_state`). `docs/guides/branching.md` has the figures for an edit,
a regeneration and a switch; `python -m bench.branches` measures them.

What `state` does not resend: the alternatives of the messages before
`message_offset`. They are unchanged, but for one thing: a write adds the newest
checkpoint of the thread, so the option a client shows for each earlier message
(`options[index]`) now has it as its `latest_checkpoint_id`. `set_head` writes
nothing and changes none of them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from agent.operations.branches import get_checkpoint_state
from agent.operations.checks import STATE, include
from agent.turn_events import StoredResponse, TurnResult

if TYPE_CHECKING:
    from agent.storage import ThreadStorage
    from agent.types import CheckpointState

__all__ = ["STATE", "include", "render_state", "with_state"]

def render_state(
    storage: ThreadStorage, thread_id: str, checkpoint_id: str, since_checkpoint_id: str | None, *, user_id: str | None
) -> CheckpointState:
    """`checkpoint_id` as `get_checkpoint_state` gives it, from its first message that differs from
    `since_checkpoint_id`'s on (None: every message)."""
    return get_checkpoint_state(storage, thread_id, checkpoint_id, user_id=user_id, since_checkpoint_id=since_checkpoint_id)


def with_state(storage: ThreadStorage, event: TurnResult | StoredResponse, *, user_id: str | None) -> TurnResult | StoredResponse:
    """A turn's result (or the stored result a retry returns) with `state` (`include: ["state"]`).

    A `store: false` turn wrote nothing and gets none.
    """
    if isinstance(event, TurnResult):
        if event.thread_id is None or event.checkpoint_id is None:
            return event
        state = render_state(storage, event.thread_id, event.checkpoint_id, event.parent_checkpoint_id, user_id=user_id)
        return dataclasses.replace(event, state=state.as_dict())
    outputs = event.custom_outputs
    if not outputs.get("thread_id") or not outputs.get("checkpoint_id"):
        return event
    state = render_state(
        storage, outputs["thread_id"], outputs["checkpoint_id"], outputs.get("parent_checkpoint_id"), user_id=user_id
    )
    return dataclasses.replace(event, custom_outputs={**outputs, STATE: state.as_dict()})
