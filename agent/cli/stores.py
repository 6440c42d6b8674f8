"""Opening what a command works on: an agent, or only a store's reads, and naming the store for people.

Options left unset come from the environment (`AGENT_DATABASE_URL`, `AGENT_MODEL`,
`AGENT_TRACING`, and `OPENAI_API_KEY` / `OPENAI_BASE_URL` for a real model).
With nothing set, the store is `.agent/checkpoints.sqlite` under the current
directory. Commands on existing threads never create a store: a command that
only reads runs on `agent.storage.open_reader` (on SQLite without LangGraph,
LangChain or MLflow: `open_reads`); the others open the whole agent on a store
that must exist (`open_agent(read_only=True)`). Only the commands that send messages (`chat`,
`demo`) build the MLflow `LangGraphResponsesAgent`; the others build the plain `agent.Agent`
(`agent.factory.build_agent`), so they never import MLflow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.agent import Agent
    from agent.operations.context import OperationContext


@contextmanager
def open_agent(
    database_url: str | None,
    model: str | None,
    tracing: bool,
    *,
    read_only: bool = False,
    responses: bool = False,
    agent_file: str | None = None,
    **settings: Any,
) -> Iterator[Agent]:
    """An agent for one command (`settings`: more `AgentSettings` fields, None ones left to the
    environment), closed afterwards.

    `agent_file`: the agent of that models-from-code file instead (`agent.serving.agent_file`).
    Its `create_agent(...)` reads the environment, so `database_url`, `model` and `tracing` are
    put there first (`settings` are not: use `AGENT_*` variables); then it is connected.

    `responses`: the command calls `predict` / `predict_stream`, so it gets a `LangGraphResponsesAgent`
    (which imports MLflow); otherwise a plain `agent.Agent`. An `agent_file`'s agent is what the file built.

    `read_only`: the command works on what is there (listings, export, the operations on existing
    threads) and never creates a store: a SQLite file that does not exist, `memory://`, or a
    Postgres database without the agent's tables is a `ConfigurationError` naming the store and
    how to choose another.

    Raises:
        ConfigurationError: a bad setting (an unknown database URL scheme, a sqlite URL without a path, ...),
            raised before LangGraph or MLflow is imported; or a `read_only` store that does not exist.
    """
    from agent.config import load_settings

    if agent_file is not None:
        yield from _open_agent_file(agent_file, database_url, model, tracing)
        return
    given = {name: value for name, value in settings.items() if value is not None}
    # The settings (the database URL's form among them) are checked before the agent's imports (LangGraph, and
    # MLflow's ~2 s of CPU for `responses`), so that a typo fails at once; `build_agent` reads them again.
    load_settings(database_url=database_url, model=model, tracing=tracing, **given)
    from agent.agent import Agent
    from agent.factory import build_agent
    from agent.storage import require_existing_database, require_tables

    if read_only:
        require_existing_database(resolve_url(database_url))
    if responses:
        from agent.responses import LangGraphResponsesAgent as agent_class
    else:
        agent_class = Agent
    agent = build_agent(agent_class, database_url, model, tracing=tracing, connect=not read_only, **given)
    try:
        if read_only:
            require_tables(agent.storage, resolve_url(database_url))
        yield agent
    finally:
        agent.close()


def _open_agent_file(agent_file: str, database_url: str | None, model: str | None, tracing: bool) -> Iterator[Agent]:
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
def open_reads(database_url: str | None) -> Iterator[OperationContext]:
    """An operation context over the reads of an existing store (`agent.storage.open_reader`: on
    SQLite without loading LangGraph, LangChain or MLflow), for the operations declared
    `reads_only`; closed afterwards. Never creates a store."""
    from agent.config import load_settings
    from agent.operations.context import OperationContext
    from agent.storage import open_reader

    settings = load_settings(database_url=database_url, model="offline")
    context = OperationContext.reads(open_reader(resolve_url(database_url), settings), settings)
    try:
        yield context
    finally:
        context.close()


@contextmanager
def removed_if_left_empty(database_url: str | None) -> Iterator[list[str]]:
    """Around a command that may create a SQLite store: if the store's file did not exist before and
    the command fails before it wrote anything, the file (with its `-wal`, `-shm` and `-journal`
    files, and the directories made for it) is removed again, so that a failed command leaves no
    empty store behind. The command appends what it wrote to the list it is given; a non-empty list
    keeps the store. Postgres, `memory://` and existing files are left as they are.

    The file is removed only if it holds no thread, so a store another process filled meanwhile stays.
    """
    written: list[str] = []
    url = resolve_url(database_url)
    path = Path(url[len("sqlite:///") :]).resolve() if url.startswith("sqlite:///") else None
    if path is None or path.exists():
        yield written
        return
    made = [parent for parent in path.parents if not parent.exists()]  # the deepest first
    try:
        yield written
    except BaseException:
        if not written and _holds_no_thread(path):
            for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
                leftover.unlink(missing_ok=True)
            for directory in made:
                try:
                    directory.rmdir()
                except OSError:  # not empty: something else is in it now
                    break
        raise


def _holds_no_thread(path: Path) -> bool:
    import sqlite3

    if not path.exists():
        return True
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return "agent_threads" not in tables or conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0] == 0
    except sqlite3.Error:
        return False


def resolve_url(database_url: str | None) -> str:
    """The store a command uses: `--database-url`, else `AGENT_DATABASE_URL`, else the embedded default."""
    from agent.config import resolve_database_url

    return resolve_database_url(database_url or os.environ.get("AGENT_DATABASE_URL"))


def store_label(database_url: str | None) -> str:
    """The store a command uses, for people: an absolute path, a masked URL, or memory://."""
    from agent.config import store_label as label

    return label(resolve_url(database_url))
