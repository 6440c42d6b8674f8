"""`tt-agent demo memory`: a fact told in one thread is used in another thread of the same user, not of another user.

The user ids are new on every run (printed), so runs on the same store do not mix.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from agent.cli.app import console, rerun_hint
from agent.cli.printing import send_turn
from agent.views import memories_table, short_id

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

FACT = "I'm vegetarian"
QUESTION = "Can you suggest a place for dinner tonight?"


def run_memory_demo(agent: LangGraphResponsesAgent, database_url: str | None) -> None:
    """Save a fact in thread A, see it used in thread B, not for another user; list it; forget it."""
    run = uuid.uuid4().hex[:6]
    user, stranger = f"demo-user-{run}", f"demo-stranger-{run}"
    console.print(
        Panel.fit(
            f"Store: [bold]{escape(agent.info().store)}[/]   "
            f"Model: [bold]{escape(agent.info().model)}[/]   "
            f"Memory scope: [bold]{agent.settings.memory_scope}[/]\n"
            f"User: [bold]{user}[/]. Long-term memories belong to a user and outlive the thread that taught them.",
            title="timetravel-agent long-term memory demo",
        )
    )
    _step(1, "Thread A: the user tells the agent a fact to remember (the model calls save_memory).")
    first = send_turn(agent, f"Remember that {FACT}", echo=True, user_id=user)

    _step(2, "Thread B, a new conversation of the same user: the memory is given to the model before the turn.")
    second = send_turn(agent, QUESTION, echo=True, user_id=user)
    _check(FACT in second["text"] and second["thread_id"] != first["thread_id"], "The answer in thread B uses the fact told in thread A.")

    _step(3, "Another user asks the same: memories are the user's own.")
    third = send_turn(agent, QUESTION, echo=True, user_id=stranger)
    _check(FACT not in third["text"], "The other user's answer knows nothing of it.")

    _step(4, "The user's memories, with the thread and checkpoint whose turn saved each one.")
    memories = agent.list_memories(user)
    console.print(memories_table(memories, title=f"Memories of {user}"))
    if memories:
        console.print(
            Text(f"  saved by thread {memories[0]['thread_id']}, checkpoint {short_id(memories[0]['checkpoint_id'])}", style="dim")
        )

    _step(5, "Forgetting: the model calls forget_memory; the next thread has nothing to recall.")
    send_turn(agent, f"Forget that {FACT}", echo=True, user_id=user)
    last = send_turn(agent, "What do you remember about me?", echo=True, user_id=user)
    _check(FACT not in last["text"] and not agent.list_memories(user), "The fact is gone.")
    again = rerun_hint(["memories", "--user-id", user], database_url)
    if again is None:
        hint = "The memories lived in memory:// and ended with the demo; use a file or Postgres store to keep them."
    else:
        hint = f"List a user's memories with: {again}"
    console.print(Text(f"\n{hint}", style="dim"))


def _step(number: int, text: str) -> None:
    console.print(Text.assemble(("\n" + f"{number}. ", "bold magenta"), (text, "bold")))


def _check(ok: bool, text: str) -> None:
    if ok:
        console.print(f"  [green]✓[/] {escape(text)}")
    else:
        console.print(f"  [yellow]![/] Not as expected: {escape(text)} (a real model may phrase it differently).")
