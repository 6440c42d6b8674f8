"""Lifecycle of `tt-agent serve`: build the agent from settings, build the app, run uvicorn, close.

Request handling lives in `agent_server`; this module only starts and stops things.

**Workers.** One Python process uses one core, so `tt-agent serve --workers N`
runs N worker processes on one port with uvicorn's process manager. On Linux
each worker listens on a socket of its own (`SO_REUSEPORT`, `agent.serving.workers`
says why: with uvicorn's one shared socket, keep-alive clients piled onto one
worker); elsewhere they share uvicorn's one socket, and the startup line says
which. Each worker is a separate replica of the agent: its own pool and
claims, the same database, so a thread's turns can land on any worker
(claims keep each thread's chain linear across processes). uvicorn starts
workers from an import string, so each worker calls the app factory
`create_app`, which builds its agent from the `AGENT_*` environment: the
command-line options reach the workers through that environment (`--agent FILE`
as `AGENT_FILE`, so every worker runs the same file: `serving.agent_file`). Before any
worker starts, the parent process connects once and sets the tables up, so
a wrong URL fails `tt-agent serve` at once instead of making every worker
die at start-up. The parent also creates MLflow's tracking store, for the
same reason.

**Retention.** With `sweep_interval_seconds` set, every server process (each
worker) runs a retention sweeper from start-up to shutdown (`serving.sweeper`,
attached by `with_lifespan`); sweeps are safe to run concurrently.

**Graceful stop.** On SIGINT or SIGTERM each server process (each worker) lets its background runs
finish for up to `shutdown_grace_seconds` after the signal, then stops those still going, which read
`failed` at once (`serving.drain`, attached by `with_lifespan`). uvicorn's `timeout_graceful_shutdown`
gives open connections the same deadline (uvicorn's default waits for them without end).

**Keep-alive.** Idle HTTP connections stay open `KEEP_ALIVE_S` seconds
(uvicorn's default is 5 s). A client, or a load balancer, reusing a pooled
connection at the moment the server closes it for idleness gets a
connection reset on a request the server never saw (seen in the load
benchmark: `httpx.ReadError` on 2 of 200 conversations). Keeping server
connections open longer than clients and balancers keep theirs (60 s for
most balancers) makes the server never the one to close an idle connection
under them.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from fastapi import FastAPI

#: Seconds an idle keep-alive connection stays open (module docstring).
KEEP_ALIVE_S = 75


def run_agent_server(
    host: str,
    port: int,
    database_url: str | None,
    model: str | None,
    *,
    workers: int = 1,
    agent_file: str | None = None,
) -> None:
    """Serve an agent on `host`:`port` until interrupted (Ctrl-C or SIGTERM), then close it.

    Args:
        host: interface to bind, e.g. `"127.0.0.1"` (local only) or `"0.0.0.0"`.
        port: TCP port.
        database_url: as for `agent.create_agent`; None reads `AGENT_DATABASE_URL`,
            else the embedded SQLite file.
        model: as for `agent.create_agent`; None reads `AGENT_MODEL`, else offline
            unless an OpenAI key or base URL is set.
        workers: worker processes (>= 1). With more than one, each builds its
            own agent from the environment (`create_app`); a worker that dies is
            replaced, and one that fails while starting stops the command with
            exit status 3 (as does a port already in use).
        agent_file: a models-from-code file whose agent to serve (`serving.agent_file`), run
            after `database_url` and `model` are put in the environment it reads; None: the
            built-in agent.

    Tracing is on unless `AGENT_TRACING` says otherwise.

    Raises:
        ConfigurationError: from `create_agent` or the agent file (`serving.agent_file.load_agent_file`),
            or `workers` > 1 on `memory://` (each worker would have a store of its own); before
            the port is bound.
        StorageUnavailable: from `create_agent`, before the port is bound (the database is
            connected and set up first).
    """
    from agent.serving.agent_file import AGENT_FILE_ENV, agent_file_path, agent_from_environment

    # The workers (and an agent file's create_agent) read their settings from the environment, so the options go there.
    if database_url is not None:
        os.environ["AGENT_DATABASE_URL"] = database_url
    if model is not None:
        os.environ["AGENT_MODEL"] = model
    if agent_file is not None:
        os.environ[AGENT_FILE_ENV] = str(agent_file_path(agent_file))  # absolute: workers may start elsewhere
    os.environ.setdefault("AGENT_TRACING", "true")
    if is_loopback(host):  # only this machine reaches it: only its names (DNS rebinding, `serving.origins`)
        from agent.serving.origins import LOOPBACK_HOSTS

        os.environ.setdefault("AGENT_ALLOWED_HOSTS", ",".join(LOOPBACK_HOSTS))
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_config": log_config(),
        "timeout_keep_alive": KEEP_ALIVE_S,
    }
    if workers == 1:
        from agent.serving.agent_server import build_app

        with agent_from_environment() as agent:
            print(startup_line(agent, host, port), file=sys.stderr, flush=True)
            options["timeout_graceful_shutdown"] = connections_grace(agent.settings)
            app = build_app(agent)
            with_lifespan(app, agent, close_agent=False)
            uvicorn.run(app, **options)
        return
    from agent.errors import ConfigurationError

    # Connect and set up once, here, so that a bad setting fails now and the workers never race on
    # setup: the agent's tables, and MLflow's tracking store (two workers migrating one new SQLite
    # store at once crash with "duplicate column name").
    from agent.serving import workers as worker_processes

    own_sockets = worker_processes.balances_connections()
    sockets = "one socket each (SO_REUSEPORT)" if own_sockets else "one shared socket (balancing needs Linux)"
    with agent_from_environment() as agent:
        if agent.info().store_kind == "memory":
            # Each worker would get a store of its own: one thread would split into diverging conversations.
            raise ConfigurationError(
                "--workers needs a store the workers share (a SQLite file or Postgres); memory:// lives in one "
                "process. Use --workers 1, or another --database-url."
            )
        print(f"{startup_line(agent, host, port)}, {workers} workers on {sockets}", file=sys.stderr, flush=True)
        options["timeout_graceful_shutdown"] = connections_grace(agent.settings)
    if not own_sockets:
        uvicorn.run("agent.serving.app:create_app", factory=True, workers=workers, **options)
        return
    status = worker_processes.run_workers(
        uvicorn.Config("agent.serving.app:create_app", factory=True, workers=workers, **options)
    )
    if status:
        sys.exit(status)


def connections_grace(settings: Any) -> float:
    """uvicorn's `timeout_graceful_shutdown`: how long open connections may go on after SIGINT/SIGTERM, a
    little longer than the runs' grace period (`serving.drain`), so their runs are stopped and recorded first.
    uvicorn's lifespan exit, where the runs are waited for, comes after it and has no timeout of its own."""
    from agent.serving.drain import CONNECTIONS_MARGIN_SECONDS

    return settings.shutdown_grace_seconds + CONNECTIONS_MARGIN_SECONDS


