"""Memory that travels in time with the conversation (agent.memory): versions that supersede instead of
overwriting, what the agent knew at a checkpoint, forks, forgetting every version, and extraction on demand;
through the offline model, on Postgres and SQLite."""

from __future__ import annotations

import uuid

import pytest

from agent.errors import InvalidRequest, ThreadNotFound
from tests.helpers.scenario import outputs, request, say
from tests.memory.test_memory import remembered, store_rows


@pytest.fixture
def ana() -> str:
    return f"ana-{uuid.uuid4().hex[:8]}"


def moves(agent, user_id: str) -> dict:
    """A thread where the user lives in Porto (turn 2), then Lisbon (turn 3, a change of the same memory)."""
    first = outputs(say(agent, "I'm planning a trip", user_id=user_id))
    thread = first["thread_id"]
    porto = outputs(say(agent, "Remember that I live in Porto", thread_id=thread, user_id=user_id))
    lisbon = outputs(say(agent, "Remember instead that I live in Lisbon", thread_id=thread, user_id=user_id))
    return {"thread_id": thread, "first": first["checkpoint_id"], "porto": porto["checkpoint_id"], "lisbon": lisbon["checkpoint_id"]}


def contents(memories) -> list[str]:
    return [memory["content"] for memory in memories]


@pytest.mark.parametrize("scope", ["user", "branch"])
def test_a_changed_memory_supersedes_the_old_version_which_is_still_what_the_agent_knew_before(backend_url, make_agent, ana, scope):
    agent = make_agent(backend_url, memory_scope=scope)
    ids = moves(agent, ana)
    [current] = agent.list_memories(ana)
    assert current["content"] == "I live in Lisbon" and current["checkpoint_id"] == ids["lisbon"]
    assert store_rows(backend_url, ana)["store"] == 2  # the old version is kept, not overwritten
    as_of = {name: agent.list_memories(ana, thread_id=ids["thread_id"], as_of_checkpoint=ids[name]) for name in ("first", "porto", "lisbon")}
    assert contents(as_of["first"]) == [] and contents(as_of["porto"]) == ["I live in Porto"]
    assert as_of["lisbon"] == [current]
    [old] = as_of["porto"]
    assert old["memory_id"] == current["memory_id"] and current["supersedes"] == old["version_id"] != current["version_id"]
    assert old["checkpoint_id"] == ids["porto"]


def test_under_branch_scope_a_turn_sees_the_version_its_branch_saved_and_under_user_scope_the_current_one(backend_url, make_agent, ana):
    for scope, expected in (("branch", "I live in Porto"), ("user", "I live in Lisbon")):
        agent = make_agent(backend_url, memory_scope=scope)
        ids = moves(agent, f"{ana}-{scope}")
        back = say(agent, "Where do I live?", thread_id=ids["thread_id"], checkpoint_id=ids["porto"], user_id=f"{ana}-{scope}")
        assert remembered(back) == f'1. "{expected}"'


def test_a_fork_inherits_memory_as_it_was_at_the_fork_point(backend_url, make_agent, ana):
    agent = make_agent(backend_url, memory_scope="branch")
    ids = moves(agent, ana)
    fork = agent.fork_thread(ids["thread_id"], ids["porto"], user_id=ana)
    assert contents(agent.list_memories(ana, thread_id=fork["thread_id"], as_of_checkpoint=fork["checkpoint_id"])) == ["I live in Porto"]
    on_fork = say(agent, "Where do I live?", thread_id=fork["thread_id"], user_id=ana)
    assert remembered(on_fork) == '1. "I live in Porto"'


