"""Per-thread concurrency control, on Postgres and SQLite.

Without it, two turns that start from the same head both commit, and one user
message silently disappears from the thread. Here every turn either lands whole
or is refused with ThreadBusy (`reject`), or waits its turn (`enqueue`), also
across processes; and turns on different threads never wait for each other.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent.errors import AgentError, ThreadBusy
from agent.models import OfflineChatModel
from tests.helpers.claims import other_replica_waits
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    Child,
    assert_each_user_message_followed_by_its_reply,
    assert_linear_chain,
    gated_model,
    head_messages,
    release_together,
    user_texts,
)
from tests.helpers.scenario import outputs, say

N_TURNS = 16


def send_at_once(agent, thread_id: str, texts: list[str], **custom_inputs) -> list:
    """Send one turn per text to the thread, all released by one barrier; each result or its AgentError."""
    barrier = threading.Barrier(len(texts))

    def send(text: str):
        barrier.wait()
        try:
            return say(agent, text, thread_id=thread_id, **custom_inputs)
        except AgentError as exc:
            return exc

    with ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(send, texts))


def start_thread(agent) -> tuple[str, str]:
    first = outputs(say(agent, "start"))
    return first["thread_id"], first["checkpoint_id"]


def test_simultaneous_turns_under_reject_land_whole_or_are_refused(backend_url, make_agent):
    agent = make_agent(backend_url, model=OfflineChatModel(latency_ms=50))
    thread_id, start = start_thread(agent)
    texts = [f"turn {n:02d}" for n in range(N_TURNS)]

    results = send_at_once(agent, thread_id, texts)

    errors = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(e, ThreadBusy) for e in errors), errors
    landed = {text: outputs(r) for text, r in zip(texts, results) if not isinstance(r, Exception)}
    assert landed, "no turn succeeded"
    assert errors, "no turn was refused, so the turns did not overlap"
    messages = head_messages(agent, thread_id)
    # Every committed turn is in the head's history, nothing of a refused one is.
    assert sorted(user_texts(messages)) == sorted(["start", *landed])
    assert_each_user_message_followed_by_its_reply(messages)
    assert_linear_chain(start, [(o["parent_checkpoint_id"], o["checkpoint_id"]) for o in landed.values()])


@pytest.mark.parametrize("where", ["agent setting", "request"])
def test_simultaneous_turns_under_enqueue_all_land_one_after_another(backend_url, make_agent, where):
    if where == "agent setting":
        agent = make_agent(backend_url, model=OfflineChatModel(latency_ms=50), multitask_strategy="enqueue")
        custom = {}
    else:
        agent = make_agent(backend_url, model=OfflineChatModel(latency_ms=50))
        custom = {"multitask_strategy": "enqueue"}
    thread_id, start = start_thread(agent)
    texts = [f"turn {n:02d}" for n in range(N_TURNS)]

    results = send_at_once(agent, thread_id, texts, **custom)

    assert not [r for r in results if isinstance(r, Exception)]
    messages = head_messages(agent, thread_id)
    assert sorted(user_texts(messages)) == sorted(["start", *texts])
    assert_each_user_message_followed_by_its_reply(messages)
    assert_linear_chain(start, [(outputs(r)["parent_checkpoint_id"], outputs(r)["checkpoint_id"]) for r in results])
    # The stored history agrees: the root, "start" and N_TURNS checkpoints, each the parent of the next.
    history = agent.get_checkpoint_history(thread_id, limit=100)
    assert len(history) == N_TURNS + 2
    assert [h["parent_checkpoint_id"] for h in history[:-1]] == [h["checkpoint_id"] for h in history[1:]]


def test_enqueued_turn_gets_thread_busy_after_the_enqueue_timeout(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model, multitask_strategy="enqueue", enqueue_timeout=0.2)
    thread_id, _ = start_thread(agent)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(say, agent, "block here", thread_id=thread_id)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            with pytest.raises(ThreadBusy) as busy:
                say(agent, "waited too long", thread_id=thread_id)
            assert busy.value.ids["thread_id"] == thread_id
        finally:
            model.gate.set()
        held.result(timeout=HANG_TIMEOUT)
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block here"]


@pytest.mark.parametrize("strategy", ["reject", "enqueue"])
def test_a_turn_held_on_one_thread_does_not_block_another_thread(backend_url, make_agent, strategy):
    model = gated_model()
    agent = make_agent(backend_url, model=model, multitask_strategy=strategy)
    thread_a, _ = start_thread(agent)
    thread_b, _ = start_thread(agent)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(say, agent, "block on A", thread_id=thread_a)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            other = pool.submit(say, agent, "hello B", thread_id=thread_b)
            assert outputs(other.result(timeout=HANG_TIMEOUT))["thread_id"] == thread_b
            # A new thread is not blocked either.
            fresh = pool.submit(say, agent, "a new thread")
            fresh_thread = outputs(fresh.result(timeout=HANG_TIMEOUT))["thread_id"]
            assert user_texts(head_messages(agent, fresh_thread)) == ["a new thread"]
            assert not held.done(), "the turn on A should still be inside the model"
        finally:
            model.gate.set()
        held.result(timeout=HANG_TIMEOUT)
    assert user_texts(head_messages(agent, thread_a)) == ["start", "block on A"]
    assert user_texts(head_messages(agent, thread_b)) == ["start", "hello B"]


async def hold_then_send(agent, model, thread_id: str, bodies: list[dict]) -> list:
    """Start a turn on `thread_id` that the gated `model` holds, then one request per body, and give those
    time to reach their claim's wait; their tasks, the held turn's first."""
    import asyncio

    held = asyncio.create_task(agent.apredict({"input": "block here", "custom_inputs": {"thread_id": thread_id}}))
    while not model.entered.is_set():
        await asyncio.sleep(0.01)
    sent = [asyncio.create_task(agent.apredict(body)) for body in bodies]
    await asyncio.sleep(0.5)  # each is in its claim's wait now
    return [held, *sent]


def run_held(model, scenario) -> tuple:
    """Run `scenario()` (a coroutine function returning (tasks, *results)): the gate is opened at the end
    whatever happens, every task must finish without an error; its results."""
    import asyncio

    async def whole() -> tuple:
        tasks, *results = await scenario()
        model.gate.set()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), HANG_TIMEOUT)
        assert [type(r).__name__ for r in done if isinstance(r, BaseException)] == []
        return tuple(results)

    try:
        return asyncio.run(whole())
    finally:
        model.gate.set()


def test_async_turns_queued_on_one_thread_leave_the_storage_threads_to_its_commit_and_to_reads(backend_url, make_agent):
    # Waiting claims sleep in a thread. On the storage pool (2 x pool_max_size + 4 threads), more waiters
    # than that took every thread: the turn they waited for could not commit, nor could any read run, until
    # they timed out (a served agent with 30 turns queued on one thread stalled for 30 s).
    import asyncio

    model = gated_model()
    agent = make_agent(backend_url, model=model, multitask_strategy="enqueue", pool_max_size=2, enqueue_timeout=HANG_TIMEOUT)
    thread_id, _ = start_thread(agent)
    other_thread, _ = start_thread(agent)
    waiting = 2 * 2 + 4 + 4  # more than the storage pool's threads

    async def scenario() -> tuple[list, dict, dict]:
        bodies = [{"input": f"queued {n:02d}", "custom_inputs": {"thread_id": thread_id}} for n in range(waiting)]
        tasks = await hold_then_send(agent, model, thread_id, bodies)
        history = {"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id}}
        read = await asyncio.wait_for(agent.apredict(history), HANG_TIMEOUT / 4)  # the root and "start"
        model.gate.set()
        elsewhere = await asyncio.wait_for(
            agent.apredict({"input": "hello", "custom_inputs": {"thread_id": other_thread}}), HANG_TIMEOUT / 4
        )
        return tasks, outputs(read), outputs(elsewhere)

    read, elsewhere = run_held(model, scenario)
    assert len(read["history"]) == 2 and elsewhere["thread_id"] == other_thread
    messages = head_messages(agent, thread_id)
    assert sorted(user_texts(messages)) == sorted(["start", "block here", *(f"queued {n:02d}" for n in range(waiting))])
    assert_each_user_message_followed_by_its_reply(messages)


def test_writing_actions_queued_on_one_busy_thread_never_hold_up_reads(backend_url, make_agent, monkeypatch):
    # Nothing bounds how many actions arrive. Writing ones claim their thread and wait under `enqueue`, in a
    # thread each of a bounded pool; reads run on the storage pool, so a flood of waiting writes on one thread,
    # more than that pool has threads, delays no read.
    import asyncio

    from agent.operations.turns import runner

    monkeypatch.setattr(runner, "UPDATE_THREADS", 16)  # the pool's size (at least the storage pool's, 8 here)
    model = gated_model()
    agent = make_agent(backend_url, model=model, pool_max_size=2, enqueue_timeout=HANG_TIMEOUT)
    thread_id, start = start_thread(agent)
    other_thread, _ = start_thread(agent)
    flood = runner.UPDATE_THREADS + 6  # more than the writing actions' threads

    def action(name: str, thread: str, **custom) -> dict:
        return {"input": [], "custom_inputs": {"action": name, "thread_id": thread, **custom}}

    async def scenario() -> tuple[list, dict, dict]:
        move = action("set_head", thread_id, checkpoint_id=start, multitask_strategy="enqueue")
        tasks = await hold_then_send(agent, model, thread_id, [move] * flood)
        here = await asyncio.wait_for(agent.apredict(action("get_checkpoint_state", thread_id)), HANG_TIMEOUT / 4)
        there = await asyncio.wait_for(agent.apredict(action("get_checkpoint_history", other_thread)), HANG_TIMEOUT / 4)
        return tasks, outputs(here), outputs(there)

    here, there = run_held(model, scenario)
    assert here["checkpoint_id"] == start and len(there["history"]) == 2
    assert agent.get_head(thread_id)["checkpoint_id"] == start  # the last set_head, after the held turn


N_QUEUED = 8


def report_first_refusal(storage, refused: threading.Semaphore) -> None:
    """Make `storage` release `refused` once per turn, when its first claim attempt is refused (it now waits)."""
    original = storage._try_claim
    seen: set[str] = set()

    def watched(thread_id, token, **options):
        attempt = original(thread_id, token, **options)
        if attempt[0] is None and token not in seen:
            seen.add(token)
            refused.release()
        return attempt

    storage._try_claim = watched


def test_enqueued_turns_land_in_the_order_they_were_sent(backend_url, make_agent):
    # Each turn is sent only once the previous one waits, so the order they were sent in is known;
    # when the held turn ends, they must land in that order, whichever happens to poll first.
    model = gated_model()
    agent = make_agent(backend_url, model=model, multitask_strategy="enqueue")
    thread_id, start = start_thread(agent)
    refused = threading.Semaphore(0)
    report_first_refusal(agent.storage, refused)
    texts = [f"queued {n}" for n in range(N_QUEUED)]
    with ThreadPoolExecutor(N_QUEUED + 1) as pool:
        held = pool.submit(say, agent, "block here", thread_id=thread_id)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            queued = []
            for text in texts:
                queued.append(pool.submit(say, agent, text, thread_id=thread_id))
                assert refused.acquire(timeout=HANG_TIMEOUT), f"{text!r} never found the thread busy"
        finally:
            model.gate.set()
        held.result(timeout=HANG_TIMEOUT)
        results = [turn.result(timeout=HANG_TIMEOUT) for turn in queued]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block here", *texts]
    # Each queued turn started from the one sent before it.
    parents = [outputs(r)["parent_checkpoint_id"] for r in results[1:]]
    assert parents == [outputs(r)["checkpoint_id"] for r in results[:-1]]


def test_a_waiter_that_gave_up_or_died_does_not_hold_up_the_queue(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model, multitask_strategy="enqueue", enqueue_timeout=0.2)
    thread_id, _ = start_thread(agent)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(say, agent, "block here", thread_id=thread_id)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            with pytest.raises(ThreadBusy):
                say(agent, "gives up after 0.2 s", thread_id=thread_id)
        finally:
            model.gate.set()
        held.result(timeout=HANG_TIMEOUT)
    # The waiter that gave up left the queue: the free thread is not busy, even under reject.
    say(agent, "right after", thread_id=thread_id, multitask_strategy="reject")

    # A live ticket of another replica's waiter comes first, also on a free thread...
    with other_replica_waits(backend_url, thread_id):
        for strategy in ("reject", "enqueue"):
            with pytest.raises(ThreadBusy):
                say(agent, f"behind another replica's waiter ({strategy})", thread_id=thread_id, multitask_strategy=strategy)
    # ...but not once its ticket expired (its process died and stopped renewing it).
    with other_replica_waits(backend_url, thread_id, seconds=-1):
        say(agent, "after the dead waiter's ticket expired", thread_id=thread_id, multitask_strategy="reject")
    assert user_texts(head_messages(agent, thread_id)) == [
        "start", "block here", "right after", "after the dead waiter's ticket expired"
    ]


# A child process sending one enqueued turn when told to; it says "waiting" once its first claim attempt
# was refused.
CHILD_QUEUED_TURN = """
import json, sys
from agent import create_agent
url, thread_id, text = sys.argv[1:]
agent = create_agent(url, model="offline", tracing=False, enqueue_timeout=120)
original, said = agent.storage._try_claim, []
def watched(thread, token, **options):
    attempt = original(thread, token, **options)
    if attempt[0] is None and not said:
        said.append(True)
        print(json.dumps("waiting"), flush=True)
    return attempt
