"""A real PgBouncer in `pool_mode = transaction` in front of the test Postgres server, started per use.

    with pgbouncer(server_url) as url:      # same database as server_url, through PgBouncer
        psycopg.connect(url, prepare_threshold=None)

Why a real one: transaction pooling hands each transaction of a client connection to
whichever server connection is free, so everything that lives in a server session
breaks behind it: prepared statements (psycopg's `prepare_threshold=0` names them
`_pg3_0`, `_pg3_1`... per client connection, and PgBouncer 1.18 has no
protocol-level prepared statement support, so they collide or go missing), session
advisory locks (taken on one server connection, released on another) and session
`SET`s. See https://www.pgbouncer.org/features.html ("SQL feature map for pooling
modes") and langgraph#6705. A stand-in would not show any of that.

The binary comes from the Debian/Ubuntu package `pgbouncer` (scripts/test.sh
installs it when it may); without it the calling test is skipped with a message
saying so. Debian's build refuses to run as root ("PgBouncer should not run as
root"), so as root it is started with `-u <user>` (postgres, else nobody), which
drops privileges after reading its files; the temp dir is given to that user so it
can write its log and pid files.

Each instance has its own temp dir (ini, auth_file, logfile, pidfile), listens on
a free port of 127.0.0.1 only (no unix socket), and runs as a child process (not
daemonized) that is stopped with SIGTERM (PgBouncer's immediate shutdown), then
SIGKILL.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.helpers.openai_stub import free_port

#: How to get the binary, for skip messages.
INSTALL_HINT = (
    "install the Debian/Ubuntu package pgbouncer (apt-get install pgbouncer; scripts/test.sh does it as root)"
)

#: Where Debian puts the binary; /usr/sbin is not on a normal user's PATH.
DEBIAN_BINARY = Path("/usr/sbin/pgbouncer")

INI_TEMPLATE = """\
[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = {auth_file}
admin_users = {user}
max_client_conn = {max_client_conn}
default_pool_size = {pool_size}
; PgBouncer refuses startup parameters it does not know, unless they are listed here.
ignore_startup_parameters = {ignored}
logfile = {logfile}
pidfile = {pidfile}
log_connections = 0
log_disconnections = 0
"""


def pgbouncer_binary() -> str | None:
    """The path of the `pgbouncer` binary (PATH, then /usr/sbin), or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return str(DEBIAN_BINARY) if os.access(DEBIAN_BINARY, os.X_OK) else None


@contextmanager
def pgbouncer(
    server_url: str,
    *,
    pool_size: int = 20,
    max_client_conn: int = 500,
    startup_timeout: float = 10.0,
    ignore_startup_parameters: str = "extra_float_digits,options",
) -> Iterator[str]:
    """Run PgBouncer (transaction pooling) in front of the server of `server_url`; yield a URL through it.

    Args:
        server_url: a postgresql:// URL (or libpq key/value string) of the real server.
        pool_size: server connections per (database, user) pair (`default_pool_size`).
        max_client_conn: client connections PgBouncer accepts in all.
        startup_timeout: seconds to wait for the listener.
        ignore_startup_parameters: what PgBouncer accepts and drops (its own default is "extra_float_digits",
            for JDBC; psycopg sends `options` for `statement_timeout_ms`).

    Yields:
        `postgresql://<user>[:<password>]@127.0.0.1:<port>/<dbname>`: the same user and database
        as `server_url`, through PgBouncer. The admin console is the database `pgbouncer` on the
        same port (the user is in `admin_users`), e.g. for `SHOW POOLS`.

    Skips the calling test (`pytest.skip`) when the binary is not installed.

    Raises:
        RuntimeError: PgBouncer exited or did not listen within `startup_timeout`; the message
            holds its log.
    """
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(f"PgBouncer is not installed: {INSTALL_HINT}")
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    user = info.get("user") or "postgres"
    password = info.get("password") or ""
    dbname = info.get("dbname") or user
    server = psycopg.conninfo.make_conninfo(host=info.get("host") or "127.0.0.1", port=info.get("port") or 5432)
    with tempfile.TemporaryDirectory(prefix="tt-pgbouncer-") as tmp:
        workdir = Path(tmp)
        auth_file = workdir / "userlist.txt"
        # auth_type=trust skips client passwords, but PgBouncer logs in to the server with this one.
        auth_file.write_text(f"{_quoted(user)} {_quoted(password)}\n")
        run_as = _unprivileged_user()
        process, port = _start(
            binary, workdir, server, user, pool_size, max_client_conn, run_as, startup_timeout, ignore_startup_parameters
        )
        try:
            credentials = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
            yield f"postgresql://{credentials}@127.0.0.1:{port}/{quote(dbname, safe='')}"
        finally:
            _stop(process)


def _quoted(value: str) -> str:
    # auth_file syntax: "name" "password", a double quote inside doubled.
    return '"' + value.replace('"', '""') + '"'


def _unprivileged_user() -> str | None:
    """The user to pass to `-u` when we are root (Debian's PgBouncer will not run as root), else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run PgBouncer as")


def _start(
    binary: str,
    workdir: Path,
    server: str,
    user: str,
    pool_size: int,
    max_client_conn: int,
    run_as: str | None,
    startup_timeout: float,
    ignored: str,
) -> tuple[subprocess.Popen, int]:
    # free_port() can race with another process taking the port; a second port fixes that.
    last_error = ""
    for _attempt in range(3):
        port = free_port()
        ini = workdir / "pgbouncer.ini"
        logfile = workdir / "pgbouncer.log"
        ini.write_text(
            INI_TEMPLATE.format(
                server=server,
                port=port,
                auth_file=workdir / "userlist.txt",
                user=user,
                max_client_conn=max_client_conn,
                pool_size=pool_size,
                logfile=logfile,
                pidfile=workdir / "pgbouncer.pid",
                ignored=ignored,
            )
        )
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        args = [binary, *(["-u", run_as] if run_as else []), str(ini)]
        # stderr to a file we own: PgBouncer reports a logfile it cannot open only there.
        with open(workdir / "stderr.txt", "wb") as stderr:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        if _wait_listening(process, port, startup_timeout):
            return process, port
        _stop(process)
        last_error = _logs(workdir)
        if "Address already in use" not in last_error:
            break
    raise RuntimeError(f"PgBouncer did not start (exit code {process.returncode}):\n{last_error}")


def _wait_listening(process: subprocess.Popen, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _logs(workdir: Path, limit: int = 4000) -> str:
    parts = []
    for name in ("stderr.txt", "pgbouncer.log"):
        path = workdir / name
        if path.exists():
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)[-limit:]


def _stop(process: subprocess.Popen) -> None:
    # SIGTERM is PgBouncer's immediate shutdown (SIGINT would wait for clients to finish).
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
