"""`tt-agent`: the command line (also `python -m agent`).

Modules: this one (the Typer app, shared options, opening an agent or a
store's reads, printing errors), `commands` (history, serve), `demo` (the trip
scenario; `memory_demo` its long-term-memory variant), `chat` (the REPL and its
slash commands), `threads` (the thread catalogue), `memories` (a user's long-term memories), `transfer`
(export and import of threads), `retention` (`sweep`: expired threads), `printing` (a streamed reply as it
arrives). Tables and trees are drawn by `agent.views`, which the
notebooks use too.

Options left unset come from the environment (`AGENT_DATABASE_URL`,
`AGENT_MODEL`, `AGENT_TRACING`, and `OPENAI_API_KEY` / `OPENAI_BASE_URL` for a
real model). With nothing set, the store is `.agent/checkpoints.sqlite` under
the current directory and the model is the offline one. Every banner and every
"not found" names the store by its absolute path (a Postgres URL with its
password masked), and read-only commands never create a store.

Start-up: `tt-agent --help` and `--version` import Typer and rich only, and
each command imports what it uses when it runs (the agent loads MLflow,
LangChain and LangGraph: seconds). `history` reads through
`agent.storage.open_reader`, which on SQLite needs none of them.
tests/test_startup.py holds both.

An `AgentError` is printed in red on stderr, with exit code 1 and no traceback.
MLflow's INFO lines are silenced unless `MLFLOW_LOGGING_LEVEL` says otherwise.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent
    from agent.storage import ThreadReads

#: Width used when output is not a terminal (pipes, logs, tests) and COLUMNS is unset; rich would use 80.
PIPE_WIDTH = 120

#: Most checkpoints read to resolve a short id or draw a branch tree.
MAX_LISTED = 1000


def _plain_help(params: list[Any]) -> list[Any]:
    # Typer 0.29 shows every parameter's Python type ("--tree <bool>", "thread_id <str>").
    for param in params:
        if isinstance(param, TyperArgument):
            param.metavar = param.metavar or param.name.upper()
            # The name column already says what it is.
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else param.name.upper()
    return params


class Command(TyperCommand):
    """A command whose help reads like other command lines': `Usage: tt-agent history [OPTIONS] THREAD_ID`,
    flags without a type (`--tree`, not `--tree <bool>`), and value options with a metavar
    (`--limit N`) instead of Typer's `<int>`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class Group(TyperGroup):
    """The `tt-agent` group, with the same plain help as `Command`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))


class _App(typer.Typer):
    """`typer.Typer` whose commands are `Command`s unless they ask for another class."""

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(*args, cls=cls or Command, **kwargs)


app = _App(
    name="tt-agent",
    cls=Group,
    help="A conversational agent with checkpoint memory you can branch from (time travel).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Tracebacks with local variables could show a database password.
    pretty_exceptions_enable=False,
)


def _make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


console = _make_console()
err_console = _make_console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from agent.version import __version__

        console.print(f"tt-agent {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """A conversational agent with checkpoint memory you can branch from (time travel)."""


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="AGENT_DATABASE_URL",
        show_envvar=True,
        metavar="URL",
        help="postgresql://…, sqlite:///path or memory://. Unset: .agent/checkpoints.sqlite in the current directory.",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        envvar="AGENT_MODEL",
        show_envvar=True,
        metavar="NAME",
        help='"offline" or an OpenAI-compatible model name. Unset: offline unless OPENAI_API_KEY/OPENAI_BASE_URL is set.',
    ),
]
Tracing = Annotated[
    bool,
    typer.Option("--tracing/--no-tracing", envvar="AGENT_TRACING", show_envvar=True, help="MLflow tracing of each turn."),
]
AgentFile = Annotated[
    str | None,
    typer.Option(
        "--agent",
        envvar="AGENT_FILE",
        show_envvar=True,
        metavar="FILE",
        help="Your agent: a models-from-code .py file that calls mlflow.models.set_model(agent) "
        "(examples/my_agent.py). Unset: the built-in agent.",
    ),
]
UserId = Annotated[
    str | None, typer.Option("--user-id", metavar="ID", help="The caller; threads are only visible to their owner.")
]


def main() -> None:
    """Entry point of the `tt-agent` console script and of `python -m agent`."""
    # psycopg_pool logs a warning per failed connection attempt while it retries; the
    # StorageUnavailable that follows says the same once, with the URL masked.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # MLflow configures its own loggers at INFO when imported; a command line prints what it
    # means to say. The variable is read when MLflow is imported (mlflow.utils.logging_utils).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    app(prog_name="tt-agent")


@contextmanager
def open_agent(
    database_url: str | None,
    model: str | None,
    tracing: bool,
    *,
    read_only: bool = False,
    agent_file: str | None = None,
    **settings: Any,
) -> Iterator[LangGraphResponsesAgent]:
    """An agent for one command (`settings`: more `AgentSettings` fields, None ones left to the
    environment), closed afterwards.

    `agent_file`: the agent of that models-from-code file instead (`agent.serving.agent_file`).
    Its `create_agent(...)` reads the environment, so `database_url`, `model` and `tracing` are
    put there first (`settings` are not: use `AGENT_*` variables); then it is connected.

    `read_only` commands (listings, export) never create a store: a SQLite file
    that does not exist, `memory://`, or a Postgres database without the
    agent's tables is a `ConfigurationError` naming the store and how to choose another.
    """
    from agent import create_agent

    from agent.storage import require_existing_store, require_tables

    if agent_file is not None:
        yield from _open_agent_file(agent_file, database_url, model, tracing)
        return
    if read_only:
        require_existing_store(resolve_url(database_url))
    given = {name: value for name, value in settings.items() if value is not None}
    agent = create_agent(database_url, model, tracing=tracing, connect=not read_only, **given)
    try:
        if read_only:
            require_tables(agent.storage, resolve_url(database_url))
        yield agent
    finally:
        agent.close()


def _open_agent_file(
    agent_file: str, database_url: str | None, model: str | None, tracing: bool
) -> Iterator[LangGraphResponsesAgent]:
    from agent.serving.agent_file import load_agent_file

    # A command line is one process for one command: setting its environment is what the file reads.
    if database_url is not None:
        os.environ["AGENT_DATABASE_URL"] = database_url
    if model is not None:
        os.environ["AGENT_MODEL"] = model
    os.environ["AGENT_TRACING"] = "true" if tracing else "false"
    agent = load_agent_file(agent_file)
    try:
        yield agent
    finally:
        agent.close()


@contextmanager
def open_reads(database_url: str | None) -> Iterator[ThreadReads]:
    """The reads of an existing store (`agent.storage.open_reader`: on SQLite without loading
    LangGraph, LangChain or MLflow), closed afterwards. Never creates a store."""
    from agent.config import load_settings
    from agent.storage import open_reader

    reads = open_reader(resolve_url(database_url), load_settings(database_url=database_url, model="offline"))
    try:
        yield reads
    finally:
        reads.close()


def resolve_url(database_url: str | None) -> str:
    """The store a command uses: `--database-url`, else `AGENT_DATABASE_URL`, else the embedded default."""
    from agent.config import resolve_database_url

    return resolve_database_url(database_url or os.environ.get("AGENT_DATABASE_URL"))


def store_label(database_url: str | None) -> str:
    """The store a command uses, for people: an absolute path, a masked URL, or memory://."""
    from agent.config import store_label as label

    return label(resolve_url(database_url))


