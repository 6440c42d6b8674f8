"""What a branching client does with a write's `state` (`include: ["state"]`, `agent.operations.render`)."""

from __future__ import annotations

import copy


def rendered(shown: list[dict], state: dict, *, wrote: bool = True) -> list[dict]:
    """The items a client shows after a write whose answer carried `state`, from the items it showed.

    It keeps its first `message_offset` items and appends `state["messages"]`. After a write (not after
    `set_head`), the option each kept item shows (`alternatives.options[index]`, `siblings` at `index`)
    has the new checkpoint, the newest of the thread, as its latest checkpoint.
    """
    kept = copy.deepcopy(shown[: state["message_offset"]])
    if wrote:
        for item in kept:
            alternatives, siblings = item["alternatives"], item["siblings"]
            alternatives["options"][alternatives["index"]]["latest_checkpoint_id"] = state["checkpoint_id"]
            siblings["latest_checkpoint_ids"][siblings["index"]] = state["checkpoint_id"]
    return kept + state["messages"]
