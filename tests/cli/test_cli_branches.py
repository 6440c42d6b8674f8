"""The branch commands of `tt-agent chat` (/show, /edit, /regen, /branches, /switch, /fork, /diff) and the labels
of `tt-agent history --tree`, run for real in subprocesses with piped input (helpers of `tests.cli.test_cli`)."""

from __future__ import annotations

import re

from agent import create_agent
from tests.helpers.scenario import TRIP
from tests.cli.test_cli import SHORT, UUID, assert_clean_success, replies, run_cli, saved_checkpoints


def chat(url: str, tmp_path, *lines: str):
    result = run_cli("chat", "--database-url", url, cwd=tmp_path, stdin="\n".join([*lines, "/quit"]) + "\n")
    assert_clean_success(result)
    return result.stdout


def section(out: str, command: str) -> str:
    """What the chat printed after `command` and before the next prompt."""
    return out.split(f"you › {command}", 1)[1].split("you ›", 1)[0]


def test_chat_edits_the_first_message_regenerates_lists_switches_forks_and_compares(tmp_path):
    url = f"sqlite:///{tmp_path / 'chat.sqlite'}"
    out = chat(
        url,
        tmp_path,
        TRIP[0],
        TRIP[1],
        "/show",
        "/edit 1 I'm planning a cruise!",
        "/show",
        "/regen",
        "/branches",
        "/edit 9 too far",
        "/edit 2 not my words",
    )
    thread_id = re.search(rf"new thread_id ({UUID})", out).group(1)
    turn1, turn2, edited, regenerated = saved_checkpoints(out)
    shown = section(out, "/show")
    assert [n for n in re.findall(r"│ (\d) │", shown)] == ["1", "2", "3", "4"]
    assert TRIP[0] in shown and TRIP[1] in shown and "‹" not in shown.split("‹i/n›")[0]
    root = _root(url, thread_id)
    assert f"saved as checkpoint {edited} (parent {root[-SHORT:]})" in out
    assert "cruise" in replies(out)[2] and "SF" not in replies(out)[2]
    after_edit = out.split("you › /edit 1", 1)[1].split("you › /show", 1)[1].split("you ›", 1)[0]
    assert "‹2/2›" in after_edit  # the edited first message is the second of two alternatives
    assert f"saved as checkpoint {regenerated} (parent {root[-SHORT:]})" in out
    assert replies(out)[3] == replies(out)[2]
    listed = section(out, "/branches")
    positions = [listed.index(c[-SHORT:]) for c in (regenerated, edited, turn2)]
    assert positions == sorted(positions) and "[head]" in listed
    assert "Usage: /edit <n> <text>" in out
    # An answer is not the user's to edit: chat says what to use, not the Python API (a new user's report).
    refused = " ".join(out.split("you › /edit 2 not my words", 1)[1].split())
    assert refused.startswith("Message 2 is not yours: /edit changes your messages; /regen 2 asks for another answer.")
    assert "update_checkpoint_state" not in refused

    # A second session on the thread: switch back to the SF branch, continue, fork, compare.
    out = chat(
        url,
        tmp_path,
        f"/thread {thread_id}",
        f"/switch {turn2[-SHORT:]}",
        "Where am I going?",
        "/fork",
        "And now?",
        f"/thread {thread_id}",
        f"/diff {turn2[-SHORT:]} {edited[-SHORT:]}",
        "/switch",
        "/regen 2",
        "/regen x",
    )
    assert f"The head is now checkpoint {turn2[-SHORT:]} (was {regenerated[-SHORT:]})" in out
    assert "SF" in replies(out)[0]
    fork_id = re.search(rf"You are now on thread\s+({UUID})", out).group(1)
    assert fork_id != thread_id and "SF" in replies(out)[1]
    diff = section(out, f"/diff {turn2[-SHORT:]} {edited[-SHORT:]}")
    assert f"common ancestor: {root[-SHORT:]}" in diff
    only_a, only_b = diff.split("only in A", 1)[1].split("only in B", 1)
    assert TRIP[1] in only_a and "cruise" in only_b and TRIP[1] not in only_b
    assert "Usage: /switch <checkpoint_id>" in out
    # /regen n regenerates answer n of /show (here the first answer): a sibling of turn 1, under the root.
    regenerated_first = section(out, "/regen 2")
    assert f"(parent {root[-SHORT:]})" in regenerated_first and "SF" not in regenerated_first
    assert "Usage: /regen [n]" in section(out, "/regen x")


