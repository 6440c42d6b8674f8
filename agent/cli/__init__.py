"""`tt-agent`: the command line (also `python -m agent`).

Modules: this one (the Typer app, shared options, opening an agent, printing
errors), `commands` (history, serve), `demo` (the trip scenario; `memory_demo`
its long-term-memory variant), `chat` (the REPL and its slash commands),
`memories` (a user's long-term memories), `printing` (a streamed reply as it arrives). Tables
and trees are drawn by `agent.views`, which the notebooks use too.

Options left unset come from the environment (`AGENT_DATABASE_URL`,
`AGENT_MODEL`, `AGENT_TRACING`, and `OPENAI_API_KEY` / `OPENAI_BASE_URL` for a
real model). With nothing set, the store is `sqlite:///.agent/checkpoints.sqlite`
under the current directory and the model is the offline one.

An `AgentError` is printed in red on stderr, with exit code 1 and no traceback.
Commands import the agent only when they run: importing it costs seconds.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

#: Width used when output is not a terminal (pipes, logs, tests) and COLUMNS is unset; rich would use 80.
PIPE_WIDTH = 120

#: Most checkpoints read to resolve a short id or draw a branch tree.
MAX_LISTED = 1000

app = typer.Typer(
    name="tt-agent",
    help="A conversational agent with checkpoint memory you can branch from (time travel).",
    no_args_is_help=True,
    add_completion=False,
    # Tracebacks with local variables could show a database password.
    pretty_exceptions_enable=False,
)


def _make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


console = _make_console()
err_console = _make_console(stderr=True)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="AGENT_DATABASE_URL",
        show_envvar=True,
        help="postgresql://…, sqlite:///path or memory://. Unset: sqlite:///.agent/checkpoints.sqlite.",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        envvar="AGENT_MODEL",
        show_envvar=True,
        help='"offline" or an OpenAI-compatible model name. Unset: offline unless OPENAI_API_KEY/OPENAI_BASE_URL is set.',
    ),
]
Tracing = Annotated[
    bool,
    typer.Option("--tracing/--no-tracing", envvar="AGENT_TRACING", show_envvar=True, help="MLflow tracing of each turn."),
]
UserId = Annotated[str | None, typer.Option("--user-id", help="The caller; threads are only visible to their owner.")]


def main() -> None:
    """Entry point of the `tt-agent` console script and of `python -m agent`."""
    # psycopg_pool logs a warning per failed connection attempt while it retries; the
    # StorageUnavailable that follows says the same once, with the URL masked.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    app(prog_name="tt-agent")


@contextmanager
def open_agent(
    database_url: str | None, model: str | None, tracing: bool, *, read_only: bool = False
) -> Iterator[LangGraphResponsesAgent]:
    """An agent for one command, closed afterwards.

    `read_only` commands (history, listings, export) never create a store: a SQLite file
    that does not exist is a `ConfigurationError` naming the path that was looked at.
    """
    from agent import create_agent

    if read_only:
        _require_existing_store(database_url)
    agent = create_agent(database_url, model, tracing=tracing)
    try:
        yield agent
    finally:
        agent.close()


def _require_existing_store(database_url: str | None) -> None:
    from pathlib import Path

    from agent.config import load_settings
    from agent.errors import ConfigurationError

    url = load_settings(database_url=database_url).database_url
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :]).resolve()
        if not path.is_file():
            raise ConfigurationError(
                f"There is no store at {path} (sqlite:///{path}); nothing was created. "
                "Run the command where the store is, or choose one with --database-url or AGENT_DATABASE_URL."
            )


@contextmanager
def agent_errors(*, exit_on_error: bool = True, to: Console | None = None) -> Iterator[None]:
    """Print an `AgentError` in red (on stderr unless `to` says otherwise); then exit with code 1,
    or carry on (the chat loop, which prints to stdout so that a transcript keeps its order)."""
    from agent.errors import AgentError

    try:
        yield
    except AgentError as exc:
        (to or err_console).print(Text.assemble(("Error: ", "bold red"), (exc.message, "red")))
        if exit_on_error:
            raise typer.Exit(code=1) from None


# The commands register themselves on `app`.
from agent.cli import demo, chat, commands, memories  # noqa: E402,F401,I001 - the order of `tt-agent --help`
