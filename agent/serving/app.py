"""Lifecycle of `tt-agent serve`: build the agent from settings, build the app, run uvicorn, close.

Request handling lives in `agent_server`; this module only starts and stops things.
"""

from __future__ import annotations

import os
import sys

import uvicorn


def run_agent_server(host: str, port: int, database_url: str | None, model: str | None) -> None:
    """Serve an agent on `host`:`port` until interrupted (Ctrl-C or SIGTERM), then close it.

    Args:
        host: interface to bind, e.g. `"127.0.0.1"` (local only) or `"0.0.0.0"`.
        port: TCP port.
        database_url: as for `agent.create_agent`; None reads `AGENT_DATABASE_URL`,
            else the embedded SQLite file.
        model: as for `agent.create_agent`; None reads `AGENT_MODEL`, else offline
            unless an OpenAI key or base URL is set.

    Raises:
        ConfigurationError, StorageUnavailable: from `create_agent`, before the
            port is bound (the database is connected and set up first).
    """
    from agent.factory import create_agent
    from agent.serving.agent_server import build_app

    # Tracing is on in the server unless AGENT_TRACING says otherwise.
    tracing = None if "AGENT_TRACING" in os.environ else True
    with create_agent(database_url, model, tracing=tracing) as agent:
        print(startup_line(agent, host, port), file=sys.stderr, flush=True)
        uvicorn.run(build_app(agent), host=host, port=port)


def startup_line(agent, host: str, port: int) -> str:
    """What `tt-agent serve` says first: the version, the store (an absolute path or a masked URL),
    the model, tracing, and where it listens."""
    info = agent.info()
    return (
        f"{info.name} {info.version} serving on http://{host}:{port}: store {info.store}, "
        f"model {info.model}, tracing {'on' if info.tracing else 'off'}"
    )