def test_history_tree_labels_each_checkpoint_with_the_user_message_that_led_to_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'tree.sqlite'}"
    out = chat(url, tmp_path, TRIP[0], TRIP[1], TRIP[2])
    thread_id = re.search(rf"new thread_id ({UUID})", out).group(1)
    result = run_cli("history", thread_id, "--tree", "--database-url", url, cwd=tmp_path)
    assert_clean_success(result)
    tree = result.stdout.split(f"thread {thread_id}", 1)[1]
    assert "(root: empty" in tree
    for said in TRIP:
        assert f'you: "{said}"' in tree
    assert "You said, in order" not in tree  # not the reply, which repeats the whole conversation


def _root(url: str, thread_id: str) -> str:
    with create_agent(url, model="offline", tracing=False) as agent:
        return agent.get_checkpoint_history(thread_id, limit=1000)[-1]["checkpoint_id"]


def test_branch_merge_brings_in_the_chosen_messages_given_by_repeated_message_ids(tmp_path):
    url = f"sqlite:///{tmp_path / 'merge.sqlite'}"
    with create_agent(url, model="offline", tracing=False) as agent:
        first = agent.predict({"input": TRIP[0]}).custom_outputs
        thread_id = first["thread_id"]
        target = agent.predict({"input": TRIP[1], "custom_inputs": {"thread_id": thread_id}}).custom_outputs["checkpoint_id"]
        source = agent.predict({"input": "Lisbon instead", "custom_inputs": {"thread_id": thread_id,
                                                                          "checkpoint_id": first["checkpoint_id"]}})  # fmt: skip
        source_id = source.custom_outputs["checkpoint_id"]
        said = [m for m in agent.get_checkpoint_state(thread_id, source_id)["messages"] if m.get("role") == "user"]
    chosen = said[-1]["id"]

    result = run_cli("branch", "merge", thread_id, source_id, target, "--mode", "messages", "--message-ids", chosen,
                     "--database-url", url, cwd=tmp_path)  # fmt: skip
    assert_clean_success(result)
    with create_agent(url, model="offline", tracing=False) as agent:
        state = agent.get_checkpoint_state(thread_id)
    assert state["merged_from"]["message_ids"] == [chosen] and state["merged_from"]["checkpoint_id"] == source_id
    assert state["messages"][-1]["content"][0]["text"] == "Lisbon instead"  # the copy, on the target branch
    # The tree says it is a merge, and of what (not the previous user message as an "update").
    tree = run_cli("history", thread_id, "--tree", "--database-url", url, cwd=tmp_path)
    assert_clean_success(tree)
    line = next(line for line in tree.stdout.splitlines() if state["checkpoint_id"][-SHORT:] in line and "msgs" in line)
    assert f"merge (messages) of {source_id[-SHORT:]}" in line and "update:" not in line


def test_branch_merge_prints_the_summary_as_the_model_writes_it_then_where_it_was_saved(tmp_path):
    url = f"sqlite:///{tmp_path / 'merge-summary.sqlite'}"
    with create_agent(url, model="offline", tracing=False) as agent:
        first = agent.predict({"input": TRIP[0]}).custom_outputs
        thread_id = first["thread_id"]
        source = agent.predict({"input": "I'm headed to SF, the Golden Gate hotel", "custom_inputs": {"thread_id": thread_id}})
        target = agent.predict({"input": "Lisbon instead", "custom_inputs": {"thread_id": thread_id,
                                                                          "checkpoint_id": first["checkpoint_id"]}})  # fmt: skip
    source_id, target_id = source.custom_outputs["checkpoint_id"], target.custom_outputs["checkpoint_id"]

    result = run_cli("branch", "merge", thread_id, source_id, target_id, "--database-url", url, cwd=tmp_path)
    assert_clean_success(result)
    with create_agent(url, model="offline", tracing=False) as agent:
        state = agent.get_checkpoint_state(thread_id)
    summary = state["messages"][-1]["content"][0]["text"]
    assert "Golden Gate" in summary and state["merged_from"]["checkpoint_id"] == source_id
    out = " ".join(result.stdout.split())  # the console wraps long lines
    assert f"agent › {' '.join(summary.split())}" in out
    assert f"saved as checkpoint {state['checkpoint_id']} (parent {target_id}), now the head." in out
