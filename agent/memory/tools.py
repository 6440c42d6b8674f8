"""The memory tools the model calls: `save_memory`, `search_memories`, `forget_memory`, for the turn's user.

They act for the `user_id` of the turn (`TurnContext`), never one the model
names. A tool never writes: `save_memory` and `forget_memory` return their
operation as the tool result's `artifact`, and the turn's commit applies the
artifacts of the results it commits (`Memories.write_turn`). Without a user_id
they answer that long-term memory is off, so the model can say so.
"""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base.id import uuid6
from langgraph.prebuilt import InjectedState

from agent.context import turn_context
from agent.errors import ModelError
from agent.memory import FORGET_MEMORY_TOOL, SAVE_MEMORY_TOOL, SEARCH_MEMORIES_TOOL
from agent.memory.scopes import ARTIFACT_KIND, saved_on_branch
from agent.memory.service import Memories

#: Longest memory `save_memory` accepts, in characters.
MAX_MEMORY_CHARS = 1000
#: Most memories `search_memories` returns.
SEARCH_LIMIT = 10

NO_USER = (
    "error: long-term memory is off in this conversation because the request has no user_id "
    "(custom_inputs.user_id or context.user_id); nothing was saved, searched or forgotten"
)


def memory_tools(memories: Memories) -> list[BaseTool]:
    """The three memory tools over `memories`, for binding to the model and running in the graph's ToolNode."""

    @tool(SAVE_MEMORY_TOOL, response_format="content_and_artifact")
    def save_memory(
        content: str, config: RunnableConfig, state: Annotated[dict, InjectedState], memory_id: str = ""
    ) -> tuple[str, dict | None]:
        """Save one lasting fact about the user (a preference, a plan, a detail of their life) to long-term
        memory, so that later conversations can use it. One short sentence per call, such as "I'm vegetarian".
        To change a memory you were given (the fact changed), pass its `memory_id`: the new text supersedes it.
        Returns the memory's id, or a message starting with "error: "."""
        user_id = _user_id(config)
        if user_id is None:
            return NO_USER, None
        text = " ".join(content.split()) if isinstance(content, str) else ""
        if not text:
            return "error: the memory is empty; nothing was saved", None
        if len(text) > MAX_MEMORY_CHARS:
            return f"error: the memory is longer than {MAX_MEMORY_CHARS} characters; nothing was saved", None
        if not text.isprintable():  # NUL and other control characters (Postgres's jsonb refuses NUL)
            return "error: the memory holds control characters; nothing was saved", None
        try:
            text.encode("utf-8")
            memories.prepare(text)
        except UnicodeEncodeError:
            return "error: the memory is not valid Unicode; nothing was saved", None
        except ModelError as exc:
            return f"error: {exc.message}", None
        version_id = str(uuid6())
        if isinstance(memory_id, str) and memory_id.strip():
            branch_only = memories.settings.memory_scope == "branch"
            changed = memories.find(user_id, memory_id.strip(), visible_messages=state["messages"] if branch_only else None)
            if changed is None:
                return f"error: there is no memory {memory_id.strip()[:100]!r}; nothing was saved", None
            return (
                f"Changed long-term memory {changed.memory_id} (kept when this turn completes): {text}",
                {ARTIFACT_KIND: "save", "memory_id": changed.memory_id, "version_id": version_id, "content": text,
                 "supersedes": changed.version},
            )  # fmt: skip
        return (
            f"Saved to long-term memory as {version_id} (kept when this turn completes): {text}",
            {ARTIFACT_KIND: "save", "memory_id": version_id, "content": text},
        )

    @tool(SEARCH_MEMORIES_TOOL)
    def search_memories(config: RunnableConfig, state: Annotated[dict, InjectedState], query: str = "") -> str:
        """Search the user's long-term memories (facts saved in earlier conversations). `query`: words to look
        for; empty lists the newest memories. Returns one memory per line as "[memory_id] content"."""
        user_id = _user_id(config)
        if user_id is None:
            return NO_USER
        found = memories.search(user_id, query if isinstance(query, str) else "", limit=SEARCH_LIMIT, visible=state["messages"])
        if not found:
            return "No memories found"
        return "\n".join(f"[{memory.memory_id}] {memory.content}" for memory in found)

    @tool(FORGET_MEMORY_TOOL, response_format="content_and_artifact")
    def forget_memory(memory_id: str, config: RunnableConfig, state: Annotated[dict, InjectedState]) -> tuple[str, Any]:
        """Delete one of the user's long-term memories, by the memory_id shown with it. Returns what was
        forgotten, or a message starting with "error: "."""
        user_id = _user_id(config)
        if user_id is None:
            return NO_USER, None
        if not isinstance(memory_id, str) or not memory_id.strip() or len(memory_id) > 100:
            return "error: memory_id must be the id of one of the user's memories; nothing was forgotten", None
        saved_here = memory_id in saved_on_branch(state["messages"])
        branch_only = memories.settings.memory_scope == "branch"
        memory = memories.find(user_id, memory_id, visible_messages=state["messages"] if branch_only else None)
        if branch_only:
            saved_here = saved_here or memory is not None
        if (memory is None and not saved_here) or (branch_only and not saved_here):
            return f"error: there is no memory {memory_id!r}; nothing was forgotten", None
        what = memory.content if memory is not None else "a memory saved in this turn"
        return (
            f"Forgotten (when this turn completes): {what}",
            {ARTIFACT_KIND: "forget", "memory_id": memory_id},
        )

    return [save_memory, search_memories, forget_memory]


def _user_id(config: RunnableConfig) -> str | None:
    context = turn_context(config)
    return context.user_id if context is not None else None
