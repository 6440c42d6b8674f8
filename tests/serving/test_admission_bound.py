"""The adaptive bound of `agent.serving.admission.TurnAdmission`: how many turns run follows the event loop's lag.

No server: the middleware is driven directly on an event loop (its places, its lag ticks), since what is tested
is the arithmetic of the bound and the timer's lifecycle, not HTTP (`test_admission` covers the HTTP side).
"""

from __future__ import annotations

import asyncio

from agent.serving.admission import COLD_TURN_SECONDS, MIN_RUNNING_TURNS, RETRY_AFTER_MAX_S, AdmissionPlace, TurnAdmission
from agent.serving.limits import JSON_BODY_KEY

TARGET_S = 0.03


def admission(max_running: int = 200, lag_target: float = TARGET_S) -> TurnAdmission:
    return TurnAdmission(None, max_running=max_running, max_waiting=800, lag_target=lag_target)


def take(gate: TurnAdmission, n: int) -> list[AdmissionPlace]:
    """Places taken at once (without waiting) out of `n` tries."""
    places = [AdmissionPlace(gate) for _ in range(n)]
    return [p for p in places if p.take_now()]


def test_a_burst_starts_from_the_floor_and_without_lag_target_from_the_whole_bound():
    async def main() -> None:
        assert len(take(admission(), 500)) == MIN_RUNNING_TURNS
        assert len(take(admission(max_running=10), 500)) == 10
        assert len(take(admission(lag_target=0.0), 500)) == 200

    asyncio.run(main())


def test_a_late_loop_lowers_the_bound_below_the_running_turns_once_per_hold_and_never_below_the_floor():
    async def main() -> None:
        gate = admission()
        gate.running.total_tokens = 200
        running = take(gate, 200)
        gate.adjust(1.0, len(running), now=100.0)  # one very late tick moves the average over the target
        assert gate.running.total_tokens == 150
        assert all(p.held for p in running)  # running turns are never stopped
        assert not AdmissionPlace(gate).take_now()
        gate.adjust(1.0, len(running), now=100.1)  # within the hold: the lowered bound has not acted yet
        assert gate.running.total_tokens == 150
        for i in range(20):
            gate.adjust(1.0, len(running), now=200.0 + 10 * i)
        assert gate.running.total_tokens == MIN_RUNNING_TURNS

    asyncio.run(main())


def test_an_on_time_loop_with_turns_waiting_raises_the_bound_up_to_max_running_turns():
    async def main() -> None:
        gate = admission()
        running = take(gate, 500)
        gate.adjust(0.0, len(running), now=1.0)
        assert gate.running.total_tokens == MIN_RUNNING_TURNS  # nobody waits: no reason to grow
        gate.waiting = 1
        gate.adjust(0.0, len(running), now=1.0)
        assert gate.running.total_tokens == MIN_RUNNING_TURNS + 1
        for _ in range(1000):
            gate.adjust(0.0, int(gate.running.total_tokens), now=1.0)
        assert gate.running.total_tokens == 200

    asyncio.run(main())


def test_a_waiting_turn_starts_when_the_bound_grows_and_the_ticks_stop_once_idle():
    async def main() -> None:
        gate = admission()
        running = take(gate, MIN_RUNNING_TURNS)
        gate._start_ticking()
        waiting = AdmissionPlace(gate)
        started = asyncio.get_running_loop().create_task(waiting.wait())
        await asyncio.wait_for(started, timeout=10)  # an idle loop ticks on time: the bound grows
        assert waiting.held and gate.running.total_tokens > MIN_RUNNING_TURNS
        for place in [*running, waiting]:
            place.release()
        for _ in range(200):
            if not gate._ticking:
                break
            await asyncio.sleep(0.01)
        assert not gate._ticking
        assert gate.running.total_tokens == MIN_RUNNING_TURNS and gate.lag == 0.0

    asyncio.run(main())


def test_a_new_event_loop_gets_the_ticks_and_the_old_loops_ticks_stop():
    gate = admission()

    async def hold_and_tick() -> list[AdmissionPlace]:
        places = take(gate, 1)
        gate._start_ticking()
        await asyncio.sleep(0.2)
        return places

    first = asyncio.run(hold_and_tick())  # the loop closes with a tick pending and a place held
    assert gate._ticking

    async def second_loop() -> None:
        loop = asyncio.get_running_loop()
        assert gate._loop is not loop
        scope = {"type": "http", "method": "GET", "path": "/health"}
        gate.app = _ok_app
        await gate(scope, None, None)  # not a turn: ticks do not start for it
        assert gate._loop is not loop
        await gate({**scope, "method": "POST", "path": "/responses", JSON_BODY_KEY: {"input": "hi"}}, None, None)
        assert gate._loop is loop and gate._ticking
        first[0].release()
        for _ in range(200):
            if not gate._ticking:
                break
            await asyncio.sleep(0.01)
        assert not gate._ticking

    asyncio.run(second_loop())


async def _ok_app(scope, receive, send) -> None:
    return None


def test_retry_after_before_any_turn_ended_is_the_cold_turn_length_or_the_oldest_turns_time_then_the_mean():
    async def main() -> None:
        gate = admission(max_running=3)
        assert gate.retry_after() == COLD_TURN_SECONDS  # a cold start: no turn length measured, not 1 s
        oldest, other, newest = take(gate, 3)
        assert gate.retry_after() == COLD_TURN_SECONDS  # they have just started
        oldest.started -= 12.3  # running for 12.3 s, no turn ended: every running turn takes at least that
        other.started -= 3.5
        assert gate.retry_after() == 13
        oldest.started -= 1000.0
        assert gate.retry_after() == RETRY_AFTER_MAX_S
        other.release()  # the first turn to end: 3.5 s, the mean from now on
        assert gate.retry_after() == 4
        newest.started -= 0.5
        newest.release()  # the mean moves a fifth of the way to 0.5 s: 2.9 s
        assert gate.retry_after() == 3 and 2.8 < gate.mean_turn_seconds < 3.0

    asyncio.run(main())