def test_under_user_scope_a_fork_made_after_a_change_knows_at_its_fork_point_what_the_agent_knew_there(
    backend_url, make_agent, ana
):
    agent = make_agent(backend_url, memory_scope="user")
    ids = moves(agent, ana)
    # Made after the move to Lisbon: its copies get new (later) checkpoint ids, yet stand for the past.
    fork = agent.fork_thread(ids["thread_id"], ids["porto"], user_id=ana)
    on = lambda thread_id, checkpoint_id: contents(  # noqa: E731
        agent.list_memories(ana, thread_id=thread_id, as_of_checkpoint=checkpoint_id)
    )
    copies = [entry["checkpoint_id"] for entry in agent.get_checkpoint_history(fork["thread_id"], user_id=ana)]
    assert copies[0] == fork["checkpoint_id"] and len(copies) == 3  # the fork point, the first turn, the root
    assert on(fork["thread_id"], fork["checkpoint_id"]) == ["I live in Porto"] == on(ids["thread_id"], ids["porto"])
    assert on(fork["thread_id"], copies[1]) == [] == on(fork["thread_id"], copies[2])
    # A fork of the fork inherits the same past.
    again = agent.fork_thread(fork["thread_id"], fork["checkpoint_id"], user_id=ana)
    assert on(again["thread_id"], again["checkpoint_id"]) == ["I live in Porto"]
    # A turn on the fork runs now: under user scope it knew the user's current set, and so does its checkpoint.
    turn = outputs(say(agent, "Where do I live?", thread_id=fork["thread_id"], user_id=ana))
    assert on(fork["thread_id"], turn["checkpoint_id"]) == ["I live in Lisbon"]


def test_forget_removes_every_version_of_a_memory(backend_url, make_agent, ana):
    agent = make_agent(backend_url)
    ids = moves(agent, ana)
    say(agent, "Forget where I live", thread_id=ids["thread_id"], user_id=ana)
    assert agent.list_memories(ana) == [] and store_rows(backend_url, ana)["store"] == 0
    assert agent.list_memories(ana, thread_id=ids["thread_id"], as_of_checkpoint=ids["porto"]) == []


def test_as_of_checkpoint_needs_the_callers_thread(backend_url, make_agent, ana):
    agent = make_agent(backend_url)
    ids = moves(agent, ana)
    action = {"action": "list_memories", "user_id": ana, "thread_id": ids["thread_id"], "as_of_checkpoint": ids["porto"]}
    assert contents(outputs(agent.predict(request(None, **action)))["memories"]) == ["I live in Porto"]
    with pytest.raises(InvalidRequest, match="thread_id"):
        agent.list_memories(ana, as_of_checkpoint=ids["porto"])
    with pytest.raises(ThreadNotFound):
        agent.list_memories("someone-else", thread_id=ids["thread_id"], as_of_checkpoint=ids["porto"])


def test_extraction_proposes_new_and_changed_memories_writes_nothing_in_a_dry_run_and_writes_them_on_confirmation(
    backend_url, make_agent, ana
):
    agent = make_agent(backend_url, memory_scope="branch")
    ids = moves(agent, ana)
    told = outputs(say(agent, "My cat is called Miso. I live in Faro now. Any tips?", thread_id=ids["thread_id"], user_id=ana))
    rows = store_rows(backend_url, ana)
    dry = agent.extract_memories(ids["thread_id"], user_id=ana)
    assert store_rows(backend_url, ana) == rows and contents(agent.list_memories(ana)) == ["I live in Lisbon"]
    assert dry["dry_run"] and not dry["written"] and dry["checkpoint_id"] == told["checkpoint_id"]
    by_content = {p["content"]: p for p in dry["proposals"]}
    assert by_content["I live in Faro now"]["kind"] == "update"
    assert by_content["I live in Faro now"]["superseded_content"] == "I live in Lisbon"
    assert by_content["My cat is called Miso"]["kind"] == "new" and by_content["My cat is called Miso"]["memory_id"] is None

    wrote = agent.extract_memories(ids["thread_id"], user_id=ana, dry_run=False)
    assert wrote["written"] and [p["content"] for p in wrote["proposals"]] == [p["content"] for p in dry["proposals"]]
    current = {m["content"]: m for m in agent.list_memories(ana)}
    assert "I live in Lisbon" not in current and (current["I live in Faro now"]["thread_id"], current["I live in Faro now"]["checkpoint_id"]) == (
        ids["thread_id"], told["checkpoint_id"]
    )  # fmt: skip
    # Under branch scope, the extracted versions are on that checkpoint's branch only.
    on_branch = say(agent, "Where do I live? And my cat?", thread_id=ids["thread_id"], user_id=ana)
    assert "I live in Faro now" in remembered(on_branch) and "Miso" in remembered(on_branch)
    earlier = say(agent, "Where do I live? And my cat?", thread_id=ids["thread_id"], checkpoint_id=ids["lisbon"], user_id=ana)
    assert remembered(earlier) == '1. "I live in Lisbon"'
    again = agent.extract_memories(ids["thread_id"], checkpoint_id=told["checkpoint_id"], user_id=ana)
    assert again["proposals"] == []  # everything the branch says is known there now


