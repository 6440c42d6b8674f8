"""A TCP proxy in a separate process, for fault injection: make a database unreachable, kill its
connections or make it hang, without touching the real server (which other tests share).

    with tcp_proxy("127.0.0.1", 5432) as proxy:
        url = proxy.url_for(pg_url)          # same database, through the proxy
        conn = psycopg.connect(url)
        proxy.stop()      # like a killed server or a failover: refused, open connections die
        proxy.start()     # reachable again, on the same port
        proxy.blackhole() # like a network partition: connects and queries hang
        proxy.cut()       # open connections die, new ones work
        proxy.stall()     # open connections stop moving data (a frozen peer); new ones work

Modes (one at a time; each control returns once it has taken effect):
    forwarding   (after start and `start()`) every connection is piped to the target.
    stopped      (`stop()`) the listener is closed, so a connect is refused at once, and every
                 open connection is aborted.
    blackholed   (`blackhole()`) the port accepts connections but nothing is forwarded or
                 answered, so a connect attempt hangs until the client's timeout; open
                 connections stop moving data too. `start()` resumes them (the partition heals):
                 nothing is lost, TCP flow control held it back.
`cut()` aborts every open connection and keeps the mode. `stall()` stops the connections open now
from moving data, both ways, and keeps the mode for new ones: what a client sees of a peer whose
kernel still acknowledges (a stopped proxy or server process) on the connections it already has,
while a new connection (the client asking, after a timeout, what became of its write) gets through.
`start()` resumes them.

Why a process and a control port: the proxy must keep working while the test process is
blocked in a synchronous driver call (a hanging connect, a query on a dead connection), so it
cannot share the test's thread or its GIL-bound event loop. Controls are lines on a second
local port (`stop`, `start`, `blackhole`, `cut`, `stall`, `status`), answered with `ok ...`; the
process prints `listening <port> control <port>` on stdout when it is ready. It uses only the
standard library (asyncio streams), so it starts in a fraction of a second.

Run alone: `python -m tests.helpers.tcp_proxy --listen-port 6543 --target 127.0.0.1:5432`
(`--listen-port 0` picks a free port; restarts reuse it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlencode

from tests.helpers import REPO_ROOT

CHUNK = 64 * 1024
COMMANDS = ("stop", "start", "blackhole", "cut", "stall", "status")


# ---- the proxy process -------------------------------------------------------------------------


class ProxyServer:
    """The asyncio side: one listener on 127.0.0.1:`listen_port`, piping to `target`."""

    def __init__(self, listen_port: int, target_host: str, target_port: int) -> None:
        self.listen_port = listen_port
        self.target = (target_host, target_port)
        self.server: asyncio.Server | None = None
        # Set while data may flow; blackhole clears it and every pipe waits on it.
        self.forwarding = asyncio.Event()
        self.forwarding.set()
        # Every open client and upstream writer, so stop/cut can abort them.
        self.writers: set[asyncio.StreamWriter] = set()
        # Per open connection, set while it may move data; stall clears the ones open at the time.
        self.gates: set[asyncio.Event] = set()
        self.clients = 0

    async def listen(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.listen_port, reuse_address=True
            )
            self.listen_port = self.server.sockets[0].getsockname()[1]

    async def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    async def cut(self) -> None:
        writers = list(self.writers)
        self.writers.clear()
        for writer in writers:
            _abort(writer)
        # abort() closes the socket on the loop's next pass (connection_lost); the control's answer must not
        # go out before that, or the test may use a connection it believes dead while it still works.
        await asyncio.gather(*(writer.wait_closed() for writer in writers), return_exceptions=True)

    async def command(self, name: str) -> str:
        if name == "stop":
            await self.stop_listening()
            await self.cut()
            self.forwarding.set()
        elif name == "start":
            await self.listen()
            self.forwarding.set()
            for gate in self.gates:
                gate.set()
        elif name == "blackhole":
            await self.listen()
            self.forwarding.clear()
        elif name == "cut":
            await self.cut()
        elif name == "stall":
            for gate in self.gates:
                gate.clear()
        elif name != "status":
            return f"error unknown command {name!r}; known: {' '.join(COMMANDS)}"
        mode = "stopped" if self.server is None else "forwarding" if self.forwarding.is_set() else "blackholed"
        return f"ok mode={mode} clients={self.clients}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients += 1
        self.writers.add(writer)
        gate = asyncio.Event()
        gate.set()
        self.gates.add(gate)
        upstream_writer = None
        try:
            await self.forwarding.wait()
            if writer not in self.writers:  # cut while waiting
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            self.writers.add(upstream_writer)
            if writer not in self.writers:
                return
            await asyncio.gather(
                self._pipe(reader, upstream_writer, gate), self._pipe(upstream_reader, writer, gate)
            )
        except OSError:
            pass  # the target refused, or a side reset: the client sees its connection close
        finally:
            self.clients -= 1
            self.gates.discard(gate)
            for w in (writer, upstream_writer):
                if w is not None:
                    self.writers.discard(w)
                    _abort(w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            while not (self.forwarding.is_set() and gate.is_set()):
                await (gate.wait() if self.forwarding.is_set() else self.forwarding.wait())
            if writer not in self.writers:
                break
            writer.write(data)
            await writer.drain()
        # Half-close, as a direct connection would; the other direction may still run.
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()


def _abort(writer: asyncio.StreamWriter) -> None:
    # abort(), not close(): no flushing, the peer sees the connection die as with a killed server.
    transport = writer.transport
    if not transport.is_closing():
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # SO_LINGER 0 makes the close a reset (RST), not an orderly FIN.
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
    transport.abort()


async def _control(proxy: ProxyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            writer.write((await proxy.command(line.decode().strip())).encode() + b"\n")
            await writer.drain()
    finally:
        writer.close()


async def serve(listen_port: int, target_host: str, target_port: int) -> None:
    proxy = ProxyServer(listen_port, target_host, target_port)
    await proxy.listen()
    control = await asyncio.start_server(lambda r, w: _control(proxy, r, w), "127.0.0.1", 0)
    print(f"listening {proxy.listen_port} control {control.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TCP proxy with a control port, for fault-injection tests.")
    parser.add_argument("--listen-port", type=int, required=True, help="port on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--target", required=True, help="host:port to forward to")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    asyncio.run(serve(args.listen_port, host.strip("[]"), int(port)))


# ---- the test side ----------------------------------------------------------------------------


class Proxy:
    """Handle on a running proxy process: its `port` and the controls, each returning once done.

    Raises (every control):
        RuntimeError: the proxy answered with an error or is not running.
    """

    def __init__(self, port: int, control_port: int) -> None:
        self.port = port
        self.control_port = control_port

    def url_for(self, pg_url: str) -> str:
        """`pg_url` (a postgresql:// URL or libpq key/value string) as a postgresql:// URL whose host
        and port are the proxy's (127.0.0.1:`port`); user, password, database and the other
        parameters (as query parameters) are kept."""
        from psycopg.conninfo import conninfo_to_dict  # not at the top: the proxy process never needs it

        info = {k: str(v) for k, v in conninfo_to_dict(pg_url).items()}
        for key in ("host", "hostaddr", "port"):
            info.pop(key, None)
        user, password, dbname = info.pop("user", ""), info.pop("password", ""), info.pop("dbname", "")
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
        url = f"postgresql://{auth + '@' if auth else ''}127.0.0.1:{self.port}/{quote(dbname, safe='')}"
        return url + ("?" + urlencode(info) if info else "")

    def stop(self) -> str:
        """Close the listener (connects are refused) and abort every open connection."""
        return self._send("stop")

    def start(self) -> str:
        """Listen again on the same port and forward; blackholed connections resume."""
        return self._send("start")

    def blackhole(self) -> str:
        """Accept connections but forward and answer nothing; open connections stall too."""
        return self._send("blackhole")

    def cut(self) -> str:
        """Abort every open connection; keep listening in the current mode."""
        return self._send("cut")

    def stall(self) -> str:
        """Stop the connections open now from moving data (held, not lost); new ones are served as the mode says."""
        return self._send("stall")

    def status(self) -> str:
        """`ok mode=<forwarding|stopped|blackholed> clients=<open client connections>`."""
        return self._send("status")

    def _send(self, command: str) -> str:
        try:
            with socket.create_connection(("127.0.0.1", self.control_port), timeout=10) as sock:
                sock.sendall(command.encode() + b"\n")
                answer = sock.makefile("rb").readline().decode().strip()
        except OSError as exc:
            raise RuntimeError(f"the TCP proxy did not answer {command!r}: {exc}") from exc
        if not answer.startswith("ok"):
            raise RuntimeError(f"the TCP proxy refused {command!r}: {answer or 'no answer'}")
        return answer


@contextmanager
def tcp_proxy(target_host: str, target_port: int, *, startup_timeout: float = 10.0) -> Iterator[Proxy]:
    """Run a proxy process on a free port of 127.0.0.1 in front of `target_host`:`target_port`,
    forwarding; yield its `Proxy`; stop the process afterwards (SIGTERM, then SIGKILL).

    Raises:
        RuntimeError: the process exited or did not report ready within `startup_timeout` seconds.
    """
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.tcp_proxy", "--listen-port", "0",
             "--target", f"{target_host}:{target_port}"],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            line = _read_line(process, startup_timeout)
            parts = line.split()
            if len(parts) != 4 or parts[0] != "listening":
                stderr.seek(0)
                raise RuntimeError(f"the TCP proxy did not start ({line!r}):\n{stderr.read().decode(errors='replace')}")
            yield Proxy(int(parts[1]), int(parts[3]))
        finally:
            _stop(process)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().decode().strip()


def _stop(process: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            break
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    process.stdout.close()


if __name__ == "__main__":
    main()
