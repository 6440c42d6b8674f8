"""`tt-agent threads`: a user's threads, newest activity first; `show` one, `rename` or `update` it.

Listing and `show` read through `agent.storage.open_reader` (on SQLite without LangGraph, LangChain or
MLflow) and never create a store; `rename` and `update` open the storage to write one row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from agent.cli import DatabaseUrl, Group, UserId, _App, agent_errors, app, console, open_reads, resolve_url, store_label

if TYPE_CHECKING:
    from agent.storage import ThreadStorage

threads_app = _App(
    name="threads",
    cls=Group,
    help="List a user's threads, newest activity first (`show`, `rename`, `update` for one).",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(threads_app)

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@threads_app.callback()
def threads(
    ctx: typer.Context,
    user_id: UserId = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, metavar="N", help="Most threads to show.")] = 20,
    before: Annotated[
        str | None,
        typer.Option("--before", metavar="CURSOR", help="The next page: the cursor the previous page printed (or a thread id)."),
    ] = None,
    metadata: Annotated[
        list[str] | None, typer.Option("--metadata", metavar="KEY=VALUE", help="Only threads with this metadata (repeatable).")
    ] = None,
    as_json: Json = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List a user's threads, newest activity first. Never creates a store."""
    if ctx.invoked_subcommand is not None:
        return
    from agent.operations.catalogue import list_page
    from agent.views import threads_table

    with agent_errors(store=store_label(database_url)), open_reads(database_url) as reads:
        found, next_before = list_page(
            reads, user_id=user_id, limit=limit, before=before, metadata=_pairs(metadata) if metadata else None
        )
    if as_json:
        print(json.dumps({"threads": found, "next_before": next_before}, indent=2, ensure_ascii=False))
        return
    title = f"Threads of {user_id}" if user_id else "Threads (no user_id)"
    console.print(threads_table(found, title=title, next_before=next_before))


@threads_app.command()
def show(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    user_id: UserId = None,
    as_json: Json = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print one thread: title, metadata, head checkpoint, message count, timestamps. Never creates a store."""
    from agent.operations.catalogue import get_thread

    with agent_errors(store=store_label(database_url)), open_reads(database_url) as reads:
        thread = get_thread(reads, thread_id, user_id=user_id)
    _print_thread(thread, as_json)


@threads_app.command()
def rename(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    title: Annotated[str, typer.Argument(help="Its new title (1 to 256 characters).")],
    user_id: UserId = None,
    as_json: Json = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Give a thread a new title (its activity time and order do not change)."""
    from agent.operations.catalogue import update_thread

    with agent_errors(store=store_label(database_url)), _storage(database_url) as storage:
        thread = update_thread(storage, thread_id, user_id=user_id, title=title)
    _print_thread(thread, as_json)


@threads_app.command()
def update(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    title: Annotated[str | None, typer.Option("--title", metavar="TEXT", help="A new title.")] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", metavar="KEY=VALUE", help="The new metadata (repeatable; replaces all of it)."),
    ] = None,
    ttl_seconds: Annotated[
        float | None, typer.Option("--ttl-seconds", metavar="SECONDS", help="Idle time before retention may remove it.")
    ] = None,
    user_id: UserId = None,
    as_json: Json = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Set a thread's title, metadata (replaced as a whole) and/or ttl_seconds."""
    from agent.operations.catalogue import update_thread

    with agent_errors(store=store_label(database_url)), _storage(database_url) as storage:
        thread = update_thread(
            storage,
            thread_id,
            user_id=user_id,
            title=title,
            metadata=_pairs(metadata) if metadata is not None else None,
            ttl_seconds=ttl_seconds,
        )
    _print_thread(thread, as_json)


def _print_thread(thread: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(thread, indent=2, ensure_ascii=False))
        return
    from agent.views import thread_view

    console.print(thread_view(thread))


def _pairs(values: list[str]) -> dict[str, str]:
    from agent.errors import InvalidRequest

    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep:
            with agent_errors():
                raise InvalidRequest(f"--metadata takes KEY=VALUE, got {value!r}")
        pairs[key] = item
    return pairs


@contextmanager
def _storage(database_url: str | None) -> Iterator[ThreadStorage]:
    """The storage of an existing store, for a write that needs no model; never creates a store."""
    from agent.config import load_settings
    from agent.storage import open_storage, require_existing_database, require_tables

    url = resolve_url(database_url)
    require_existing_database(url)
    storage = open_storage(url, load_settings(database_url=database_url, model="offline"))
    try:
        require_tables(storage, url)
        yield storage
    finally:
        storage.close()
