"""`tt-agent`: the command line (also `python -m agent`).

Modules, each importing `app` and none imported back:
* `app`: the Typer app, its help style, the consoles, the shared options, errors in red;
* `stores`: opening an agent, or only a store's reads, for one command, and naming the store;
* `operations`: a command for each registered operation that declares one (`history`, `state`,
  `branches`, `switch`, `fork`, `compare`, `usage`, `threads`, `threads show`, `threads update`,
  `memories`), built from `manifest` (generated from the registry by `specs`) and run through the
  operations' door; `outputs`: how each prints its result;
* hand-written commands that are more than one operation: `demo` (the trip scenario;
  `memory_demo` its long-term-memory variant), `chat` (the REPL and its slash commands),
  `serve`, `transfer` (`export`, `import`), `retention` (`sweep`), and `threads` (`rename`, an
  alias of `threads update --title`); `printing` prints a streamed reply as it arrives.
Tables and trees are drawn by `agent.views`, which the notebooks use too.

Options left unset come from the environment (`AGENT_DATABASE_URL`,
`AGENT_MODEL`, `AGENT_TRACING`, and `OPENAI_API_KEY` / `OPENAI_BASE_URL` for a
real model). With nothing set, the store is `.agent/checkpoints.sqlite` under
the current directory and the model is the offline one. Every banner and every
"not found" names the store by its absolute path (a Postgres URL with its
password masked), and commands on existing threads never create a store.

Start-up: `tt-agent --help`, `--version` and a command's `--help` import Typer
and rich only (the operations' commands are built from the generated manifest,
not from the registry), and each command imports what it uses when it runs
(the agent loads LangChain and LangGraph: seconds). The read-only operations
(`history`, `threads`, `threads show`) read through `agent.storage.open_reader`,
which on SQLite needs none of them. tests/cli/test_startup.py holds both.

An `AgentError` is printed in red on stderr, with exit code 1 and no traceback.
MLflow's INFO lines are silenced unless `MLFLOW_LOGGING_LEVEL` says otherwise.
"""

from __future__ import annotations

import logging
import os

from agent.cli.app import app
from agent.cli.stores import open_agent, open_reads

# The commands register themselves on `app`; the order of these imports is the order of `tt-agent --help`.
from agent.cli import demo, chat, operations, serve, transfer, retention, threads  # noqa: E402,F401,I001

__all__ = ["app", "main", "open_agent", "open_reads"]


def main() -> None:
    """Entry point of the `tt-agent` console script and of `python -m agent`."""
    # psycopg_pool logs a warning per failed connection attempt while it retries; the
    # StorageUnavailable that follows says the same once, with the URL masked.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # MLflow configures its own loggers at INFO when imported; a command line prints what it
    # means to say. The variable is read when MLflow is imported (mlflow.utils.logging_utils).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    app(prog_name="tt-agent")
