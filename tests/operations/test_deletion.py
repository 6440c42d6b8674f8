"""Deletion, on Postgres and SQLite.

`delete_thread` removes every row of a thread from every table: checkpoints,
blobs and writes (Postgres: checkpoints, checkpoint_blobs, checkpoint_writes;
SQLite: checkpoints, writes), its owner record (agent_threads) and its claim
row (agent_claims), also one a crashed process left behind. `delete_user_data` does that for every thread a
user owns, also the thread of a turn that was running for the user when it started, and no turn for the
user starts while it runs. Both are also actions, and both respect ownership.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent.errors import InvalidRequest, ThreadNotFound, UserBeingDeleted
from agent.storage import UserClaim
from tests.helpers.claims import other_replica_holds
from tests.helpers.reliability import HANG_TIMEOUT, all_rows, gated_model, head_messages, thread_rows, user_texts
from tests.helpers.scenario import outputs, say
from tests.helpers.stored_values import begun_before_the_upgrade

DANGLING_CALL = {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "1"}'}


def make_thread(agent, user_id: str | None, label: str) -> str:
    """A thread with turns, a branch, a tool turn and a state update, so that every table has rows; begun before
    the upgrade that stores messages in the checkpoint rows, so that blob rows are among them."""
    first = outputs(say(agent, f"{label}: I'm headed to SF!", user_id=user_id))
    thread_id = first["thread_id"]
    begun_before_the_upgrade(agent, thread_id)
    say(agent, "calculate 6*7", thread_id=thread_id, user_id=user_id)
    say(agent, "New York instead", thread_id=thread_id, user_id=user_id, checkpoint_id=first["checkpoint_id"])
    agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL], user_id=user_id)
    return thread_id


# Unique per test: the Postgres database is shared by the session, and delete_user_data
# would otherwise also find the threads other tests wrote as "alice".
@pytest.fixture
def alice() -> str:
    return f"alice-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bob() -> str:
    return f"bob-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def threads(agent, backend_url, alice, bob):
    """alice owns two threads, bob one, and one is anonymous; every table holds rows of each."""
    made = {
        "alice 1": make_thread(agent, alice, "alice 1"),
        "alice 2": make_thread(agent, alice, "alice 2"),
        "bob": make_thread(agent, bob, "bob"),
        "anonymous": make_thread(agent, None, "anonymous"),
    }
    for thread_id in made.values():
        rows = thread_rows(backend_url, thread_id)
        # Every table holds rows of the thread, or the test would prove little (idempotency
        # records exist only for requests that carry an idempotency_key).
        assert all(count > 0 for table, count in rows.items() if table != "agent_idempotency"), rows
    return made


def rows_of(url: str, threads: dict[str, str]) -> dict[str, dict[str, int]]:
    return {name: thread_rows(url, thread_id) for name, thread_id in threads.items()}


def gone(rows: dict[str, int]) -> bool:
    return all(count == 0 for count in rows.values())


def test_delete_thread_removes_every_row_of_that_thread_and_nothing_else(agent, backend_url, threads, alice, bob):
    before = rows_of(backend_url, threads)

    agent.delete_thread(threads["alice 1"], user_id=alice)

    after = rows_of(backend_url, threads)
    assert gone(after["alice 1"]), after["alice 1"]
    assert {k: v for k, v in after.items() if k != "alice 1"} == {k: v for k, v in before.items() if k != "alice 1"}
    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_history(threads["alice 1"], user_id=alice)
    # The id can be used again, for a new, empty thread: nothing of the old one comes back.
    say(agent, "fresh start", thread_id=threads["alice 1"], user_id=bob)
    assert user_texts(head_messages(agent, threads["alice 1"])) == ["fresh start"]


def test_delete_user_data_removes_every_thread_of_the_user_and_nothing_else(agent, backend_url, threads, alice, bob):
    before = rows_of(backend_url, threads)

    deleted = agent.delete_user_data(alice)

    assert deleted == sorted([threads["alice 1"], threads["alice 2"]])
    after = rows_of(backend_url, threads)
    assert gone(after["alice 1"]) and gone(after["alice 2"])
    assert after["bob"] == before["bob"] and after["anonymous"] == before["anonymous"]
    assert agent.delete_user_data(alice) == []
    assert agent.get_checkpoint_history(threads["bob"], user_id=bob)


def test_deletion_actions_remove_the_rows_too(agent, backend_url, threads, alice, bob):
    before = rows_of(backend_url, threads)
    out = agent.predict(
        {"input": [], "custom_inputs": {"action": "delete_thread", "thread_id": threads["bob"], "user_id": bob}}
    )
    assert outputs(out) == {"thread_id": threads["bob"], "deleted": True}
    assert gone(thread_rows(backend_url, threads["bob"]))

    events = list(agent.predict_stream({"input": [], "custom_inputs": {"action": "delete_user_data", "user_id": alice}}))
    assert events[-1].custom_outputs["deleted_thread_ids"] == sorted([threads["alice 1"], threads["alice 2"]])
    after = rows_of(backend_url, threads)
    assert gone(after["alice 1"]) and gone(after["alice 2"])
    assert after["anonymous"] == before["anonymous"]

    anonymous = {"action": "delete_thread", "thread_id": threads["anonymous"]}
    agent.predict({"input": [], "context": {}, "custom_inputs": anonymous})
    assert gone(thread_rows(backend_url, threads["anonymous"]))


@pytest.mark.parametrize("intruder", ["other user", "anonymous"])
def test_nobody_deletes_someone_elses_thread(agent, backend_url, threads, intruder, bob):
    intruder = bob if intruder == "other user" else None
    before = all_rows(backend_url)
    action = {"action": "delete_thread", "thread_id": threads["alice 1"]}
    if intruder is not None:
        action["user_id"] = intruder
    attempts = [
        lambda: agent.delete_thread(threads["alice 1"], user_id=intruder),
        lambda: agent.predict({"input": [], "custom_inputs": action}),
        lambda: list(agent.predict_stream({"input": [], "custom_inputs": action})),
    ]
    for attempt in attempts:
        with pytest.raises(ThreadNotFound):
            attempt()
    assert all_rows(backend_url) == before


def test_delete_user_data_needs_a_user_id(agent, backend_url, threads):
    before = all_rows(backend_url)
    with pytest.raises(InvalidRequest):
        agent.predict({"input": [], "custom_inputs": {"action": "delete_user_data"}})
    with pytest.raises(InvalidRequest):
        agent.delete_user_data(None)
    assert all_rows(backend_url) == before


def test_deleting_a_thread_also_removes_a_claim_left_by_a_crashed_process(agent, backend_url):
    thread_id = make_thread(agent, "alice", "alice")
    # A process that died mid-turn leaves its claim behind until the lease expires.
    with other_replica_holds(backend_url, thread_id, seconds=-1):
        assert thread_rows(backend_url, thread_id)["agent_claims"] == 1
        agent.delete_thread(thread_id, user_id="alice")
        assert gone(thread_rows(backend_url, thread_id))


# -- deleting a user's data while the user's turns run ------------------------------------------------------
def test_delete_user_data_also_deletes_the_thread_of_a_turn_that_was_running_and_refuses_new_ones(
    backend_url, make_agent, alice, bob
):
    # The race: a turn of alice's on a new thread is inside the model (its thread has no record yet)
    # when delete_user_data(alice) starts. The deletion used to list alice's threads, miss it and
    # return; then the turn committed, and alice had a thread after her data was deleted.
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    existing = outputs(say(agent, "an older thread", user_id=alice))["thread_id"]
    settled = threading.Event()  # the deletion finished, or found a thread busy and waits for it
    original = agent.storage._try_claim

    def watched(thread_id, token, **options):
        attempt = original(thread_id, token, **options)
        if attempt[0] is None and threading.current_thread().name == "deletion":
            settled.set()
        return attempt

    agent.storage._try_claim = watched

    def delete() -> list[str]:
        threading.current_thread().name = "deletion"
        try:
            return agent.delete_user_data(alice)
        finally:
            settled.set()

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(say, agent, "block here: a new thread", user_id=alice)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            deletion = pool.submit(delete)
            assert settled.wait(HANG_TIMEOUT)
            assert not deletion.done(), "the deletion ended while a turn of the user was still running"
            # Meanwhile no new turn for alice starts (nothing written), nor a second deletion;
            # other users are not held up.
            before = agent.list_threads(user_id=alice)
            with pytest.raises(UserBeingDeleted) as refused:
                say(agent, "a turn during the deletion", user_id=alice)
            assert refused.value.ids["user_id"] == alice
            with pytest.raises(UserBeingDeleted):
                say(agent, "on the older thread", user_id=alice, thread_id=existing)
            with pytest.raises(UserBeingDeleted):
                agent.delete_user_data(alice)
            assert agent.list_threads(user_id=alice) == before
            assert outputs(say(agent, "bob is not held up", user_id=bob))["thread_id"]
        finally:
            model.gate.set()
        new_thread = outputs(running.result(timeout=HANG_TIMEOUT))["thread_id"]
        deleted = deletion.result(timeout=HANG_TIMEOUT)

    assert sorted(deleted) == sorted([existing, new_thread])
    assert agent.list_threads(user_id=alice) == []
    rows = thread_rows(backend_url, new_thread)
    assert all(count == 0 for count in rows.values()), rows
    # The deletion is over: alice can start again.
    again = outputs(say(agent, "after the deletion", user_id=alice))["thread_id"]
    assert [t["thread_id"] for t in agent.list_threads(user_id=alice)] == [again]


def test_a_deletion_whose_process_died_frees_the_user_when_its_lease_expires(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    held = UserClaim(alice, "a-dead-process")
    assert agent.storage._claim_user(held, 600)
    with pytest.raises(UserBeingDeleted):
        say(agent, "while the dead process's claim is unexpired", user_id=alice)
    assert agent.storage._claim_user(held, -1)  # what time does to it: expired
    assert outputs(say(agent, "after it expired", user_id=alice))["thread_id"]
    assert agent.delete_user_data(alice)
