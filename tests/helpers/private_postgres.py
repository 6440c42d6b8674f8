"""A private Postgres cluster of one's own: initdb into a directory, run it on a free port, restart it at will.

    with private_cluster(Path(tmp)) as cluster:
        url = cluster.url("postgres")       # postgresql://postgres@127.0.0.1:<port>/postgres, trust auth
        cluster.stop("immediate")           # like a crash: the next start runs crash recovery
        cluster.start()

Why its own cluster: restarting the shared server on 5432 would cut every other test's and
session's connections, so a test (or the soak, `scripts/soak.py`) that must restart Postgres
restarts this one. The binaries are the newest `/usr/lib/postgresql/*/bin` (Debian and Ubuntu's
layout), else `pg_config --bindir`, else `initdb` and `postgres` on PATH.

Why `postgres` runs as our child (not daemonized by `pg_ctl`): stopping it is a signal to a pid we
hold (`SIGINT` is Postgres's "fast" shutdown, `SIGQUIT` its "immediate" one, which skips the
shutdown checkpoint, so the next start recovers from the WAL as after a crash), and its end is a
`wait()`. Postgres refuses to run as root: as root, `initdb` and `postgres` run as the `postgres`
OS user (`subprocess`'s `user=`), and the directory is handed to that user.

`fsync=off`: the cluster exists for one run; a crash of Postgres loses nothing with it (committed
WAL is in the operating system's cache), only a crash of the machine would.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from tests.helpers.openai_stub import free_port

#: Signals of Postgres's shutdown modes (the postmaster's documented signals).
STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}

#: The OS user Postgres runs as when we are root.
POSTGRES_OS_USER = "postgres"


def postgres_bindir() -> Path:
    """The directory holding `initdb` and `postgres` (see the module docstring).

    Raises:
        RuntimeError: no Postgres server binaries were found.
    """
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if candidates:
        return Path(candidates[-1]).parent
    if shutil.which("pg_config"):
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if (Path(bindir) / "initdb").exists():
            return Path(bindir)
    if shutil.which("initdb") and shutil.which("postgres"):
        return Path(shutil.which("initdb")).parent
    raise RuntimeError("Postgres server binaries (initdb, postgres) were not found; install the postgresql package")


class PrivateCluster:
    """One cluster in `root` (its data directory, socket and log), listening on 127.0.0.1:`port`."""

    def __init__(self, root: Path, port: int, *, settings: dict[str, str] | None = None) -> None:
        self.root = root
        self.port = port
        self.bindir = postgres_bindir()
        self.data = root / "data"
        self.log_path = root / "postgres.log"
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "fsync": "off",
            "max_connections": "200",
            "unix_socket_directories": str(root),
            **(settings or {}),
        }
        self.process: subprocess.Popen | None = None
        self._as_user = POSTGRES_OS_USER if os.geteuid() == 0 else None

    def url(self, dbname: str = "postgres") -> str:
        """`postgresql://postgres@127.0.0.1:<port>/<dbname>` (trust auth)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def initdb(self) -> None:
        """Create the cluster (superuser `postgres`, trust auth, UTF-8).

        Raises:
            RuntimeError: initdb failed (its output in the message).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            user = pwd.getpwnam(self._as_user)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        done = subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
             "--no-sync", "--locale=C"],
            capture_output=True, text=True, user=self._as_user, cwd=self.root, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and return once it accepts connections.

        Raises:
            RuntimeError: it exited or did not answer within `timeout` seconds (the log's end in the message).
        """
        if self.running:
            return
        options = [arg for key, value in self.settings.items() for arg in ("-c", f"{key}={value}")]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), *options],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                user=self._as_user, cwd=self.root, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not accept connections within {timeout} s:\n{self.log_tail()}")
                time.sleep(0.05)

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """Shut the server down in `mode` (`smart`, `fast` or `immediate`) and wait for it; SIGKILL after `timeout`."""
        if not self.running:
            return
        self.process.send_signal(STOP_SIGNALS[mode])
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> None:
        """Stop (`mode`), stay down `down_seconds`, start again."""
        self.stop(mode)
        if down_seconds:
            time.sleep(down_seconds)
        self.start()

    def create_database(self, name: str) -> str:
        """Create database `name`; its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"


@contextmanager
def private_cluster(root: Path, *, port: int | None = None, settings: dict[str, str] | None = None) -> Iterator[PrivateCluster]:
    """initdb a cluster in `root` (an empty or missing directory; as root, its parents must be
    traversable by the `postgres` user), start it on `port` (default: a free one), yield it; stop it
    (immediate) afterwards, also on errors and Ctrl-C. `root` is left for the caller to remove."""
    cluster = PrivateCluster(root, port or free_port(), settings=settings)
    cluster.initdb()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop("immediate", timeout=20)
