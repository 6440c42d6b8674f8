"""`tt-agent serve`: the MLflow Agent Server (`agent.serving.app`)."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli.app import AgentFile, DatabaseUrl, Model, agent_errors, app


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
    """Start the MLflow Agent Server (POST /invocations, POST /responses, GET /health, GET /ready, GET /agent/info)
    and the web page at /. Settings come from AGENT_* variables (docs/configuration.md): behind a proxy that names
    the user, AGENT_USER_ID_HEADER (e.g. X-Forwarded-User) makes each request act as that user."""
    with agent_errors():
        if agent_file is None:  # a typo fails before MLflow's ~2 s of imports (an agent file has settings of its own)
            from agent.config import load_settings

            load_settings(database_url=database_url, model=model)
        from agent.serving.app import run_agent_server

        run_agent_server(
            host=host, port=port, database_url=database_url, model=model, workers=workers, agent_file=agent_file
        )