def test_extract_memories_is_an_action_too(backend_url, make_agent, ana):
    agent = make_agent(backend_url)
    thread = outputs(say(agent, "I'm allergic to peanuts.", user_id=ana))["thread_id"]
    answer = outputs(agent.predict(request(None, action="extract_memories", thread_id=thread, user_id=ana, dry_run=False)))
    assert [p["content"] for p in answer["proposals"]] == ["I'm allergic to peanuts"] and answer["written"]
    assert contents(agent.list_memories(ana)) == ["I'm allergic to peanuts"]
    with pytest.raises(InvalidRequest, match="dry_run"):
        agent.extract_memories(thread, user_id=ana, dry_run="yes")


def test_tt_agent_extract_memories_shows_then_writes_with_no_dry_run(tmp_path, make_agent, ana):
    import json

    from tests.cli.test_cli import run_cli

    url = f"sqlite:///{tmp_path / 'extract.sqlite'}"
    agent = make_agent(url)
    thread = outputs(say(agent, "My cat is called Miso.", user_id=ana))["thread_id"]
    agent.close()
    shown = run_cli("extract-memories", thread, "--user-id", ana, "--json", "--database-url", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert [p["content"] for p in json.loads(shown.stdout)["proposals"]] == ["My cat is called Miso"]
    wrote = run_cli("extract-memories", thread, "--user-id", ana, "--no-dry-run", "--json", "--database-url", url, cwd=tmp_path)
    assert wrote.returncode == 0 and json.loads(wrote.stdout)["written"], wrote.stderr
    assert contents(make_agent(url).list_memories(ana)) == ["My cat is called Miso"]


def test_deleting_a_branchs_checkpoints_memories_brings_back_the_version_before_under_branch_scope(backend_url, make_agent, ana):
    agent = make_agent(backend_url, memory_scope="branch")
    ids = moves(agent, ana)
    memories = agent.operation_context.memories
    assert memories.delete_checkpoint_memories(ana, ids["thread_id"], [ids["lisbon"]]) == 1
    assert contents(agent.list_memories(ana)) == ["I live in Porto"] and store_rows(backend_url, ana)["store"] == 1
    user_scope = make_agent(backend_url, memory_scope="user").operation_context.memories
    assert user_scope.delete_checkpoint_memories(ana, ids["thread_id"], [ids["porto"]]) == 0


@pytest.mark.parametrize("scope", ["user", "branch"])
def test_delete_branch_takes_the_memory_versions_saved_on_it_under_branch_scope_and_keeps_them_under_user(
    backend_url, make_agent, ana, scope
):
    agent = make_agent(backend_url, memory_scope=scope)
    ids = moves(agent, ana)
    away = outputs(say(agent, "just chatting", thread_id=ids["thread_id"], checkpoint_id=ids["porto"], user_id=ana))
    deleted = agent.delete_branch(ids["thread_id"], ids["lisbon"], user_id=ana)
    assert deleted["deleted_checkpoint_ids"] == [ids["lisbon"]]
    if scope == "branch":  # the change made on the deleted branch goes with it: Porto is known again
        assert deleted["deleted_memory_versions"] == 1
        assert contents(agent.list_memories(ana)) == ["I live in Porto"] and store_rows(backend_url, ana)["store"] == 1
        assert all(memory["checkpoint_id"] != ids["lisbon"] for memory in agent.list_memories(ana))
    else:  # the user's memories are the user's, not the branch's
        assert deleted["deleted_memory_versions"] == 0
        assert contents(agent.list_memories(ana)) == ["I live in Lisbon"] and store_rows(backend_url, ana)["store"] == 2
    known = agent.list_memories(ana, thread_id=ids["thread_id"], as_of_checkpoint=away["checkpoint_id"])
    assert contents(known) == ["I live in Porto" if scope == "branch" else "I live in Lisbon"]
