"""Drawing threads for people: history tables and branch trees (rich renderables), for the CLI and notebooks.

Everything here takes history entries (the dicts of `get_checkpoint_history`)
and returns something `rich` can print; nothing reads the database.

Checkpoint ids are time-ordered UUIDs, so ids written close together share
their first characters; their last 8 characters are random. Tables therefore
show that suffix as the short id (`short_id`), and the CLI accepts it wherever
a checkpoint id is expected (`agent.operations.history.resolve_checkpoint_ref`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

#: Characters of a checkpoint id shown as its short form (the random end of the UUID).
SHORT_ID_CHARS = 8

def history_table(
    entries: list[dict[str, Any]],
    *,
    title: str,
    full_ids: bool = False,
    head_known: bool = True,
    notes: dict[str, str] | None = None,
) -> RenderableType:
    """A table of history entries (newest first); the first row is the thread head when `head_known`.

    With `full_ids`, the whole ids follow the table as `short = full` lines, which
    stay intact at any terminal width (a 36-character column would squeeze the rest).
    """
    notes = notes or {}
    table = Table(
        title=title,
        caption=None
        if full_ids
        else f"ids: last {SHORT_ID_CHARS} characters of checkpoint_id (whole ids: --full-ids, or /history full in chat)",
        caption_justify="left",
        header_style="bold",
    )
    table.add_column("checkpoint", no_wrap=True, style="cyan")
    table.add_column("parent", no_wrap=True, style="dim")
    table.add_column("time (UTC)", overflow="fold")
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("next", no_wrap=True)
    table.add_column("last message")
    for index, entry in enumerate(entries):
        marks = [notes[entry["checkpoint_id"]]] if entry["checkpoint_id"] in notes else []
        if entry.get("is_head"):
            marks.insert(0, "head")
        last = Text(last_message(entry))
        if marks:
            last = Text.assemble((f"[{', '.join(marks)}] ", "bold yellow"), last)
        table.add_row(
            short_id(entry["checkpoint_id"]),
            short_id(entry["parent_checkpoint_id"]),
            time_text(entry["timestamp"]),
            str(entry["message_count"]),
            nodes_text(entry["next_nodes"]),
            last,
        )
    if not entries:
        table.add_row("—", "", "", "", "", Text("no checkpoints" if head_known else "no older checkpoints", style="dim"))
    if not full_ids:
        return table
    lines = [Text.assemble((short_id(e["checkpoint_id"]), "cyan"), " = ", e["checkpoint_id"]) for e in entries]
    return Group(table, Text("Whole checkpoint ids:", style="bold"), *lines)


def branch_tree(entries: list[dict[str, Any]], *, notes: dict[str, str] | None = None) -> Tree:
    """The checkpoints as a tree built from `parent_checkpoint_id`.

    A run of turns without forks is one list; a checkpoint with several children
    gets one "branch" subtree per child, oldest first. The newest checkpoint is the head.
    """
    notes = notes or {}
    thread_id = entries[0]["thread_id"] if entries else "?"
    root = Tree(Text(f"thread {thread_id}", style="bold"))
    if not entries:
        return root
    by_id = {e["checkpoint_id"]: e for e in entries}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for entry in sorted(entries, key=lambda e: e["checkpoint_id"]):  # ids are time-ordered
        parent = entry["parent_checkpoint_id"] if entry["parent_checkpoint_id"] in by_id else None
        children.setdefault(parent, []).append(entry)
    head = next((e["checkpoint_id"] for e in entries if e.get("is_head")), None)

    def label(entry: dict[str, Any]) -> Text:
        marks = (["head"] if entry["checkpoint_id"] == head else []) + (
            [notes[entry["checkpoint_id"]]] if entry["checkpoint_id"] in notes else []
        )
        text = Text.assemble(
            (short_id(entry["checkpoint_id"]), "cyan"), f"  {entry['message_count']} msgs  ", last_message(entry)
        )
        if marks:
            text.append(f"  ← {', '.join(marks)}", style="bold yellow")
        return text

    def chain(into: Tree, entry: dict[str, Any]) -> None:
        while True:
            node = into.add(label(entry))
            kids = children.get(entry["checkpoint_id"], [])
            if len(kids) == 1:
                entry = kids[0]
                continue
            for number, kid in enumerate(kids, start=1):
                chain(node.add(Text(f"branch {number}", style="magenta")), kid)
            return

    for start in children.get(None, []):
        chain(root, start)
    return root


def short_id(checkpoint_id: str | None) -> str:
    return checkpoint_id[-SHORT_ID_CHARS:] if checkpoint_id else "—"


def last_message(entry: dict[str, Any]) -> str:
    from agent.storage.summaries import LAST_MESSAGE_CHARS

    text = entry["last_message"] or ""
    # The history keeps the first LAST_MESSAGE_CHARS characters; show that the text was cut.
    return text + "…" if len(text) >= LAST_MESSAGE_CHARS else text


def nodes_text(nodes: list[str]) -> str:
    return ", ".join(nodes) if nodes else "—"


def time_text(timestamp: str | None) -> str:
    if not timestamp:
        return "—"
    try:
        return datetime.fromisoformat(timestamp).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except ValueError:
        return timestamp


def memories_table(memories: list[dict[str, Any]], *, title: str) -> RenderableType:
    """A table of long-term memories (the dicts of `list_memories`), in the order given, with their provenance:
    the thread and the short id of the checkpoint whose turn saved each one."""
    table = Table(title=title, show_lines=False)
    for column in ("memory_id", "content", "thread", "checkpoint", "created (UTC)"):
        table.add_column(column, overflow="fold")
    for memory in memories:
        table.add_row(
            memory["memory_id"],
            memory["content"],
            memory["thread_id"],
            short_id(memory["checkpoint_id"]),
            (memory["created_at"] or "")[:19].replace("T", " "),
        )
    if not memories:
        return Text(f"{title}: no memories.", style="dim")
    return table
