"""The `tt-agent` commands made from the operation registry: the manifest is current, and each runs
through the operations' door (one check, short ids, tables or JSON).

In process (typer's runner): tests/cli/test_cli.py runs the command line as a user does, in subprocesses.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from agent import create_agent
from agent.cli import app
from agent.cli.manifest import COMMANDS
from agent.cli.specs import registry_commands, render
from agent.operations.registry import OPERATIONS
from tests.helpers.scenario import TRIP


def test_the_manifest_is_the_registry_s_commands():
    # If this fails: python -m agent.cli.specs rewrites agent/cli/manifest.py from the registry.
    assert COMMANDS == registry_commands()
    from agent.cli import specs

    assert specs.MANIFEST.read_text(encoding="utf-8") == render(registry_commands())


def test_every_operation_that_declares_a_command_has_one():
    names = {spec["command"] for spec in COMMANDS}
    assert names == {operation.cli for operation in OPERATIONS if operation.cli}
    help_text = CliRunner().invoke(app, ["--help"]).stdout
    for name in {command.split()[0] for command in names}:
        assert re.search(rf"^│ {name}\s", help_text, flags=re.MULTILINE), name


@pytest.fixture()
def branched(tmp_path, monkeypatch):
    """A SQLite store with one thread of two turns and a branch from the first; (url, thread, checkpoints)."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with create_agent(url, model="offline", tracing=False) as agent:
        first = agent.predict({"input": [{"role": "user", "content": TRIP[0]}]}).custom_outputs
        thread_id = first["thread_id"]
        second = agent.predict({"input": [{"role": "user", "content": TRIP[1]}], "custom_inputs": {"thread_id": thread_id}})
        other = agent.predict(
            {"input": [{"role": "user", "content": "I'm headed to New York!"}],
             "custom_inputs": {"thread_id": thread_id, "checkpoint_id": first["checkpoint_id"]}}
        )  # fmt: skip
    return url, thread_id, (first["checkpoint_id"], second.custom_outputs["checkpoint_id"], other.custom_outputs["checkpoint_id"])


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_switch_fork_state_compare_branches_and_usage_take_short_ids(branched):
    url, thread_id, (first, sf, new_york) = branched
    moved = run("switch", thread_id, sf[-8:], "--database-url", url, "--json")
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.stdout) == {"thread_id": thread_id, "checkpoint_id": sf, "previous_checkpoint_id": new_york}

    state = run("state", thread_id, "--database-url", url, "--json")
    assert json.loads(state.stdout)["checkpoint_id"] == sf
    shown = run("state", thread_id, "--checkpoint-id", new_york[-8:], "--database-url", url)
    assert shown.exit_code == 0 and "New York" in shown.stdout

    branches = run("branches", thread_id, "--database-url", url)
    assert sf[-8:] in branches.stdout and new_york[-8:] in branches.stdout and "[head]" in branches.stdout
    # The shell's command to move the head, not the chat's `/switch` (a new user's report).
    said = " ".join(branches.stdout.split())
    assert f"tt-agent switch {thread_id} <id> moves the head there" in said and "/switch" not in said

    diff = run("compare", thread_id, sf[-8:], new_york[-8:], "--database-url", url)
    assert diff.exit_code == 0 and f"common ancestor: {first[-8:]}" in diff.stdout

    usage = run("usage", thread_id, "--database-url", url, "--json")
    assert json.loads(usage.stdout)["checkpoint_id"] == sf

    fork = run("fork", thread_id, "--checkpoint-id", first[-8:], "--database-url", url, "--json")
    forked = json.loads(fork.stdout)
    assert forked["forked_from"] == {"thread_id": thread_id, "checkpoint_id": first}
    with create_agent(url, model="offline", tracing=False) as agent:
        assert agent.get_thread(forked["thread_id"])["message_count"] == 2


def test_head_prints_a_line_for_people_and_json_with_the_option(branched):
    url, thread_id, (_, _, new_york) = branched
    shown = run("head", thread_id, "--database-url", url)
    assert shown.exit_code == 0, shown.output
    assert " ".join(shown.stdout.split()) == f"The head of thread {thread_id} is checkpoint {new_york}; the next turn continues there."
    as_json = run("head", thread_id, "--database-url", url, "--json")
    assert json.loads(as_json.stdout) == {"thread_id": thread_id, "checkpoint_id": new_york}


def test_a_value_the_door_refuses_is_one_error_with_exit_code_1(branched):
    url, thread_id, _ = branched
    result = run("history", thread_id, "--limit", "0", "--database-url", url)
    assert result.exit_code == 1 and "limit must be an integer from 1 to 1000, got 0" in result.output
    unknown = run("switch", thread_id, "zzzzzzzz", "--database-url", url)
    assert unknown.exit_code == 1 and "has the id or short id 'zzzzzzzz'" in " ".join(unknown.output.split())


