"""`tt-agent chat`: an interactive session; slash commands browse and branch the thread."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.text import Text

from agent.cli import (
    MAX_LISTED,
    DatabaseUrl,
    Model,
    Tracing,
    UserId,
    agent_errors,
    app,
    console,
    open_agent,
    store_label,
)
from agent.cli.printing import send_turn
from agent.views import branch_tree, history_table, last_message, short_id

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

CHAT_HELP = """\
Commands:
  /history [N] [full]   the thread's last N checkpoints (default 10); "full" shows whole ids
  /tree                 the thread's checkpoints as a branch tree
  /branch <id>          start the next message from this checkpoint (full id or short id)
  /thread <id>          switch to another thread (a new id starts a new thread)
  /new                  start a new thread with the next message
  /help                 this help
  /quit                 leave (also Ctrl-D)
Anything else is sent to the agent."""


@app.command()
def chat(
    database_url: DatabaseUrl = None,
    model: Model = None,
    thread_id: Annotated[
        str | None, typer.Option("--thread-id", metavar="ID", help="Continue this thread. Unset: a new one.")
    ] = None,
    user_id: UserId = None,
    tracing: Tracing = False,
) -> None:
    """Talk to the agent. Type /help for /history, /branch, /thread, /new and /quit."""
    store = store_label(database_url)
    with agent_errors(store=store), open_agent(database_url, model, tracing) as agent:
        _Chat(agent, thread_id=thread_id, user_id=user_id, store=store).run()


class _Chat:
    """The REPL's state: the current thread and the checkpoint the next message branches from."""

    def __init__(
        self, agent: LangGraphResponsesAgent, *, thread_id: str | None, user_id: str | None, store: str
    ) -> None:
        self.agent = agent
        self.store = store
        self.thread_id = thread_id
        self.user_id = user_id
        self.branch_from: str | None = None
        # Piped input is not shown by the terminal; echo it so the transcript reads like a session.
        self.echo = not sys.stdin.isatty()

    def run(self) -> None:
        where = f"thread {self.thread_id}" if self.thread_id else "a new thread"
        console.print(Text.assemble(("tt-agent chat", "bold"), f" on {where}. Type /help for commands, /quit to leave."))
        info = self.agent.info()
        console.print(Text(f"Store: {info.store}   Model: {info.model}", style="dim"))
        while True:
            try:
                line = console.input("[bold cyan]you ›[/] ")
            except (EOFError, KeyboardInterrupt):
                console.print()
                return
            if self.echo:
                console.print(line, markup=False)
            line = line.strip()
            if not line:
                continue
            with agent_errors(exit_on_error=False, to=console, store=self.store):
                if line.startswith("/"):
                    if not self.command(line):
                        return
                else:
                    self.send(line)

    def send(self, text: str) -> None:
        try:
            result = send_turn(
                self.agent, text, thread_id=self.thread_id, checkpoint_id=self.branch_from, user_id=self.user_id
            )
        except KeyboardInterrupt:
            console.print("\n[yellow]Interrupted.[/]")
            return
        self.thread_id = result["thread_id"]
        self.branch_from = None

    def command(self, line: str) -> bool:
        """Run one /command; False means quit."""
        name, *args = line.split()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            console.print(CHAT_HELP, markup=False)
        elif name == "/new":
            self.thread_id, self.branch_from = None, None
            console.print("Your next message starts a new thread.")
        elif name == "/thread":
            self.switch_thread(args)
        elif name == "/history":
            self.show_history(args)
        elif name == "/tree":
            if self.require_thread():
                entries = self.agent.get_checkpoint_history(self.thread_id, limit=MAX_LISTED, user_id=self.user_id)
                console.print(branch_tree(entries, notes=self.notes()))
        elif name == "/branch":
            self.branch(args)
        else:
            console.print(f"[red]Unknown command {escape(name)}.[/] Type /help for the list.")
        return True

    def switch_thread(self, args: list[str]) -> None:
        if len(args) != 1:
            console.print("[red]Usage: /thread <thread_id>[/]")
            return
        from agent.errors import ThreadNotFound

        try:
            entries = self.agent.get_checkpoint_history(args[0], limit=1, user_id=self.user_id)
        except ThreadNotFound:
            entries = []
        self.thread_id, self.branch_from = args[0], None
        if entries:
            console.print(
                f"Switched to thread {escape(args[0])}; its head is checkpoint {short_id(entries[0]['checkpoint_id'])} "
                f"({entries[0]['message_count']} messages)."
            )
        else:
            # Another user's thread looks the same as a missing one (agent.threads.authorize).
            console.print(
                f"Switched to thread {escape(args[0])}; it has no checkpoints you can see in the store "
                f"{escape(self.store)}, so your next message starts it."
            )

    def show_history(self, args: list[str]) -> None:
        if not self.require_thread():
            return
        full = "full" in args
        numbers = [a for a in args if a != "full"]
        try:
            limit = int(numbers[0]) if numbers else 10
        except ValueError:
            console.print("[red]Usage: /history [N] [full][/]")
            return
        entries = self.agent.get_checkpoint_history(self.thread_id, limit=limit, user_id=self.user_id)
        console.print(history_table(entries, title=f"Thread {self.thread_id}", full_ids=full, notes=self.notes()))

    def branch(self, args: list[str]) -> None:
        if len(args) != 1:
            console.print("[red]Usage: /branch <checkpoint_id>[/] (a full id or the short id from /history)")
            return
        if not self.require_thread():
            return
        entries = self.agent.get_checkpoint_history(self.thread_id, limit=MAX_LISTED, user_id=self.user_id)
        checkpoint_id = _resolve(entries, self.thread_id, args[0])
        self.branch_from = checkpoint_id
        message = Text(f"Your next message starts a branch from checkpoint {short_id(checkpoint_id)}")
        entry = next((e for e in entries if e["checkpoint_id"] == checkpoint_id), None)
        if entry is not None:
            message.append(f" ({entry['message_count']} messages; last: {last_message(entry)!r})")
        console.print(message)

    def require_thread(self) -> bool:
        if self.thread_id is None:
            console.print("[red]No thread yet:[/] send a message first, or /thread <id>.")
            return False
        return True

    def notes(self) -> dict[str, str]:
        return {self.branch_from: "next message branches from here"} if self.branch_from else {}



def _resolve(entries: list[dict], thread_id: str, ref: str) -> str:
    from agent.operations.history import resolve_checkpoint_ref  # imported on use: it loads LangGraph

    return resolve_checkpoint_ref(entries, thread_id, ref)
