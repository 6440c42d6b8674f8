"""The soak's fault injector: a thread that breaks something every few seconds, at random.

| Kind | What it does |
|---|---|
| `server_kill` | `kill -9` of one server's process group (never the last one answering); it is started again 0-2 s later, on its port |
| `pg_restart` | the private cluster shut down `fast` or `immediate` (a crash: the next start recovers from the WAL), down 0-2 s, started again |
| `pg_cut` | every server's database connection cut at once (the Postgres proxy resets them) |
| `pg_terminate` | `pg_terminate_backend` of every connection to the soak database (the server ends them, as a failover or an admin would) |
| `pg_stall` | the Postgres proxy stops forwarding for 0.5-2 s (queries and connects hang), then resumes |
| `client_cut` | every client connection of one server dropped mid-request (its front proxy resets them) |

Clients add their own `client_abort` (`soak.workload`). Faults are spaced `interval` seconds
apart on average (uniform between half and one and a half times it).
"""

from __future__ import annotations

import random
import threading
import time

import psycopg

from tests.helpers.private_postgres import PrivateCluster
from tests.helpers.soak.fleet import Fleet
from tests.helpers.soak.ledger import Ledger

#: Attempts to start a killed server again before the soak reports it.
RESTART_ATTEMPTS = 10

#: Relative weights of the fault kinds.
WEIGHTS = {"server_kill": 3, "pg_restart": 1.5, "pg_cut": 2, "pg_terminate": 1, "pg_stall": 0.7, "client_cut": 3}


class FaultInjector(threading.Thread):
    """Injects faults into `fleet` and `cluster` until `stop` is set; counts them in `ledger.faults`."""

    def __init__(
        self,
        fleet: Fleet,
        cluster: PrivateCluster,
        dbname: str,
        ledger: Ledger,
        stop: threading.Event,
        *,
        interval: float,
        seed: int,
        kinds: dict[str, float] | None = None,
    ) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self.fleet = fleet
        self.cluster = cluster
        self.dbname = dbname
        self.ledger = ledger
        self.stop = stop
        self.interval = interval
        self.rng = random.Random(seed)
        self.kinds = dict(kinds or WEIGHTS)
        self.restarts: list[threading.Thread] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.interval * self.rng.uniform(0.5, 1.5)):
            kind = self.rng.choices(list(self.kinds), list(self.kinds.values()))[0]
            try:
                if getattr(self, kind)():
                    self.ledger.count_fault(kind)
            except Exception as exc:  # noqa: BLE001 - a fault that failed to inject is reported, the soak goes on
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        self.settle()

    def settle(self) -> None:
        """Undo what is still broken: the cluster up, the proxy forwarding, every server started again."""
        self.cluster.start()
        self.fleet.pg_proxy.start()
        for thread in self.restarts:
            thread.join()
        for server in self.fleet.servers:
            if not server.alive:
                self._restart(server, 0)

    # -- the faults (each returns whether it was injected) ----------------------------------------
    def server_kill(self) -> bool:
        alive = [s for s in self.fleet.servers if s.alive]
        if len(alive) < 2:
            return False
        victim = self.rng.choice(alive)
        victim.kill()
        delay = self.rng.uniform(0, 2)
        thread = threading.Thread(target=self._restart, args=(victim, delay), name=f"soak-restart-{victim.index}", daemon=True)
        thread.start()
        self.restarts = [t for t in self.restarts if t.is_alive()] + [thread]
        return True

    def _restart(self, server, delay: float) -> None:
        """Start `server` again after `delay` s; a start that fails (the database is down just then: the
        server refuses to start without it) is tried again, as a process supervisor would."""
        self.stop.wait(delay)
        for attempt in range(RESTART_ATTEMPTS):
            try:
                server.start()
                return
            except RuntimeError as exc:
                self.ledger.count_retry("server start failed")
                last = str(exc).splitlines()[0]
                time.sleep(1 + attempt)
        self.errors.append(f"server {server.index} did not start again in {RESTART_ATTEMPTS} attempts: {last} (its log: server-{server.index}.log)")

    def pg_restart(self) -> bool:
        self.cluster.restart(self.rng.choice(["fast", "immediate"]), down_seconds=self.rng.uniform(0, 2))
        return True

    def pg_cut(self) -> bool:
        self.fleet.pg_proxy.cut()
        return True

    def pg_terminate(self) -> bool:
        with psycopg.connect(self.cluster.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.dbname,),
            )
        return True

    def pg_stall(self) -> bool:
        self.fleet.pg_proxy.blackhole()
        self.stop.wait(self.rng.uniform(0.5, 2))
        self.fleet.pg_proxy.start()
        return True

    def client_cut(self) -> bool:
        self.rng.choice(self.fleet.servers).front.cut()
        return True
