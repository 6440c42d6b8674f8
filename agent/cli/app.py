"""The `tt-agent` Typer app, its help style, its consoles and the options its commands share.

Every other module of `agent.cli` imports this one and none imports it back:
the commands register themselves on `app` when `agent.cli` imports their
modules. This module imports Typer and rich only, so `tt-agent --help` pays for
nothing else.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

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
    """The `tt-agent` group (and `tt-agent threads`), with the same plain help as `Command`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))


class App(typer.Typer):
    """`typer.Typer` whose commands are `Command`s unless they ask for another class."""

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(*args, cls=cls or Command, **kwargs)


app = App(
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


# -- the shared options -------------------------------------------------------------------------------
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
#: The `--user-id` option's help, also for commands where it is required.
USER_ID_HELP = "The caller; threads are only visible to their owner."
UserId = Annotated[str | None, typer.Option("--user-id", metavar="ID", help=USER_ID_HELP)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


# -- errors and hints ---------------------------------------------------------------------------------
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


def rerun_hint(args: list[str], database_url: str | None) -> str | None:
    """`rerun_command()` with `args`, runnable as printed in this shell, for a demo's closing hint.

    A `database_url` given on the command line (not the one `AGENT_DATABASE_URL` already holds) is
    repeated as `--database-url`, its password shown as `***` (to be typed again). None on
    `memory://`: what the command would read ended with this process.
    """
    from agent.config import mask_url, store_kind

    if store_kind(database_url or os.environ.get("AGENT_DATABASE_URL") or "") == "memory":
        return None
    if database_url and database_url != os.environ.get("AGENT_DATABASE_URL"):
        args = [*args, "--database-url", mask_url(database_url)]
    return f"{rerun_command()} " + " ".join(shlex.quote(arg) for arg in args)
