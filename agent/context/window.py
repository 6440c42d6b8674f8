"""`ContextWindow`: one agent's token budget, strategy and counter, the summarization calls, and the
report of what each model call was sent.

The agent node (`agent.graph`) asks `prepare` (or `aprepare`) for the model
input of the current state, calls the model, and returns `record(...)` with its
reply. `prepare` runs the pure pipeline (`prepare_model_input`); when the
branch's summary must grow it asks the chat model for it (sync or async, like
the node) and runs the pipeline again with the new summary.

`record` does two things:

* It fills the turn's report (`TurnContext.report`): `{"start", "messages",
  "tokens", "summary_used", "usage"}` and, when long-term memories were
  recalled for the turn, `"memories"` (their ids, most relevant first; every
  call of a turn is sent the same ones), the last call's input and the usage of
  every call of the turn, summaries included, as the model reported them
  (`usage_metadata`; None when it reports nothing). The saver copies it into
  the metadata of the checkpoint the turn writes and adds it to the branch's
  running total (`agent.storage.summaries.model_input_summary`).
* It returns the `context_summary` state update when a new summary was made:
  the summary is state, inherited by the branch's later checkpoints only.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool

from agent.config import ContextStrategy
from agent.context import TurnContext, prepare_model_input
from agent.context.budget import Budget, ModelInput
from agent.context.summaries import ContextSummary, summary_message, summary_request
from agent.context.tokens import TokenCounter, default_max_context_tokens, token_counter, tool_tokens
from agent.state import CONTEXT_SUMMARY_CHANNEL

logger = logging.getLogger(__name__)

Usage = dict[str, int]


@dataclass(frozen=True)
class Prepared:
    """A model input ready to send, and what preparing it did to the branch's summary."""

    input: ModelInput
    summary: ContextSummary | None = None
    """A summary made while preparing (to store), else None."""
    usage: Usage | None = None
    """Tokens the summarization calls used, as the model reported them."""


