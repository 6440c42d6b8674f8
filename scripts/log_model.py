#!/usr/bin/env python
"""Log the agent as an MLflow model (models from code) and print its model URI as the last line.

Usage::

    python scripts/log_model.py [--agent FILE] [--name agent] [--register-name NAME] [--experiment NAME]

`--agent FILE` logs your own models-from-code file (examples/my_agent.py) instead of the
built-in agent; a file that is missing, raises or sets no agent is one "Error: ..." line and exit code 1.

Then serve it (no streaming, mlflow issue 12439; `tt-agent serve` streams)::

    mlflow models serve -m "$(python scripts/log_model.py | tail -n 1)" --env-manager local -p 5000

Where it is logged: `MLFLOW_TRACKING_URI`, else the SQLite store
`sqlite:///.agent/mlflow.db` with artifacts under `.agent/mlartifacts` (both
relative to the current directory).

Logging never connects to `AGENT_DATABASE_URL`: MLflow's check `predict` runs on
`memory://` with the offline model. The process that loads the model (for
example `mlflow models serve`) connects to its own `AGENT_DATABASE_URL` on its
first request. See `agent.serving.log_model` for what is logged.

The last line printed is the model URI: `models:/<NAME>/<version>` with
`--register-name`, else the logged model's `models:/<model_id>`.
"""

from __future__ import annotations

import argparse
import os
import sys

# MLflow logs INFO lines (store creation, the input example check, the trace queue flushed at
# exit) that would follow the URI in a terminal; it reads this variable when imported.
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

import mlflow  # noqa: E402

from agent.errors import AgentError  # noqa: E402
from agent.serving import log_model  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="agent", help="Logged model name (default: agent).")
    parser.add_argument("--register-name", default=None, help="Also register the model under this name.")
    parser.add_argument("--experiment", default=None, help="Experiment name (default: the active experiment).")
    parser.add_argument(
        "--agent", default=None, metavar="FILE", help="Your models-from-code file (default: the built-in agent)."
    )
    args = parser.parse_args(argv)
    try:
        uri = log_model(args.name, register_name=args.register_name, experiment=args.experiment, agent_file=args.agent)
    except AgentError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(1)
    print(f"Logged the agent to {mlflow.get_tracking_uri()}")
    print(uri)


if __name__ == "__main__":
    main()
