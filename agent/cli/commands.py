"""`tt-agent history` and `tt-agent serve`."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli import MAX_LISTED, AgentFile, DatabaseUrl, Model, UserId, agent_errors, app, console, open_reads, store_label
from agent.views import branch_tree, history_table


@app.command()
def history(
    thread_id: Annotated[str, typer.Argument(help="The thread to list.")],
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LISTED, metavar="N", help="Most checkpoints to show.")
    ] = 10,
    before: Annotated[
        str | None,
        typer.Option("--before", metavar="CHECKPOINT_ID", help="Only checkpoints older than this one (full or short id)."),
    ] = None,
    user_id: UserId = None,
    full_ids: Annotated[bool, typer.Option("--full-ids", help="Show whole checkpoint ids.")] = False,
    tree: Annotated[bool, typer.Option("--tree", help="Also draw the branches as a tree.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print one thread's checkpoints, newest first. Never creates a store."""
    # Reads only: no chat model, no graph, and on SQLite no LangGraph (agent.storage.open_reader).
    from agent.operations.history import history as read_history
    from agent.operations.history import resolve_checkpoint_ref

    with agent_errors(store=store_label(database_url)), open_reads(database_url) as reads:

        def page(limit: int, before: str | None) -> list[dict]:
            entries = read_history(reads, thread_id, user_id=user_id, limit=limit, before=before)
            return [entry.as_dict() for entry in entries]

        everything = page(MAX_LISTED, None) if before or tree else []
        if before is not None:
            before = resolve_checkpoint_ref(everything, thread_id, before)
        entries = page(limit, before)
        console.print(history_table(entries, title=f"Thread {thread_id}", full_ids=full_ids, head_known=before is None))
        if tree:
            console.print(branch_tree(everything))


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", metavar="HOST", help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="TCP port.")] = 8000,
    database_url: DatabaseUrl = None,
    model: Model = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker processes on the one port (one core each).")
    ] = 1,
    agent_file: AgentFile = None,
) -> None:
    """Start the MLflow Agent Server (POST /invocations, POST /responses, GET /health, GET /ready, GET /agent/info)."""
    with agent_errors():
        from agent.serving.app import run_agent_server

        run_agent_server(
            host=host, port=port, database_url=database_url, model=model, workers=workers, agent_file=agent_file
        )
