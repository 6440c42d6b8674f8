"""The chaos soak (scripts/soak.py): its end checks catch what they look for, and a short run passes.

The checks are tried on a database where the fault is planted by hand (a turn run again without
its key, a told checkpoint gone, a refused turn's text stored, a blob nobody names): each is
caught and counted, and the unspoiled database passes. Then the script itself runs for about 35
seconds, with fewer servers, clients and faults than its 10-minute default, and must pass. The
Postgres it restarts is a private cluster of its own, never the shared server, so it runs beside
the other tests (not `serial`: alone, its minute would add to the suite's wall time).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest

from agent import create_agent
from tests.helpers import REPO_ROOT
from tests.helpers.databases import fresh_database
from tests.helpers.private_postgres import postgres_bindir
from tests.helpers.scenario import outputs, request
from tests.helpers.soak.checks import check_run
from tests.helpers.soak.ledger import Ledger, Op, ThreadBook

SOAK_SCRIPT = REPO_ROOT / "scripts" / "soak.py"


@pytest.fixture
def soak_db(pg_server_url):
    """A database of its own: the checks read every row of it."""
    with fresh_database(pg_server_url, prefix="tt_soak") as url:
        yield url


def _turn(agent, ledger: Ledger, thread_id: str | None, *, keyed: bool = True, landed: bool = True) -> Op:
    """One turn as a soak client takes it, booked as told (or as refused)."""
    op = ledger.new_op("turn" if thread_id else "new_thread", "alice", thread_id, keyed=keyed, text=True)
    body = request(f"{op.tag} Where am I going?", user_id="alice", thread_id=thread_id, idempotency_key=op.key)
    got = outputs(agent.predict(body))
    op.thread_id = got["thread_id"]
    if not landed:
        op.outcome, op.reason = "refused", "TurnCancelled"
        return op
    op.outcome, op.checkpoint_id = "landed", got["checkpoint_id"]
    if thread_id is None:
        ledger.add_book(ThreadBook(op.thread_id, "alice", "own", "turn", base={got["parent_checkpoint_id"]}))
    ledger.tell(op, moves_head=True)
    return op


def _told_thread(url: str) -> tuple[Ledger, list[Op]]:
    ledger = Ledger("t")
    with create_agent(url, model="offline", tracing=False) as agent:
        first = _turn(agent, ledger, None)
        second = _turn(agent, ledger, first.thread_id)
    return ledger, [first, second]


def _verdict(ledger: Ledger, url: str, tmp_path):
    return check_run(ledger, url, ttl_strategy="delete", round_trip_targets={"sqlite": f"sqlite:///{tmp_path / 'rt.sqlite'}"})


def _failed(verdict) -> dict[str, list[str]]:
    return {check.name: check.problems for check in verdict.checks if not check.ok}


def test_a_thread_that_holds_exactly_what_its_client_was_told_passes_every_check(soak_db, tmp_path):
    ledger, _ = _told_thread(soak_db)
    verdict = _verdict(ledger, soak_db, tmp_path)
    assert _failed(verdict) == {}
    assert (verdict.lost, verdict.duplicated, verdict.written_though_refused) == (0, 0, 0)
    assert verdict.ok


def test_a_turn_run_again_without_its_key_is_counted_duplicated(soak_db, tmp_path):
    ledger, (_, second) = _told_thread(soak_db)
    with create_agent(soak_db, model="offline", tracing=False) as agent:  # the retry that ran the turn again
        agent.predict(request(f"{second.tag} Where am I going?", user_id="alice", thread_id=second.thread_id))
    verdict = _verdict(ledger, soak_db, tmp_path)
    assert verdict.duplicated == 1 and not verdict.ok
    assert any(f"repeats turn {second.id}" in p for p in _failed(verdict)["ledger"])


def test_a_told_checkpoint_that_is_gone_is_counted_lost(soak_db, tmp_path):
    ledger, (first, second) = _told_thread(soak_db)
    with psycopg.connect(soak_db, autocommit=True) as conn:
        conn.execute("DELETE FROM checkpoints WHERE checkpoint_id = %s", (first.checkpoint_id,))
    verdict = _verdict(ledger, soak_db, tmp_path)
    assert verdict.lost == 1
    failed = _failed(verdict)
    assert any(f"lost: new_thread {first.id}" in p for p in failed["ledger"])
    assert any("not in the thread" in p for p in failed["tree"])  # the second turn's parent is gone too


def test_the_text_of_a_refused_turn_found_in_the_tables_is_counted(soak_db, tmp_path):
    ledger, (first, _) = _told_thread(soak_db)
    with create_agent(soak_db, model="offline", tracing=False) as agent:
        refused = _turn(agent, ledger, first.thread_id, keyed=False, landed=False)
    verdict = _verdict(ledger, soak_db, tmp_path)
    assert verdict.written_though_refused >= 1 and not verdict.ok
    assert any(refused.id in p for p in _failed(verdict)["ledger"])


def test_a_blob_no_checkpoint_names_is_an_orphan(soak_db, tmp_path):
    ledger, (first, _) = _told_thread(soak_db)
    with psycopg.connect(soak_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
            "VALUES (%s, '', 'messages', 'no-such-version', 'empty', NULL)",
            (first.thread_id,),
        )
    failed = _failed(_verdict(ledger, soak_db, tmp_path))
    assert list(failed) == ["orphans"]
    assert "no checkpoint names it" in failed["orphans"][0]


@pytest.mark.slow
@pytest.mark.longest  # about 50 s of one worker: the soak runs for 0.6 minutes
def test_a_short_soak_loses_and_duplicates_nothing():
    try:
        postgres_bindir()
    except RuntimeError as exc:  # pragma: no cover - a machine without the Postgres server binaries
        pytest.skip(str(exc))
    command = [sys.executable, str(SOAK_SCRIPT), "--minutes", "0.6", "--servers", "2", "--clients", "4",
               "--fault-interval", "3", "--ttl-strategy", "delete", "--seed", "22", "--min-faults", "8"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env={**os.environ})
    summary = done.stdout
    assert done.returncode == 0, f"{summary}\n{done.stderr[-3000:]}"
    assert summary.rstrip().endswith("result: PASS")
    assert re.search(r"^lost +0$", summary, re.M) and re.search(r"^duplicated +0$", summary, re.M)
    faults = re.search(r"^faults injected +(\d+) +(.*)$", summary, re.M)
    assert faults and int(faults.group(1)) >= 8
    landed = re.search(r"^turns tried +(\d+).*\n +landed +(\d+)", summary, re.M)
    assert landed and int(landed.group(2)) > 20
    assert all(f"check {name}" in summary for name in ("tree", "orphans", "ledger", "round trip"))
