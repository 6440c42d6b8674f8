"""A message's versions for a "< i/n >" switcher: a user message's edits, an answer's regenerations.

The tree (`agent.operations.tree`) places every message of a checkpoint at the
checkpoint where it first appeared, and names that checkpoint's siblings (the
children of the checkpoint before it). An ordinary turn writes a user message
and its answer in one checkpoint, so both get the same siblings: after an edit
and a regeneration of the same message, the user message and the answer would
both show "3/3", and two of the user "versions" would be the same message.
ChatGPT and assistant-ui switch them apart, and so does this module:

* **A user message's alternatives are its edits**: the distinct user messages
  the siblings hold at its position, oldest first. A regeneration re-sends the
  user message it answers (the same message, same id), so it is the same
  version as the original; an edit (a new message) or an edit in place (same
  id, new content) is another one. A version's checkpoint is the oldest sibling
  holding it; its latest checkpoint, the newest checkpoint after any of them.
* **An answer's alternatives are its regenerations**: the siblings that hold
  the same user message before it (the one it answers) and an answer to it,
  oldest first, each previewed by its last message. Every message of one
  answer (tool calls, their results, the final text) has the same list.

A version is described by its own checkpoint's messages, whichever branch is
shown, and so is the message's place: an answer kept at its place after an
in-place replacement of the user message before it (`agent.operations.tree`)
still lists the regenerations of the user message it answered. The checkpoints
of the shown branch usually need no read: they hold the shown messages up to
their length (`ThreadTree.intact`). The others (the siblings off the branch,
and a checkpoint whose messages a later state update replaced or removed) are
read in one query (`ThreadStorage.get_checkpoints`), only when there are any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.storage.summaries import LAST_MESSAGE_CHARS, message_text
from agent.types import Alternative, Alternatives, MessagePlace

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.operations.tree import ThreadTree
    from agent.storage import ThreadStorage

EDITS = "edits"
REGENERATIONS = "regenerations"


def with_alternatives(
    storage: ThreadStorage,
    tree: ThreadTree,
    chain: Sequence[str],
    messages: Sequence[BaseMessage],
    places: Sequence[MessagePlace],
    *,
    start: int = 0,
) -> list[MessagePlace]:
    """`places[start:]` (one per message of `messages`, the messages of the chain's last checkpoint, from
    `tree.places`), each with its message's `Alternatives`.

    One query for the messages of the siblings off the shown branch, when any message from `start` on
    has siblings (the messages before `start` are what a client already shows: `get_checkpoint_state`'s
    `after_message_id`).
    """
    intact = tree.intact(chain)
    held: dict[str, Sequence[BaseMessage]] = {
        place.checkpoint_id: messages[: tree.message_count(place.checkpoint_id)]
        for place in places
        if place.checkpoint_id in intact
    }
    wanted = sorted({s for place in places[start:] for s in place.sibling_checkpoint_ids if s not in held})
    for found in storage.get_checkpoints(tree.thread_id, wanted) if wanted else ():
        held[found.config["configurable"]["checkpoint_id"]] = found.checkpoint["channel_values"].get("messages") or ()
    out = []
    for position, place in enumerate(places[start:], start):
        siblings = [s for s in place.sibling_checkpoint_ids if s in held]  # one deleted meanwhile is left out
        # The message as its place holds it, with what came before it there.
        mine = held.get(place.checkpoint_id, messages)
        if messages[position].type == "human":
            alternatives = _edits(tree, position, place, siblings, held)
        else:
            alternatives = _regenerations(tree, mine, position, place, siblings, held)
        out.append(dataclasses.replace(place, alternatives=alternatives))
    return out


def _edits(
    tree: ThreadTree,
    position: int,
    place: MessagePlace,
    siblings: Sequence[str],
    held: dict[str, Sequence[BaseMessage]],
) -> Alternatives:
    versions: list[tuple[BaseMessage, list[str]]] = []  # each distinct user message, with the siblings holding it
    for sibling in siblings:
        theirs = held[sibling]
        if len(theirs) <= position or theirs[position].type != "human":
            continue
        message = theirs[position]
        same = next((members for known, members in versions if known == message), None)
        if same is None:
            versions.append((message, [sibling]))
        else:
            same.append(sibling)
    options = tuple(
        Alternative(members[0], max(tree.newest_leaf(m) for m in members), _preview(message)) for message, members in versions
    )
    index = next((i for i, (_, members) in enumerate(versions) if place.checkpoint_id in members), 0)
    return Alternatives(EDITS, index, options)


def _regenerations(
    tree: ThreadTree,
    messages: Sequence[BaseMessage],
    position: int,
    place: MessagePlace,
    siblings: Sequence[str],
    held: dict[str, Sequence[BaseMessage]],
) -> Alternatives:
    asked = next((i for i in range(position - 1, -1, -1) if messages[i].type == "human"), None)
    start = 0 if asked is None else asked + 1
    options = []
    index = 0
    for sibling in siblings:
        theirs = held[sibling]
        if len(theirs) <= start or theirs[start].type == "human":
            continue  # no answer there
        if asked is not None and theirs[asked] != messages[asked]:
            continue  # an answer to another user message: an edit's
        if sibling == place.checkpoint_id:
            index = len(options)
        options.append(Alternative(sibling, tree.newest_leaf(sibling), _preview(_answer(theirs, start))))
    return Alternatives(REGENERATIONS, index, tuple(options))


def _answer(messages: Sequence[BaseMessage], start: int) -> BaseMessage:
    """The last message of the answer that starts at `start` (up to the next user message)."""
    end = start
    while end + 1 < len(messages) and messages[end + 1].type != "human":
        end += 1
    return messages[end]


def _preview(message: BaseMessage) -> str:
    return message_text(message)[:LAST_MESSAGE_CHARS]