def rerun_command() -> str:
    """How to run this program again from the current directory of this shell, as printed in hints.

    `tt-agent` when that name on PATH is this very program; else its path, relative when it
    lies below the current directory (`.venv/bin/tt-agent`); `<python> -m agent` under `python -m agent`.
    """
    here = Path.cwd()

    def shown(path: Path) -> str:
        try:
            relative = str(path.relative_to(here))
        except ValueError:
            return shlex.quote(str(path))
        # A bare name would be looked up on PATH.
        return shlex.quote(relative if "/" in relative else f"./{relative}")

    program = Path(sys.argv[0]).absolute()
    if program.name == "__main__.py":
        return f"{shown(Path(sys.executable).absolute())} -m agent"
    found = shutil.which("tt-agent")
    if found and Path(found).resolve() == program.resolve():
        return "tt-agent"
    return shown(program)


@contextmanager
def agent_errors(*, exit_on_error: bool = True, to: Console | None = None, store: str | None = None) -> Iterator[None]:
    """Print an `AgentError` in red (on stderr unless `to` says otherwise); then exit with code 1,
    or carry on (the chat loop, which prints to stdout so that a transcript keeps its order).

    `store` (a `store_label`) is added to "not found" errors, so they say where the command looked.
    """
    from agent.errors import AgentError, NotFound

    try:
        yield
    except AgentError as exc:
        message = exc.message
        if store and isinstance(exc, NotFound):
            message = f"{message.rstrip('.')} in the store {store}."
        (to or err_console).print(Text.assemble(("Error: ", "bold red"), (message, "red")))
        if exit_on_error:
            raise typer.Exit(code=1) from None


# The commands register themselves on `app`.
from agent.cli import demo, chat, commands, threads, memories, transfer, retention  # noqa: E402,F401,I001 - the order of `tt-agent --help`