def startup_line(agent: Any, host: str, port: int) -> str:
    """What `tt-agent serve` says first: the version, the agent file (`AGENT_FILE`) when one is served,
    the store (an absolute path or a masked URL), the model, tracing, where it listens, and the
    retention sweeper's interval when one runs."""
    from agent.serving.agent_file import AGENT_FILE_ENV

    info = agent.info()
    served = f" {os.environ[AGENT_FILE_ENV]}" if os.environ.get(AGENT_FILE_ENV) else ""
    line = (
        f"{info.name} {info.version} serving{served} on http://{host}:{port}: store {info.store}, "
        f"model {info.model}, tracing {_tracing_words(info.tracing)}"
    )
    interval = agent.settings.sweep_interval_seconds
    return f"{line}, sweeping expired threads every {interval:g} s" if interval else line


def _tracing_words(on: bool) -> str:
    """`on`, `off`, or `on (1 turn in 5 ...)` when only a share of the turns is traced (`agent.tracing`)."""
    from agent.tracing import traced_share

    share = traced_share() if on else None
    if not on:
        return "off"
    if share is None or share >= 1.0:
        return "on"
    return f"on ({share:.0%} of turns; AGENT_TRACE_SAMPLE_RATIO=1 traces every turn)"


def is_loopback(host: str) -> bool:
    """Whether binding `host` (an address or a name, e.g. "127.0.0.1", "localhost", "::1") serves only this machine."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app() -> FastAPI:
    """The app of one worker process: the agent of `AGENT_FILE` when set, else one built from the
    `AGENT_*` environment (`serving.agent_file.agent_from_environment`); closed at shutdown.

    uvicorn's process manager calls this in each worker (`factory=True`).

    Raises:
        ConfigurationError, StorageUnavailable: from `create_agent` or the agent file.
    """
    from agent.serving.agent_file import agent_from_environment
    from agent.serving.agent_server import build_app

    agent = agent_from_environment()
    app = build_app(agent)
    with_lifespan(app, agent, close_agent=True)
    return app


def with_lifespan(app: FastAPI, agent: Any, *, close_agent: bool) -> None:
    """Give `app` the lifespan of one server process: the retention sweeper (`serving.sweeper`) runs
    from start-up to shutdown when `sweep_interval_seconds` is set; at shutdown the process's runs finish
    for up to `shutdown_grace_seconds` (`serving.drain`); `close_agent`: close `agent` at shutdown."""
    from agent.serving.collector import tune_for_serving
    from agent.serving.drain import Drain
    from agent.tracing import build_tracer_now
    from agent.serving.sweeper import Sweeper

    interval = agent.settings.sweep_interval_seconds

    def warm_up() -> None:
        build_tracer_now()  # not on the first traced turn, which would stall the event loop (agent.tracing)
        tune_for_serving()  # the agent, the app and the tracer are built: their objects never need collecting

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # In a worker thread, once the server answers: about a second of CPU that `/ready` need not wait for
        # (`bench.startup`); a turn that comes first waits for the tracer's build (MLflow builds it once, under
        # a lock), as it did before the warm-up existed.
        warming = asyncio.get_running_loop().run_in_executor(None, warm_up)
        sweeper = Sweeper(agent, interval) if interval else None
        if sweeper is not None:
            sweeper.start()
        drain = Drain(agent.runs, agent.settings.shutdown_grace_seconds)
        drain.watch_signals()
        try:
            yield
        finally:
            try:
                await drain.finish()  # before the sweeper and the agent close: the runs use the store
                await asyncio.gather(warming, return_exceptions=True)
                if sweeper is not None:
                    await asyncio.to_thread(sweeper.stop)
            finally:
                if close_agent:
                    agent.close()

    app.router.lifespan_context = lifespan


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration, plus the `agent` loggers at INFO on the same console handler
    (so that `agent.serving`'s one-line error answers show next to uvicorn's access lines)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["agent"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config
