"""Fitting a branch's messages into a token budget: whole turns, tool calls paired, system messages kept.

`fit(head, messages, budget, summary)` is pure. The model input it builds is

    head (this turn's system messages: instructions, memories)
    + the branch's system messages older than the kept turns, in order
    + the branch's summary, if one applies and fits (strategy `summarize`)
    + the newest whole turns of the branch, repaired (`repair.close_unanswered_tool_calls`)

A **turn** is a user message and everything after it up to the next user
message (messages before the first user message form one more). Cutting only
before a user message never separates a tool call from its result: in a
history that follows the pairing rule, results follow their call before any
other message, and each kept turn is repaired on its own, which gives what
repairing the whole history gives (the repair closes every open call before
the next user message). The newest turn, which holds the newest user message,
and every system message are always sent, even when they alone exceed the
budget (the model then gets more than the budget rather than a turn without
its question).

Tokens: the sum of the counter over the sent messages, plus the tool schemas
and the counter's per-call overhead; counts add up over disjoint lists, so
each turn is counted once and only the turns that may be sent are counted.
The work per call grows with the kept turns, not with the branch (apart from
one C-level pass to find system messages).

Strategies when older turns do not fit:

* `trim`: they are left out.
* `summarize`: they are folded into the branch's summary. `fit` returns a
  `Fold` instead of an input: the turns to summarize, in chunks that fit the
  budget, down to where the kept turns then take at most half of what is left
  after the summary's share (`SUMMARY_SHARE`), so that the summary grows
  again only after several more turns rather than on every one. The caller
  (`agent.context.window`) asks the model for the summary and fits again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, SystemMessage

from agent.config import ContextStrategy
from agent.context.repair import close_unanswered_tool_calls
from agent.context.summaries import ContextSummary, summary_message
from agent.context.tokens import TokenCounter

#: The part of the budget a summary may take.
SUMMARY_SHARE = 4
#: The most tokens a summary may take, whatever the budget (SQLite stores it in every checkpoint of its branch).
MAX_SUMMARY_TOKENS = 1024


@dataclass(frozen=True)
class Budget:
    """What one model call may be sent."""

    max_tokens: int
    strategy: ContextStrategy
    counter: TokenCounter
    tool_tokens: int = 0
    """Tokens of the tool schemas sent with every call."""
    summary_request_tokens: int = 0
    """Tokens a summary request adds besides the previous summary and the turns (instructions, prompt)."""

    @property
    def summary_max_tokens(self) -> int:
        """The most tokens a summary message may take."""
        return max(1, min(self.max_tokens // SUMMARY_SHARE, MAX_SUMMARY_TOKENS))

    @property
    def fixed_tokens(self) -> int:
        """Tokens every call costs besides its messages."""
        return self.tool_tokens + self.counter.overhead


@dataclass(frozen=True)
class FoldChunk:
    """Whole turns to summarize in one request, without system messages and repaired."""

    messages: tuple[BaseMessage, ...]
    end: int
    """After this chunk the summary stands for the stored `messages[:end]`."""
    covers: int
    """How many non-system stored messages that is."""


@dataclass(frozen=True)
class Fold:
    """Turns a summary must take in before the model input fits."""

    previous: ContextSummary | None
    """The summary it grows (None: a new one from the branch's first message)."""
    chunks: tuple[FoldChunk, ...]
    """Oldest first, each fitting one summary request within the budget (a single turn may not)."""


@dataclass(frozen=True)
class ModelInput:
    """What one model call is sent, and what it cost in tokens."""

    messages: list[BaseMessage]
    tokens: int
    """Counted with the budget's counter, tool schemas included."""
    summary_used: bool = False
    kept_from: int = 0
    """The index in the branch's messages of the first one sent in order (after the summary)."""
    fold: Fold | None = None
    """Set instead of `messages` when the branch's summary must grow first (`summarize`)."""


def fit(
    head: Sequence[BaseMessage],
    messages: Sequence[BaseMessage],
    budget: Budget,
    summary: ContextSummary | None = None,
    *,
    allow_fold: bool = True,
) -> ModelInput:
    """The model input for the branch's stored `messages` within `budget` (see the module docstring).

    Args:
        head: this turn's own system messages, sent first and always.
        messages: the branch's messages, oldest first, as stored.
        summary: the branch's summary, used when the strategy is `summarize` and it still applies.
        allow_fold: False returns an input even when a summary should grow (after a fold).
    """
    count = budget.counter.count
    newest_user = _newest_user(messages)
    if budget.strategy == "summarize" and summary is not None and summary.applies_to(messages, newest_user):
        covered = summary.count
    else:
        summary, covered = None, 0
    systems = _system_positions(messages)
    fixed = budget.fixed_tokens + count(head) + count([messages[i] for i in systems])

    turns = _turns_newest_first(messages, covered)
    newest = next(turns, None)
    kept: list[tuple[int, list[BaseMessage], int]] = []  # (start, repaired turn, tokens), newest first
    if newest is not None:
        kept.append(_measured(messages, newest, count))
    room = budget.max_tokens - fixed - sum(tokens for _, _, tokens in kept)

    sent_summary = summary_message(summary) if summary is not None else None
    summary_tokens = count([sent_summary]) if sent_summary is not None else 0
    if sent_summary is not None and summary_tokens > room:
        sent_summary, summary_tokens = None, 0  # the newest turn comes first; the covered turns are left out
    remaining = room - summary_tokens
    left_out = False
    for turn in turns:
        start, repaired, tokens = _measured(messages, turn, count)
        if tokens > remaining:
            left_out = True
            break
        kept.append((start, repaired, tokens))
        remaining -= tokens

    if left_out and allow_fold and budget.strategy == "summarize" and budget.summary_max_tokens <= room:
        return ModelInput([], 0, fold=_fold(messages, budget, summary, covered, kept, room, systems))

    kept_from = kept[-1][0] if kept else len(messages)
    hoisted = [messages[i] for i in systems if i < kept_from]
    sent = [*head, *hoisted, *([sent_summary] if sent_summary is not None else [])]
    for _, repaired, _ in reversed(kept):
        sent.extend(repaired)
    tokens = fixed + summary_tokens + sum(tokens for _, _, tokens in kept)
    return ModelInput(sent, tokens, summary_used=sent_summary is not None, kept_from=kept_from)


def _fold(
    messages: Sequence[BaseMessage],
    budget: Budget,
    summary: ContextSummary | None,
    covered: int,
    kept: list[tuple[int, list[BaseMessage], int]],
    room: int,
    systems: list[int],
) -> Fold:
    """The turns between the summary's end and the turns kept within half the room after a full summary."""
    target = (room - budget.summary_max_tokens) // 2
    end = kept[0][0]  # the newest turn always stays
    used = 0
    for start, _, tokens in kept[1:]:
        if used + tokens > target:
            break
        used += tokens
        end = start
    count = budget.counter.count
    per_request = budget.max_tokens - budget.fixed_tokens - budget.summary_request_tokens - budget.summary_max_tokens
    chunks: list[FoldChunk] = []
    chunk: list[BaseMessage] = []
    chunk_tokens = 0

    def close(at: int) -> None:
        chunks.append(FoldChunk(tuple(chunk), at, at - bisect.bisect_left(systems, at)))

    for start, stop in _turns_oldest_first(messages, covered, end):
        turn = [m for m in close_unanswered_tool_calls(messages[start:stop]) if m.type != "system"]
        tokens = count(turn)
        if chunk and chunk_tokens + tokens > per_request:
            close(start)
            chunk, chunk_tokens = [], 0
        chunk.extend(turn)
        chunk_tokens += tokens
    if chunk:
        close(end)
    return Fold(previous=summary, chunks=tuple(chunks))


def _measured(messages: Sequence[BaseMessage], turn: tuple[int, int], count) -> tuple[int, list[BaseMessage], int]:
    """(start, the turn repaired, its tokens without system messages, which are counted apart)."""
    start, stop = turn
    repaired = close_unanswered_tool_calls(messages[start:stop])
    return start, repaired, count([m for m in repaired if m.type != "system"])


def _turns_newest_first(messages: Sequence[BaseMessage], lo: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the turns in `messages[lo:]`, newest first: each starts at a user message, or at `lo`."""
    stop = len(messages)
    for index in range(stop - 1, lo - 1, -1):
        if index == lo or messages[index].type == "human":
            yield index, stop
            stop = index


def _turns_oldest_first(messages: Sequence[BaseMessage], lo: int, hi: int) -> list[tuple[int, int]]:
    """(start, stop) of the turns in `messages[lo:hi]`, oldest first (`hi` is a turn's start)."""
    starts = [index for index in range(lo, hi) if index == lo or messages[index].type == "human"]
    return list(zip(starts, [*starts[1:], hi]))


def _newest_user(messages: Sequence[BaseMessage]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].type == "human":
            return index
    return -1


def _system_positions(messages: Sequence[BaseMessage]) -> list[int]:
    # A C-level pass over the classes first: most branches have no system message at all.
    if not any(issubclass(cls, SystemMessage) for cls in set(map(type, messages))):
        return []
    return [index for index, message in enumerate(messages) if message.type == "system"]
