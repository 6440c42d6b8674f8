"""`tt-agent memories`: a user's long-term memories, with the thread and checkpoint that saved each one."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli import DatabaseUrl, agent_errors, app, console, open_agent
from agent.views import memories_table


@app.command()
def memories(
    user_id: Annotated[str, typer.Option("--user-id", help="Whose memories (only that user's are ever listed).")],
    query: Annotated[
        str | None, typer.Option("--query", help="Most relevant first for these words; unset: newest first.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most memories to show.")] = 20,
    database_url: DatabaseUrl = None,
) -> None:
    """List a user's long-term memories (every memory_scope), newest first or by --query."""
    with agent_errors(), open_agent(database_url, "offline", False, read_only=True) as agent:
        found = agent.list_memories(user_id, query=query, limit=limit)
        title = f"Memories of {user_id}" + (f" for {query!r}" if query else "")
        console.print(memories_table(found, title=title))