agent.storage._try_claim = watched
print(json.dumps("ready"), flush=True)
sys.stdin.readline()
custom = {"thread_id": thread_id, "multitask_strategy": "enqueue"}
out = agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom}).custom_outputs
print(json.dumps(out["checkpoint_id"]), flush=True)
agent.close()
"""


@pytest.mark.slow
def test_enqueued_turns_from_several_processes_land_in_the_order_they_were_sent(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id, _ = start_thread(agent)
    texts = [f"from process {n}" for n in range(4)]
    children = [Child(CHILD_QUEUED_TURN, backend_url, thread_id, text) for text in texts]
    try:
        for child in children:
            child.wait_ready()
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(say, agent, "block here", thread_id=thread_id)
            try:
                assert model.entered.wait(HANG_TIMEOUT)
                for child in children:
                    child.go()
                    assert child.next_value() == "waiting"
            finally:
                model.gate.set()
            held.result(timeout=HANG_TIMEOUT)
        for child in children:
            child.results_until_exit()
    finally:
        for child in children:
            child.kill()
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block here", *texts]


# A child process: its own agent on the same database, sending turns to one thread, one
# phase per strategy.
CHILD_TURNS = """
import json, sys
from agent import create_agent
from agent.errors import ThreadBusy
from agent.models import OfflineChatModel
url, thread_id, name, count, *strategies = sys.argv[1:]
agent = create_agent(url, model=OfflineChatModel(latency_ms=30), tracing=False)
for strategy in strategies:
    print(json.dumps("ready"), flush=True)
    sys.stdin.readline()
    for n in range(int(count)):
        text = f"{name} {strategy} turn {n}"
        custom = {"thread_id": thread_id, "multitask_strategy": strategy}
        try:
            out = agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom}).custom_outputs
            print(json.dumps({"text": text, "parent": out["parent_checkpoint_id"], "checkpoint": out["checkpoint_id"]}), flush=True)
        except ThreadBusy:
            print(json.dumps({"text": text, "busy": True}), flush=True)
    print(json.dumps("done"), flush=True)
