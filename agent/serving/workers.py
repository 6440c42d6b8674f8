"""Worker processes of `tt-agent serve --workers N`, each listening on its own socket of the one port.

**Why one socket per worker.** uvicorn's process manager binds one listening
socket in the parent, and every worker accepts from it. Whichever worker's
event loop wakes first takes the connections waiting in that one queue, so a
burst of new connections tends to land on one worker, and keep-alive clients
stay there: in the load benchmark's workers phase one worker did most of the
work and a second worker added little (figures: docs/performance.md, "Serving
under load"). With `SO_REUSEPORT`
(Linux 3.9+) every worker binds its own socket on the same host and port, and
the kernel gives each new connection to one of the sockets by a hash of its
addresses and ports, whatever the workers are doing at that moment: each
connection lands on a worker independently, so N connections spread about
evenly over the workers.

**What is uvicorn's.** The supervisor is uvicorn's own
(`uvicorn.supervisors.Multiprocess`): it starts the workers as spawned
processes running `uvicorn.Server`, pings them, replaces a worker that dies
or hangs (a crash of one request's process must not take the port's other
workers down; the database claims keep every thread consistent whichever
worker dies), stops everything with exit code 3 when a worker fails while
starting (a broken setting would fail every restart the same way), forwards
SIGINT/SIGTERM to the workers and waits for them, replaces the workers one by
one on SIGHUP, and adds or removes one on SIGTTIN/SIGTTOU. `ReusePortWorkers`
changes only where the sockets come from: every worker it starts, first or
replacement, gets a socket of its own, bound and listening before the worker
starts (connections that hash to it wait in its queue while the worker
imports), and closed in the parent once the worker has it, so that a worker's
queue dies with the worker (its waiting connections are reset, new ones go to
the other sockets) instead of filling up with nobody to accept it.

**Why not gunicorn.** It is not a dependency, it serves ASGI only through a
uvicorn worker class, and its `reuse_port` setting sets `SO_REUSEPORT` on the
sockets its master binds and its workers inherit (`gunicorn/sock.py`
`create_sockets`, called by the arbiter): the workers still share one socket.

**A port others can join.** Any process of the same user that sets
`SO_REUSEPORT` may bind a port held with it, and then receives part of its
connections: a second server started by mistake on the same port would not
fail. So the parent first binds the port once without `SO_REUSEPORT`, which
fails with "address already in use" when anything listens there, and releases
it just before binding the workers' sockets.

**Elsewhere.** macOS and the BSDs accept `SO_REUSEPORT` but do not balance
connections over the sockets (FreeBSD has `SO_REUSEPORT_LB` for that), and
Windows has no such option: there `tt-agent serve` uses uvicorn's shared socket
and says so in its startup line (`balances_connections`).
"""

from __future__ import annotations

import logging
import socket
import sys

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors import Multiprocess

logger = logging.getLogger("uvicorn.error")


def balances_connections() -> bool:
    """Whether one `SO_REUSEPORT` socket per worker spreads connections over the workers here (Linux only)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


class ReusePortWorkers(Multiprocess):
    """uvicorn's worker supervisor, each worker on its own `SO_REUSEPORT` socket of `config.host`:`config.port`.

    `config` is a `uvicorn.Config` with `workers` >= 2 and an import string for
    the app (`factory=True` for `create_app`). `run()` blocks until SIGINT or
    SIGTERM (then every worker has stopped), or until a worker failed while
    starting (`startup_failed` is then True).

    Raises (from the constructor):
        OSError: the port is in use, or the host is not an address of this machine.
    """

    def __init__(self, config: Config) -> None:
        self.startup_failed = False
        self._handed_out: list[socket.socket] = []
        _check_port_free(config)
        super().__init__(config, sockets=[])

    # uvicorn's supervisor passes `self.sockets` to every worker process it creates (start,
    # replacement, SIGHUP, SIGTTIN), so reading it is where a new worker gets its own socket.
    @property
    def sockets(self) -> list[socket.socket]:
        sock = reuse_port_socket(self.config)
        self._handed_out.append(sock)
        return [sock]

    @sockets.setter
    def sockets(self, _unused: list[socket.socket]) -> None:
        pass  # set by Multiprocess.__init__; every worker gets a new socket instead

    def init_processes(self) -> None:
        super().init_processes()
        self._close_handed_out()

    def handle_signals(self) -> None:
        super().handle_signals()
        self._close_handed_out()

    def keep_subprocess_alive(self) -> None:
        exiting = self.should_exit.is_set()
        super().keep_subprocess_alive()
        self._close_handed_out()
        # Only a worker that failed while starting makes the supervisor stop by itself.
        if not exiting and self.should_exit.is_set():
            self.startup_failed = True

    def _close_handed_out(self) -> None:
        # Every worker created since the last call has started and holds its own copy of its socket.
        while self._handed_out:
            self._handed_out.pop().close()


def reuse_port_socket(config: Config) -> socket.socket:
    """A TCP socket with `SO_REUSEPORT`, bound to `config.host`:`config.port` and listening, inheritable.

    Raises:
        OSError: it cannot be bound (another user's socket holds the port, a bad host...).
    """
    sock = socket.socket(_family(config.host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((config.host, config.port))
        sock.listen(config.backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run_workers(config: Config) -> int:
    """Serve with `ReusePortWorkers` until SIGINT/SIGTERM; the exit status for the command.

    Returns:
        0 after a signal stopped the workers; 3 (uvicorn's STARTUP_FAILURE) when the port
        could not be bound (at start or for a replacement worker) or a worker failed while
        starting (its error is in the log).
    """
    try:
        supervisor = ReusePortWorkers(config)
    except OSError as exc:
        logger.error(exc)
        return STARTUP_FAILURE
    scheme_host = f"[{config.host}]" if ":" in config.host else config.host
    logger.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", scheme_host, config.port)
    try:
        supervisor.run()
    except KeyboardInterrupt:  # pragma: no cover - uvicorn's handlers turn SIGINT into a clean stop
        pass
    except OSError as exc:  # a replacement worker's socket could not be bound: stop the others too
        logger.error(exc)
        supervisor.terminate_all()
        supervisor.join_all()
        return STARTUP_FAILURE
    return STARTUP_FAILURE if supervisor.startup_failed else 0


def _check_port_free(config: Config) -> None:
    # Without SO_REUSEPORT this bind fails if anything holds the port, reuse-port sockets included
    # (module docstring: a port others can join).
    with socket.socket(_family(config.host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((config.host, config.port))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
