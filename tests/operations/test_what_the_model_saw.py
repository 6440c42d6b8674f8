"""What the model saw for an answer, as the API gives it: the long-term memories a turn recalled
(`recalled_memories` in the checkpoint's metadata, so in history entries and `get_checkpoint_state`; only
when there were some) and the text of the summary it was sent (`context_summary` of `get_checkpoint_state`,
read from the branch's summary in the checkpoint's state, only when `summary_used`). On each backend.
"""

from __future__ import annotations

from tests.helpers.scenario import outputs, say

#: A budget small enough that the offline model's growing answers make a summary within seven turns.
BUDGET = 1200


def build(agent, user_id: str) -> str:
    thread_id = outputs(say(agent, "remember that I am vegetarian", user_id=user_id))["thread_id"]
    for n in range(6):
        say(agent, f"message number {n} " + "word " * 40, thread_id=thread_id, user_id=user_id)
    return thread_id


def test_recalled_memories_and_the_summarys_text_are_given_per_answer(backend_url, make_agent):
    agent = make_agent(backend_url, context_strategy="summarize", max_context_tokens=BUDGET)
    thread_id = build(agent, "ivan")
    [memory] = agent.list_memories(user_id="ivan")
    history = agent.get_checkpoint_history(thread_id, user_id="ivan")  # newest first
    turns = [entry for entry in history if "model_input_messages" in entry]
    assert len(turns) == 7
    assert "recalled_memories" not in turns[-1]  # the first turn: nothing saved before it, nothing recorded
    assert all(entry["recalled_memories"] == [memory["memory_id"]] for entry in turns[:-1])

    summarized = [entry for entry in turns if entry["summary_used"]]
    assert summarized and not turns[-1]["summary_used"]
    for entry in turns:
        state = agent.get_checkpoint_state(thread_id, entry["checkpoint_id"], user_id="ivan")
        assert state.get("recalled_memories") == entry.get("recalled_memories")
        if not entry["summary_used"]:
            assert "context_summary" not in state
            continue
        text = state["context_summary"]
        # The summary stands for the oldest turns, which this answer's model input left out.
        assert text.startswith("[offline summary]") and "remember that I am vegetarian" in text
        assert entry["model_input_messages"] < entry["message_count"] - 1
    # A fork's copies record the same memories.
    fork = agent.fork_thread(thread_id, user_id="ivan")
    copied = [e for e in agent.get_checkpoint_history(fork["thread_id"], user_id="ivan") if "model_input_messages" in e]
    assert [e.get("recalled_memories") for e in copied] == [e.get("recalled_memories") for e in turns]


def test_a_turn_without_memories_or_summary_records_neither(agent):
    thread_id = outputs(say(agent, "hello", user_id=None))["thread_id"]
    state = agent.get_checkpoint_state(thread_id, user_id=None)
    assert state["summary_used"] is False
    assert "recalled_memories" not in state and "context_summary" not in state
