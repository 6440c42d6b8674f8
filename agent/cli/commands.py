"""`tt-agent history` and `tt-agent serve`."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli import MAX_LISTED, DatabaseUrl, Model, UserId, agent_errors, app, console, open_agent
from agent.views import branch_tree, history_table


@app.command()
def history(
    thread_id: Annotated[str, typer.Argument(help="The thread to list.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_LISTED, help="Most checkpoints to show.")] = 10,
    before: Annotated[
        str | None, typer.Option("--before", help="Only checkpoints older than this one (full or short id).")
    ] = None,
    user_id: UserId = None,
    full_ids: Annotated[bool, typer.Option("--full-ids", help="Show whole checkpoint ids.")] = False,
    tree: Annotated[bool, typer.Option("--tree", help="Also draw the branches as a tree.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print one thread's checkpoints, newest first."""
    # No turn runs here, so no chat model is needed (and none is configured).
    with agent_errors(), open_agent(database_url, "offline", False, read_only=True) as agent:
        everything = agent.get_checkpoint_history(thread_id, limit=MAX_LISTED, user_id=user_id) if before or tree else []
        if before is not None:
            before = _resolve(everything, thread_id, before)
        entries = agent.get_checkpoint_history(thread_id, limit=limit, before=before, user_id=user_id)
        console.print(history_table(entries, title=f"Thread {thread_id}", full_ids=full_ids, head_known=before is None))
        if tree:
            console.print(branch_tree(everything))


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    database_url: DatabaseUrl = None,
    model: Model = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker processes on the one port (one core each).")
    ] = 1,
) -> None:
    """Start the MLflow Agent Server (POST /invocations, POST /responses, GET /health, GET /ready)."""
    with agent_errors():
        from agent.serving.app import run_agent_server

        run_agent_server(host=host, port=port, database_url=database_url, model=model, workers=workers)


def _resolve(entries: list[dict], thread_id: str, ref: str) -> str:
    from agent.operations.history import resolve_checkpoint_ref  # imported on use: it loads LangGraph

    return resolve_checkpoint_ref(entries, thread_id, ref)