@dataclass(frozen=True)
class ContextWindow:
    """One agent's context settings (see the module docstring). Build with `for_model`, then `bind`."""

    max_context_tokens: int
    strategy: ContextStrategy
    counter: TokenCounter
    tool_tokens: int = 0
    summarizer: Runnable | None = None
    """The chat model that writes summaries (tools defined, never called); set by `bind`."""
    instructions: str | None = None
    """The agent's system prompt: sent first on every model call, counted in the budget, never stored."""

    @classmethod
    def for_model(
        cls,
        model: BaseChatModel,
        *,
        max_context_tokens: int | None = None,
        strategy: ContextStrategy = "trim",
        instructions: str | None = None,
    ) -> ContextWindow:
        """The window for `model`: `max_context_tokens` (None: `tokens.default_max_context_tokens`), the strategy,
        the agent's `instructions` (system prompt; None: none), and the counter `tokens.token_counter` picks
        (this may try to load tiktoken's encoding, for at most a few seconds)."""
        window = cls(
            max_context_tokens=max_context_tokens or default_max_context_tokens(model),
            strategy=strategy,
            counter=token_counter(model),
            instructions=instructions or None,
        )
        logger.info("Context window: %s", window.describe())
        return window

    def bind(self, model: BaseChatModel, tools: Sequence[Any]) -> ContextWindow:
        """This window for `model` called with `tools` bound: their schemas count in every call, and summaries are
        written by `model` with the same tools defined and `tool_choice="none"`."""
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        summarizer: Runnable = model.bind_tools(list(tools), tool_choice="none") if tools else model
        return replace(self, tool_tokens=tool_tokens(schemas), summarizer=summarizer)

    def describe(self) -> str:
        """`max_context_tokens=8000, context_strategy=trim, token counter: approximate`."""
        return (
            f"max_context_tokens={self.max_context_tokens}, context_strategy={self.strategy}, "
            f"token counter: {self.counter.name}"
        )

    def budget(self, context: TurnContext | None) -> Budget:
        """The budget of one call: the turn's `max_context_tokens` when it asks for less than the agent's."""
        wanted = context.max_context_tokens if context is not None else None
        limit = min(wanted, self.max_context_tokens) if wanted else self.max_context_tokens
        budget = Budget(limit, self.strategy, self.counter, tool_tokens=self.tool_tokens)
        request = summary_request(None, [], budget.summary_max_tokens)
        return replace(budget, summary_request_tokens=self.counter.count(request))

    # -- preparing the input ---------------------------------------------------------------------
    def prepare(self, state: Mapping[str, Any], context: TurnContext | None) -> Prepared:
        """The model input for `state`; a summary that must grow is written with the model's `invoke`."""
        steps = self._preparing(state, context)
        try:
            request = next(steps)
            while True:
                request = steps.send(self._summarizer().invoke(request))
        except StopIteration as done:
            return done.value

    async def aprepare(self, state: Mapping[str, Any], context: TurnContext | None) -> Prepared:
        """`prepare` on the event loop: a summary that must grow is written with the model's `ainvoke`."""
        steps = self._preparing(state, context)
        try:
            request = next(steps)
            while True:
                request = steps.send(await self._summarizer().ainvoke(request))
        except StopIteration as done:
            return done.value

    def _preparing(
        self, state: Mapping[str, Any], context: TurnContext | None
    ) -> Generator[list[BaseMessage], BaseMessage, Prepared]:
        """The preparation, written once for both paths: yields each summary request, receives the model's reply."""
        budget = self.budget(context)
        messages = state["messages"]
        summary = ContextSummary.from_state(state.get(CONTEXT_SUMMARY_CHANNEL))
        model_input = prepare_model_input(messages, context, budget=budget, summary=summary, instructions=self.instructions)
        if model_input.fold is None:
            return Prepared(model_input)
        current, usage = model_input.fold.previous, None
        for chunk in model_input.fold.chunks:
            reply = yield summary_request(current, chunk.messages, budget.summary_max_tokens)
            text = reply.text.strip()
            current = self._clipped(ContextSummary(text, chunk.end, messages[chunk.end - 1].id, chunk.covers), budget)
            usage = add_usage(usage, usage_of(reply))
        model_input = prepare_model_input(
            messages, context, budget=budget, summary=current, allow_fold=False, instructions=self.instructions
        )
        return Prepared(model_input, summary=current, usage=usage)

    def _summarizer(self) -> Runnable:
        if self.summarizer is None:
            raise RuntimeError("ContextWindow.bind(model, tools) must be called before a summary is needed")
        return self.summarizer

    def _clipped(self, summary: ContextSummary, budget: Budget) -> ContextSummary:
        """`summary` with its text cut so that its message takes at most the budget's share for summaries."""
        text = summary.text
        while text:
            tokens = self.counter.count([summary_message(replace(summary, text=text))])
            if tokens <= budget.summary_max_tokens:
                break
            text = text[: int(len(text) * budget.summary_max_tokens / tokens * 0.95)]
        return replace(summary, text=text)

    # -- recording it ------------------------------------------------------------------------------
    def record(self, prepared: Prepared, reply: BaseMessage, context: TurnContext | None) -> dict[str, Any]:
        """Add this call to the turn's report; the state update to return beside the reply (a new summary)."""
        if context is not None:
            report = context.report
            report["start"] = context.start_checkpoint_id
            report["messages"] = len(prepared.input.messages)
            report["tokens"] = prepared.input.tokens
            report["summary_used"] = prepared.input.summary_used
            report["usage"] = add_usage(report.get("usage"), add_usage(usage_of(reply), prepared.usage))
            if context.memories:
                report["memories"] = [memory.memory_id for memory in context.memories]
        if prepared.summary is None:
            return {}
        return {CONTEXT_SUMMARY_CHANNEL: prepared.summary.as_state()}


def zero_usage() -> Usage:
    return {"input_tokens": 0, "output_tokens": 0}


def usage_of(message: BaseMessage) -> Usage | None:
    """`{"input_tokens", "output_tokens"}` as the model reported them on `message`, or None."""
    reported = getattr(message, "usage_metadata", None) if isinstance(message, AIMessage) else None
    if not reported:
        return None
    return {"input_tokens": int(reported.get("input_tokens") or 0), "output_tokens": int(reported.get("output_tokens") or 0)}


def add_usage(first: Mapping[str, int] | None, second: Mapping[str, int] | None) -> Usage | None:
    """The sum of two usages; None when both are None."""
    if first is None and second is None:
        return None
    first, second = first or zero_usage(), second or zero_usage()
    return {key: int(first.get(key, 0)) + int(second.get(key, 0)) for key in ("input_tokens", "output_tokens")}