agent.close()
"""


@pytest.mark.slow
def test_the_thread_lock_holds_across_processes(backend_url, make_agent):
    agent = make_agent(backend_url)
    thread_id, start = start_thread(agent)
    strategies = ("reject", "enqueue")
    children = [Child(CHILD_TURNS, backend_url, thread_id, name, "8", *strategies) for name in ("p1", "p2")]

    phases = release_together(children, phases=len(strategies))

    landed = []
    for strategy, per_child in zip(strategies, phases):
        results = [r for child_results in per_child for r in child_results]
        assert len(results) == 16
        if strategy == "enqueue":
            assert not [r for r in results if r.get("busy")], "an enqueued turn was refused"
        landed += [r for r in results if not r.get("busy")]
    # Whatever was refused, the turns that ran were serialized, and none was lost.
    assert_linear_chain(start, [(r["parent"], r["checkpoint"]) for r in landed])
    messages = head_messages(agent, thread_id)
    assert sorted(user_texts(messages)) == sorted(["start", *(r["text"] for r in landed)])
    assert_each_user_message_followed_by_its_reply(messages)


def test_reading_a_thread_while_its_turns_commit_breaks_neither(backend_url, make_agent):
    # Reads used to borrow the connection of a turn running on the same thread in
    # this process, and broke its commit ("failed to enter pipeline mode").
    agent = make_agent(backend_url, model=OfflineChatModel(latency_ms=5), multitask_strategy="enqueue")
    thread_id, start = start_thread(agent)
    stop = threading.Event()

    def read() -> int:
        reads = 0
        while not stop.is_set():
            agent.get_checkpoint_history(thread_id, limit=5)
            reads += 1
        return reads

    texts = [f"turn {n:02d}" for n in range(40)]
    with ThreadPoolExecutor(12) as pool:
        readers = [pool.submit(read) for _ in range(4)]
        turns = [pool.submit(say, agent, text, thread_id=thread_id) for text in texts]
        try:
            results = [turn.result(timeout=HANG_TIMEOUT) for turn in turns]
        finally:
            stop.set()
        assert all(reader.result(timeout=HANG_TIMEOUT) > 0 for reader in readers)
    assert_linear_chain(start, [(outputs(r)["parent_checkpoint_id"], outputs(r)["checkpoint_id"]) for r in results])
    assert sorted(user_texts(head_messages(agent, thread_id))) == sorted(["start", *texts])
