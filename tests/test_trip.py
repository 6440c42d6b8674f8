"""The trip scenario end to end, on Postgres and SQLite."""

from __future__ import annotations

from tests.helpers.scenario import TRIP, outputs, run_trip, say, text_of


def test_thread_remembers_earlier_turns(agent):
    ids = run_trip(agent)
    assert "SF" in ids["answer"]
    assert TRIP[0] in ids["answer"]


def test_branch_from_first_turn_sees_new_york_not_sf(agent):
    ids = run_trip(agent)
    branched = say(agent, "I'm headed to New York!", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    assert outputs(branched)["thread_id"] == ids["thread_id"]
    assert outputs(branched)["parent_checkpoint_id"] == ids["after_turn1"]
    answer = say(agent, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(answer)["parent_checkpoint_id"] == outputs(branched)["checkpoint_id"]
    assert "New York" in text_of(answer) and "SF" not in text_of(answer)
    listed = {entry["checkpoint_id"] for entry in agent.get_checkpoint_history(ids["thread_id"], limit=50)}
    assert ids["after_turn3"] in listed  # the SF branch is still there


def test_update_checkpoint_state_makes_new_head(agent):
    ids = run_trip(agent)
    updated = agent.update_checkpoint_state(
        ids["thread_id"], ids["after_turn1"], [{"role": "user", "content": "I'm headed to Tokyo!"}]
    )
    assert updated["parent_checkpoint_id"] == ids["after_turn1"]
    answer = say(agent, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(answer)["parent_checkpoint_id"] == updated["checkpoint_id"]
    assert "Tokyo" in text_of(answer) and "SF" not in text_of(answer)
