"""`tt-agent sweep`: delete (or trim to their head) the threads idle longer than their time to live, once."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer

from agent.cli.app import DatabaseUrl, agent_errors, app, console
from agent.cli.stores import open_agent, store_label

#: `agent.config.ThreadTtlStrategy`, spelled out: importing agent.config (pydantic-settings) here would
#: slow every `tt-agent --help` (docs/performance.md).
ThreadTtlStrategy = Literal["delete", "keep_latest"]


@app.command()
def sweep(
    ttl_seconds: Annotated[
        float | None,
        typer.Option(
            "--ttl-seconds",
            min=0.001,
            metavar="SECONDS",
            envvar="AGENT_THREAD_TTL_SECONDS",
            show_envvar=True,
            help="Threads idle this long expire (a thread's own ttl_seconds wins). Unset: only threads with their own.",
        ),
    ] = None,
    strategy: Annotated[
        ThreadTtlStrategy | None,
        typer.Option(
            "--strategy",
            envvar="AGENT_THREAD_TTL_STRATEGY",
            show_envvar=True,
            help="delete: the whole thread; keep_latest: only the head checkpoint stays. Unset: delete.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"deleted_thread_ids": [...], "trimmed": [...], "failed_thread_ids": [...]} as JSON.')
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Sweep expired threads once and print what was removed. Never creates a store; skips threads busy with a turn."""
    with agent_errors(store=store_label(database_url)), open_agent(
        database_url, "offline", False, read_only=True, thread_ttl_seconds=ttl_seconds, thread_ttl_strategy=strategy
    ) as agent:
        removed = agent.sweep_expired_threads()
    if as_json:
        console.print_json(json.dumps(removed))
        return
    if not removed["deleted_thread_ids"] and not removed["trimmed"] and not removed["failed_thread_ids"]:
        console.print("Nothing expired.")
    for thread_id in removed["deleted_thread_ids"]:
        console.print(f"deleted {thread_id}", markup=False)
    for trimmed in removed["trimmed"]:
        removed_checkpoints = trimmed["removed_checkpoints"]
        console.print(f"trimmed {trimmed['thread_id']}: {removed_checkpoints} checkpoint(s) removed", markup=False)
    for thread_id in removed["failed_thread_ids"]:
        console.print(f"skipped {thread_id}: it could not be swept (see the warning logged)", markup=False)