def test_history_json_is_what_the_agent_method_returns(branched):
    url, thread_id, (_, _, new_york) = branched
    result = run("history", thread_id, "--limit", "1", "--json", "--database-url", url)
    assert result.exit_code == 0, result.output
    [entry] = json.loads(result.stdout)
    assert entry["checkpoint_id"] == new_york and entry["is_head"]


def test_state_after_a_message_shows_the_later_ones_numbered_as_in_the_whole_thread(branched):
    url, thread_id, _ = branched
    whole = json.loads(run("state", thread_id, "--database-url", url, "--json").stdout)
    after = run("state", thread_id, "--after-message-id", whole["messages"][0]["id"], "--database-url", url, "--json")
    part = json.loads(after.stdout)
    assert part["message_offset"] == 1 and part["messages"] == whole["messages"][1:]
    table = run("state", thread_id, "--after-message-id", whole["messages"][0]["id"], "--database-url", url)
    assert re.search(r"^│ 2 │ agent", table.stdout, flags=re.MULTILINE) and not re.search(r"^│ 1 │", table.stdout, flags=re.MULTILINE)


def test_search_index_indexes_what_an_upgrade_left_unindexed_and_search_finds_it_on_each_branch(branched):
    url, thread_id, (_, sf, new_york) = branched
    with create_agent(url, model="offline", tracing=False) as agent:
        agent.storage.clear_search_index()  # what the upgrade's migration leaves
    assert json.loads(run("search", "headed", "--database-url", url, "--json").stdout) == []

    indexed = run("search-index", "--batch-size", "1", "--database-url", url, "--json")
    assert indexed.exit_code == 0, indexed.output
    assert json.loads(indexed.stdout)["indexed_checkpoints"] >= 3
    again = run("search-index", "--database-url", url, "--json")
    assert json.loads(again.stdout) == {"indexed_checkpoints": 0}

    hits = json.loads(run("search", "headed", "--database-url", url, "--json").stdout)
    assert {hit["checkpoint_id"] for hit in hits if "New York" in hit["snippet"]} == {new_york}
    assert any(hit["checkpoint_id"] == sf for hit in hits) and {hit["thread_id"] for hit in hits} == {thread_id}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_search_prints_a_table_of_hits_and_json_only_with_the_option(branched):
    url, thread_id, (_, sf, new_york) = branched
    shown = run("search", "headed", "--database-url", url)
    assert shown.exit_code == 0, shown.output
    assert not _is_json(shown.stdout) and "snippet" in shown.stdout and thread_id in shown.stdout
    assert sf[-8:] in shown.stdout and new_york[-8:] in shown.stdout
    none = run("search", "zanzibar", "--database-url", url)
    assert none.exit_code == 0 and "no hits" in none.stdout
    as_json = json.loads(run("search", "headed", "--database-url", url, "--json").stdout)
    assert {hit["checkpoint_id"] for hit in as_json} >= {sf, new_york}


def test_branch_commands_print_what_they_did_and_the_branches_and_json_only_with_the_option(branched):
    url, thread_id, (_, sf, new_york) = branched
    said = lambda result: " ".join(result.stdout.split())  # noqa: E731
    labelled = run("branch", "label", thread_id, sf[-8:], "SF plan", "--database-url", url)
    assert labelled.exit_code == 0, labelled.output
    assert not _is_json(labelled.stdout) and f"Labelled the branch through {sf[-8:]} 'SF plan'" in said(labelled)
    assert "«SF plan»" in labelled.stdout and "[head]" in labelled.stdout and "forks at" in labelled.stdout
    pinned = run("branch", "pin", thread_id, new_york[-8:], "--database-url", url)
    assert "as the main branch" in said(pinned) and "[pinned]" in pinned.stdout
    archived = run("branch", "archive", thread_id, sf[-8:], "--database-url", url)
    assert f"Archived the branch from {sf[-8:]}" in said(archived) and "[archived]" in archived.stdout
    unarchived = run("branch", "unarchive", thread_id, sf[-8:], "--database-url", url)
    assert "Unarchived" in said(unarchived) and "[archived]" not in unarchived.stdout
    deleted = run("branch", "delete", thread_id, sf[-8:], "--database-url", url)
    assert deleted.exit_code == 0, deleted.output
    assert f"Deleted the branch from {sf[-8:]}: 1 checkpoint ({sf[-8:]})" in said(deleted)
    assert sf[-8:] not in deleted.stdout.split("Branches", 1)[1] and new_york[-8:] in deleted.stdout
    as_json = run("branch", "label", thread_id, new_york[-8:], "NY", "--database-url", url, "--json")
    assert json.loads(as_json.stdout) == {"thread_id": thread_id, "checkpoint_id": new_york, "label": "NY"}
