"""Property: in any tree of turns, branches and state edits, every model input is a view of its own branch.

Hypothesis draws operations on one thread of an agent with a small budget and the
`summarize` strategy: turns from the head, turns from an earlier checkpoint
(branches), user messages added with `update_checkpoint_state`, messages replaced
in place (`Threads.update_state` with an existing id), and clearing the message
cache. A plain model keeps each checkpoint's messages as (role, text). For every
turn, what the offline model was sent (it records its calls) must be:

    [a summary of the branch's first k messages] + the branch's messages from k on

where k is 0 or the start of a user message; the summary, when there is one,
says it stands for k messages and quotes only user messages among those k of
this branch (a summary made on another branch, or before an edit of those
messages, would quote something else); the input is within the budget unless the
newest turn alone is larger. Runs on Postgres and on a SQLite file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage

from agent.context.summaries import ContextSummary, is_summary_message, summary_message
from agent.models import CALCULATE_PREFIX, FORGET_PREFIX, MAX_QUOTED_CHARS, RECALL_PREFIX, REMEMBER_PREFIX, USE_TOOL_PREFIX
from tests.helpers.offline import RecordingOfflineModel, received_tokens
from tests.helpers.scenario import outputs, say, text_of

MAX_EXAMPLES = 15
BUDGET = 900  # the tool schemas (built-in and memory tools) take about 450 of it

#: Messages that make the offline model call a tool (the tree below knows plain turns only).
TOOL_PREFIXES = (CALCULATE_PREFIX, REMEMBER_PREFIX, RECALL_PREFIX, FORGET_PREFIX, USE_TOOL_PREFIX)
texts = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), min_size=10, max_size=80
).filter(lambda s: not s.strip().lower().startswith(TOOL_PREFIXES) and s.strip())
picks = st.integers(min_value=0, max_value=10_000)
operation = st.one_of(
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("turn"), texts),
    st.tuples(st.just("branch"), picks, texts),
    st.tuples(st.just("update"), picks, texts),
    st.tuples(st.just("replace"), picks, picks, texts),
    st.tuples(st.just("clear_cache")),
)
operations = st.lists(operation, min_size=6, max_size=20)
#: A straight run of long turns: it outgrows the budget, so every run exercises summaries whatever else is drawn.
LONG_RUN = [("turn", f"message {i} of a conversation that outgrows its budget, padded to eighty") for i in range(10)]

SUMMARY_COUNT = re.compile(r"^Summary of the (\d+) earlier messages")
QUOTE = re.compile(r'^- "(.*)"$', re.MULTILINE)


@dataclass
class Tree:
    """Checkpoint id -> (role, text) messages, in write order; the thread id once it exists."""

    messages: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    thread_id: str | None = None

    def add(self, checkpoint_id: str, messages: list[tuple[str, str]]) -> None:
        self.messages[checkpoint_id] = messages
        self.order.append(checkpoint_id)

    def pick(self, n: int) -> str:
        return self.order[n % len(self.order)]


def _role(message) -> str:
    return {"human": "user", "ai": "assistant"}.get(message.type, message.type)


def check_model_input(sent: list, branch: list[tuple[str, str]]) -> None:
    """`sent` (what the model got) is a summary of branch[:k] and branch[k:] (see the module docstring)."""
    summary = sent[0] if sent and is_summary_message(sent[0]) else None
    rest = [(_role(m), m.text) for m in (sent[1:] if summary else sent)]
    k = len(branch) - len(rest)
    assert k >= 0 and rest == branch[k:], "the input must be the newest messages of its own branch, in order"
    assert k == 0 or branch[k][0] == "user", "only whole turns are left out"
    if summary is None:
        assert k == 0, "under summarize, what is left out is summarized"
    else:
        assert int(SUMMARY_COUNT.match(summary.text).group(1)) == k
        covered = [" ".join(text.splitlines())[:MAX_QUOTED_CHARS] for role, text in branch[:k] if role == "user"]
        for quote in QUOTE.findall(summary.text):
            assert any(text.startswith(quote) for text in covered), f"{quote!r} is not from this branch's first {k}"
    newest = max(i for i, (role, _) in enumerate(branch) if role == "user")
    assert received_tokens(sent) <= BUDGET or k == newest


def apply(agent, model: RecordingOfflineModel, tree: Tree, op: tuple) -> None:
    kind = op[0]
    if kind in ("turn", "branch"):
        text = op[-1]
        start = tree.pick(op[1]) if kind == "branch" and tree.order else (tree.order[-1] if tree.order else None)
        response = say(agent, text, thread_id=tree.thread_id, checkpoint_id=start if kind == "branch" else None)
        ids = outputs(response)
        if tree.thread_id is None:
            tree.thread_id = ids["thread_id"]
            tree.add(ids["parent_checkpoint_id"], [])
            start = ids["parent_checkpoint_id"]
        branch = [*tree.messages[start], ("user", text)]
        check_model_input(model.turn_calls()[-1], branch)
        tree.add(ids["checkpoint_id"], [*branch, ("assistant", text_of(response))])
    elif tree.thread_id is None or kind == "clear_cache":
        agent.storage.saver.message_cache.clear()
    elif kind == "update":
        start = tree.pick(op[1])
        result = agent.update_checkpoint_state(tree.thread_id, start, [{"role": "user", "content": op[2]}])
        tree.add(result["checkpoint_id"], [*tree.messages[start], ("user", op[2])])
    else:  # replace a message in place, keeping its id
        start = tree.pick(op[1])
        current = tree.messages[start]
        if not current:
            return
        position = op[2] % len(current)
        config = {"configurable": {"thread_id": tree.thread_id, "checkpoint_ns": "", "checkpoint_id": start}}
        target = agent.graph.get_state(config).values["messages"][position]
        cls = HumanMessage if isinstance(target, HumanMessage) else AIMessage
        result = agent.operation_context.turns.update_state(tree.thread_id, start, [cls(content=op[3], id=target.id)], user_id=None)
        edited = list(current)
        edited[position] = (current[position][0], op[3])
        tree.add(result.checkpoint_id, edited)


def test_every_model_input_is_its_own_branchs_summary_and_newest_whole_turns(backend_url, make_agent):
    model = RecordingOfflineModel()
    agent = make_agent(backend_url, model=model, max_context_tokens=BUDGET, context_strategy="summarize")

    @settings(max_examples=MAX_EXAMPLES, deadline=None)
    @given(ops=operations)
    @example(ops=LONG_RUN)
    def property_holds(ops):
        tree = Tree()
        for op in ops:
            apply(agent, model, tree, op)

    property_holds()
    assert any(any(map(is_summary_message, call)) for call in model.turn_calls()), "summaries were exercised"


def test_the_check_refuses_a_summary_made_on_another_branch():
    # What makes the property able to fail: a summary quoting a message this branch never had.
    branch = [("user", "to Rome"), ("assistant", "ok"), ("user", "and then?")]
    foreign = summary_message(ContextSummary('[offline summary] The user said, in order:\n- "to Paris"', 2, "x", 2))
    with pytest.raises(AssertionError, match="not from this branch"):
        check_model_input([foreign, HumanMessage("and then?")], branch)
    own = summary_message(ContextSummary('[offline summary] The user said, in order:\n- "to Rome"', 2, "x", 2))
    check_model_input([own, HumanMessage("and then?")], branch)
