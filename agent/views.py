"""Drawing threads for people: history tables, branch trees, a checkpoint's messages, branch lists and
comparisons, thread lists (rich renderables), for the CLI and notebooks.

Everything here takes what the agent's methods return (the dicts of
`get_checkpoint_history`, `get_checkpoint_state`, `list_branches`,
`compare_checkpoints`) and returns something `rich` can print; nothing reads
the database.

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

#: Characters of a message's text a table or tree shows; a longer text is cut there and ends with "…".
#: Fewer than the history keeps of each text (100 characters), so a text the history cut is always
#: marked as cut, without this module knowing how much the history keeps.
SHOWN_TEXT_CHARS = 80

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
    """The checkpoints as a tree built from `parent_checkpoint_id`, each labelled with the user message
    that led to it (`last_user_message`; the thread's empty root says so).

    A run of turns without forks is one list; a checkpoint with several children
    gets one "branch" subtree per child, oldest first. The entry with `is_head` is marked head.
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
            (short_id(entry["checkpoint_id"]), "cyan"), f"  {entry['message_count']} msgs  ", led_to(entry)
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


def led_to(entry: dict[str, Any]) -> Text:
    """What led to a checkpoint: the user message of its turn, a merge (`merge_branch`: its mode and source
    checkpoint), or that it is the thread's empty root."""
    if entry.get("source") == "root":
        return Text("(root: empty, before the first message)", style="dim")
    merged = entry.get("merged_from")
    if isinstance(merged, dict) and merged.get("checkpoint_id"):
        return Text(f"merge ({merged.get('mode')}) of {short_id(merged['checkpoint_id'])}")
    said = clipped(entry.get("last_user_message") or "")
    prefix = "update: " if entry.get("source") == "update" else ""
    return Text(f'{prefix}you: "{said}"' if said else f"{prefix}(no user message)")


def state_view(state: dict[str, Any], *, title: str | None = None) -> RenderableType:
    """A checkpoint's messages (`get_checkpoint_state`), numbered from 1 (from `message_offset` + 1 for the
    messages after one, `after_message_id`), with "‹i/n›" where a message has alternatives (a user message's
    edits, an answer's regenerations: its `alternatives`, else its `siblings`). The numbers are what
    `/edit <n>` and `/regen <n>` in `tt-agent chat` take."""
    table = Table(
        title=title or f"Checkpoint {short_id(state['checkpoint_id'])} ({state['message_count']} messages)",
        header_style="bold",
        caption="‹i/n›: this message is version i of n (a user message's edits, an answer's regenerations)",
        caption_justify="left",
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("who", no_wrap=True)
    table.add_column("message")
    table.add_column("alternatives", no_wrap=True)
    for number, item in enumerate(state["messages"], start=state.get("message_offset", 0) + 1):
        who, text = item_text(item)
        versions = item.get("alternatives") or item.get("siblings") or {"count": 1}
        choice = f"‹{versions['index'] + 1}/{versions['count']}›" if versions["count"] > 1 else ""
        table.add_row(str(number), who, Text(text), choice)
    if not state["messages"]:
        empty = "no messages after it" if state.get("message_offset") else "no messages (the thread's root)"
        table.add_row("—", "", Text(empty, style="dim"), "")
    return table


def item_text(item: dict[str, Any]) -> tuple[str, str]:
    """(who, text) of one Responses item."""
    kind = item.get("type", "message")
    if kind == "function_call":
        return "tool call", f"{item.get('name')}({item.get('arguments')})"
    if kind == "function_call_output":
        return "tool result", str(item.get("output"))
    who = {"user": "you", "assistant": "agent"}.get(item.get("role"), item.get("role") or "?")
    content = item.get("content")
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content or [])
    return who, text


#: How a branches table says to move the head: in `tt-agent chat`, and from the shell (the thread's id filled in).
CHAT_SWITCH = "/switch <id>"
SHELL_SWITCH = "tt-agent switch {thread_id} <id>"


def branches_table(
    branches: list[dict[str, Any]], *, title: str = "Branches", switch: str = CHAT_SWITCH
) -> RenderableType:
    """`list_branches` entries (the pinned one first, then newest first): each branch's last checkpoint, where it
    forks, its size and last user message, marked with its label, `[pinned]` and `[archived]`. `switch`: the
    command the caption names for moving the head to a branch (`CHAT_SWITCH`, or `SHELL_SWITCH` filled in)."""
    table = Table(title=title, header_style="bold", caption=f"branch: its last checkpoint; {switch} moves the head there",
                  caption_justify="left")  # fmt: skip
    table.add_column("branch", no_wrap=True, style="cyan")
    table.add_column("forks at", no_wrap=True, style="dim")
    table.add_column("time (UTC)", overflow="fold")
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("last user message")
    for branch in branches:
        said = Text(branch.get("last_user_message") or "")
        if branch.get("label"):
            said = Text.assemble((f"«{branch['label']}» ", "bold green"), said)
        if branch.get("archived"):
            said = Text.assemble(("[archived] ", "dim"), said)
        if branch.get("pinned"):
            said = Text.assemble(("[pinned] ", "bold magenta"), said)
        if branch.get("is_head"):
            said = Text.assemble(("[head] ", "bold yellow"), said)
        table.add_row(
            short_id(branch["checkpoint_id"]),
            short_id(branch.get("fork_checkpoint_id")),
            time_text(branch.get("updated_at")),
            str(branch["message_count"]),
            said,
        )
    return table


def search_table(hits: list[dict[str, Any]], *, title: str) -> RenderableType:
    """`search_threads` hits (best first): the thread, the checkpoint where the message first appeared (its
    short id: open that branch with it) and the snippet."""
    if not hits:
        return Text(f"{title}: no hits.", style="dim")
    table = Table(title=title, header_style="bold", caption="checkpoint: where the message first appeared",
                  caption_justify="left")  # fmt: skip
    table.add_column("thread", overflow="fold", style="cyan")
    table.add_column("checkpoint", no_wrap=True, style="cyan")
    table.add_column("snippet")
    for hit in hits:
        table.add_row(hit["thread_id"], short_id(hit["checkpoint_id"]), Text(hit["snippet"]))
    return table


def diff_view(diff: dict[str, Any]) -> RenderableType:
    """A `compare_checkpoints` result: the common ancestor, then the messages only each side has."""
    parts: list[RenderableType] = [
        Text.assemble(
            "common ancestor: ",
            (short_id(diff["common_ancestor_checkpoint_id"]), "cyan"),
            f"   A = {short_id(diff['checkpoint_a'])}, B = {short_id(diff['checkpoint_b'])}",
        )
    ]
    for side, key in (("A", "only_a"), ("B", "only_b")):
        parts.append(Text(f"only in {side} ({short_id(diff['checkpoint_' + key[-1]])}):", style="bold"))
        if not diff[key]:
            parts.append(Text("  (nothing)", style="dim"))
        for item in diff[key]:
            who, text = item_text(item)
            parts.append(Text.assemble(f"  {who}: ", text))
    return Group(*parts)


def short_id(checkpoint_id: str | None) -> str:
    return checkpoint_id[-SHORT_ID_CHARS:] if checkpoint_id else "—"


def last_message(entry: dict[str, Any]) -> str:
    return clipped(entry["last_message"] or "")


def clipped(text: str) -> str:
    """`text`, or its first `SHOWN_TEXT_CHARS` characters and "…" when it is longer."""
    return text[:SHOWN_TEXT_CHARS] + "…" if len(text) > SHOWN_TEXT_CHARS else text


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


def threads_table(threads: list[dict[str, Any]], *, title: str, next_before: str | None = None) -> RenderableType:
    """A table of `list_threads` entries (newest activity first): id, title, messages, last activity, metadata;
    the caption says how to get the next page when there is one."""
    if not threads:
        return Text(f"{title}: no threads.", style="dim")
    table = Table(
        title=title,
        header_style="bold",
        caption=f"next page: --before {next_before}" if next_before else None,
        caption_justify="left",
    )
    table.add_column("thread", no_wrap=True, style="cyan")
    table.add_column("title")
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("last activity (UTC)", overflow="fold")
    table.add_column("metadata", overflow="fold")
    for thread in threads:
        table.add_row(
            thread["thread_id"],
            thread["title"] or "—",
            str(thread["message_count"]),
            time_text(thread["updated_at"]),
            ", ".join(f"{k}={v}" for k, v in thread["metadata"].items()) or "—",
        )
    return table


def thread_view(thread: dict[str, Any]) -> RenderableType:
    """One thread (`get_thread`) as labelled lines."""
    forked = thread.get("forked_from")
    rows = [
        ("thread", thread["thread_id"]),
        ("title", thread["title"] or "—"),
        ("user", thread["user_id"] or "—"),
        ("head", thread["checkpoint_id"]),
        ("messages", str(thread["message_count"])),
        ("created (UTC)", time_text(thread["created_at"])),
        ("last activity (UTC)", time_text(thread["updated_at"])),
        ("metadata", ", ".join(f"{k}={v}" for k, v in thread["metadata"].items()) or "—"),
        ("forked from", f"{forked['thread_id']} at {short_id(forked['checkpoint_id'])}" if forked else "—"),
        ("ttl_seconds", "—" if thread["ttl_seconds"] is None else f"{thread['ttl_seconds']:g}"),
    ]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, value)
    return table
