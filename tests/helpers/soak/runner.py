"""One soak run from start to verdict, and its summary.

`run(options)`: a temporary directory; in it a private Postgres cluster with the soak database
(set up once, as a deployment would before starting replicas); the fleet (`soak.fleet`); one
shared thread per user; then the clients and the fault injector for `minutes`. At the end the
faults stop and everything broken is mended (the cluster up, every server answering), the
clients finish the op in hand (retrying it to an answer), the servers' sweepers get up to 30 s
to sweep the threads given a ttl, every server is stopped, and `soak.checks.check_run` compares
the ledger with the tables. The directory (cluster, logs) is removed at the end, also on
errors and Ctrl-C, unless `keep` is set.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from agent import create_agent
from tests.helpers.private_postgres import private_cluster
from tests.helpers.soak.checks import SHOWN, Check, Verdict, check_retention, check_run, round_trip_targets
from tests.helpers.soak.faults import FaultInjector
from tests.helpers.soak.fleet import fleet
from tests.helpers.soak.ledger import OTHER_WRITE_KINDS, TURN_KINDS, Ledger
from tests.helpers.soak.snapshot import Snapshot
from tests.helpers.soak.workload import Client

#: Seconds the servers' sweepers get, after the clients stopped, to sweep the threads given a ttl.
SWEEP_WAIT = 30.0


@dataclass
class Options:
    minutes: float = 10.0
    servers: int = 3
    clients: int = 8
    fault_interval: float = 2.5
    model_latency: float = 0.3
    ttl_strategy: str = "keep_latest"
    seed: int | None = None
    min_faults: int = 0
    keep: bool = False
    retry_seconds: float = 120.0
    fault_kinds: dict[str, float] | None = None


@dataclass
class Report:
    options: Options
    seconds: float
    ledger: Ledger
    verdict: Verdict
    problems: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    kept: Path | None = None

    @property
    def unresolved(self) -> int:
        return sum(1 for op in self.ledger.ops if op.outcome == "unresolved" and not op.late)

    @property
    def passed(self) -> bool:
        faults = sum(self.ledger.faults.values())
        return (
            self.verdict.ok
            and not self.problems
            and not self.unresolved
            and not self.ledger.server_errors
            and not self.log_lines
            and faults >= self.options.min_faults
        )


def run(options: Options) -> Report:
    """One soak (module docstring); its report. Raises only when the soak itself cannot run (a process that did not start)."""
    seed = options.seed = options.seed if options.seed is not None else int(time.time())
    ledger = Ledger(uuid.uuid4().hex[:6])
    root = Path(tempfile.mkdtemp(prefix="tt-soak-"))
    root.chmod(0o711)  # the cluster's directory inside is the postgres OS user's when we are root
    problems: list[str] = []
    try:
        with private_cluster(root / "pg") as cluster:
            database_url = cluster.create_database("soak")
            create_agent(database_url, model="offline", tracing=False).close()  # set up before the replicas start
            (root / "run").mkdir()
            with fleet(root / "run", pg_port=cluster.port, database_url=database_url, servers=options.servers,
                       model_latency=options.model_latency, ttl_strategy=options.ttl_strategy) as processes:  # fmt: skip
                stop = threading.Event()
                # Four clients per user: turns on a user's shared thread then often overlap.
                users = [f"soak-user-{i}" for i in range(max(1, (options.clients + 3) // 4))]
                shared = {user: shared_thread(user, processes.urls, ledger, stop, seed) for user in users}
                clients = [
                    Client(i, users[i % len(users)], processes.urls, ledger, stop, shared_threads=[shared[users[i % len(users)]]],
                           seed=seed + i + 1, retry_seconds=options.retry_seconds)
                    for i in range(options.clients)
                ]  # fmt: skip
                injector = FaultInjector(processes, cluster, "soak", ledger, stop, interval=options.fault_interval,
                                         seed=seed, kinds=options.fault_kinds)  # fmt: skip
                started = time.monotonic()  # the soak proper: from the first client to the last sweep
                for client in clients:
                    client.start()
                injector.start()
                stop.wait(options.minutes * 60)
                stop.set()
                injector.join()
                problems += [f"fault injection: {e}" for e in injector.errors]
                for client in clients:
                    client.join(options.retry_seconds + 60)
                    if client.is_alive():
                        problems.append(f"{client.name} did not finish its last op")
                    if client.crashed is not None:
                        problems.append(f"{client.name} crashed: {type(client.crashed).__name__}: {client.crashed}")
                wait_for_sweeps(database_url, ledger, options.ttl_strategy)
                seconds = time.monotonic() - started
            log_lines = [f"server {s.index}: {line}" for s in processes.servers for line in s.bad_log_lines()]
            verdict = check_run(ledger, database_url, ttl_strategy=options.ttl_strategy,
                                round_trip_targets=round_trip_targets(cluster.create_database, root))  # fmt: skip
        report = Report(options, seconds, ledger, verdict, problems, log_lines, kept=root if options.keep else None)
        if options.keep:
            (root / "summary.txt").write_text(format_summary(report) + "\n")
        return report
    finally:
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)


def shared_thread(user_id: str, urls: Any, ledger: Ledger, stop: threading.Event, seed: int) -> str:
    """A thread every client of `user_id` turns on, started before the faults.

    Raises:
        RuntimeError: its first turn did not land.
    """
    client = Client(-1, user_id, urls, ledger, stop, shared_threads=[], seed=seed)
    thread_id = client.op_new_thread()
    client.http.close()
    if thread_id is None:
        raise RuntimeError(f"the shared thread of {user_id} could not be started")
    ledger.books[thread_id].kind = "shared"
    return thread_id


def wait_for_sweeps(database_url: str, ledger: Ledger, ttl_strategy: str) -> None:
    """Until every thread given a ttl is swept, or `SWEEP_WAIT` seconds."""
    deadline = time.monotonic() + SWEEP_WAIT
    while time.monotonic() < deadline:
        with psycopg.connect(database_url) as conn:
            snap = Snapshot.read(conn)
        check = Check("retention")
        check_retention(ledger, snap, ttl_strategy, check)
        if check.ok:
            return
        time.sleep(0.5)


def format_summary(report: Report) -> str:
    """The summary printed at the end (its format is described in docs/reliability.md)."""
    o, ledger, verdict = report.options, report.ledger, report.verdict
    ops = ledger.ops
    lines = [
        f"soak: {report.seconds / 60:.1f} min, {o.servers} servers, {o.clients} clients, one Postgres, "
        f"model: OpenAI stub ({o.model_latency:g} s), retention {o.ttl_strategy}, seed {o.seed}",
    ]

    def outcome_line(label: str, kinds: tuple[str, ...]) -> None:
        chosen = [op for op in ops if op.kind in kinds]
        landed = [op for op in chosen if op.outcome == "landed"]
        late = [op for op in chosen if op.outcome != "landed" and op.late]
        refused = Counter(op.reason for op in chosen if op.outcome == "refused" and not op.late)
        unresolved = Counter(op.reason for op in chosen if op.outcome == "unresolved" and not op.late)
        interrupted = sum(1 for op in landed if op.status == "interrupted")
        lines.append(f"{label:<18}{len(chosen):>7}   " + ", ".join(f"{k} {sum(1 for op in chosen if op.kind == k)}" for k in kinds))
        lines.append(f"  landed          {len(landed):>7}" + (f"   ({interrupted} interrupted)" if interrupted else ""))
        lines.append(f"  landed late     {len(late):>7}   (the client gave up; its key's result was stored)")
        lines.append(f"  refused         {sum(refused.values()):>7}   {_counts(refused)}")
        lines.append(f"  unresolved      {sum(unresolved.values()):>7}   {_counts(unresolved)}")
        # The refusals that are not the shared threads' races (busy under reject, rolled back): an example each.
        odd = {}
        for op in chosen:
            if op.outcome == "refused" and not op.late and op.reason not in ("ThreadBusy", "TurnCancelled"):
                odd.setdefault((op.kind, op.reason), f"    {op.kind} {op.id}: {op.reason}: {op.extra.get('message', '')}")
        lines.extend(list(odd.values())[:SHOWN])

    outcome_line("turns tried", TURN_KINDS)
    outcome_line("other writes", OTHER_WRITE_KINDS)
    lines += [
        f"reads             {sum(ledger.reads.values()):>7}   {_counts(ledger.reads)}",
        f"faults injected   {sum(ledger.faults.values()):>7}   {_counts(ledger.faults)}",
        f"retries           {sum(ledger.retries.values()):>7}   {_counts(ledger.retries)}",
        f"server errors     {sum(ledger.server_errors.values()):>7}   (5xx other than 503) {_counts(ledger.server_errors)}",
        f"lost              {verdict.lost:>7}",
        f"duplicated        {verdict.duplicated:>7}",
        f"written, refused  {verdict.written_though_refused:>7}",
        f"stale claim rows  {verdict.stale_claims:>7}   (first turns killed before their commit; not data)",
    ]
    for example in list(ledger.server_error_examples.values())[:SHOWN]:
        lines.append(f"    {example}")
    for check in verdict.checks:
        lines.append(f"check {check.name:<12} {'ok' if check.ok else f'FAILED ({len(check.problems)})'}   {check.detail}")
        lines += [f"    {problem}" for problem in check.problems[:SHOWN]]
    for problem in report.problems[:SHOWN]:
        lines.append(f"problem: {problem[:300]}")
    if report.log_lines:
        lines.append(f"server logs: {len(report.log_lines)} lines with a 5xx or a traceback")
        lines += [f"    {line[:1500]}" for line in report.log_lines[:SHOWN]]
    if report.kept:
        lines.append(f"kept: {report.kept}")
    lines.append(f"result: {'PASS' if report.passed else 'FAIL'}")
    return "\n".join(lines)


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k} {n}" for k, n in counter.most_common()) or "-"
