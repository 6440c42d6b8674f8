"""`tt-agent chat`: an interactive session; slash commands browse and branch the thread."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from agent.cli.app import MAX_LISTED, AgentFile, DatabaseUrl, Model, Tracing, UserId, agent_errors, app, console
from agent.cli.stores import open_agent, store_label
from agent.cli.printing import send_turn
from agent.views import (
    branch_tree,
    branches_table,
    diff_view,
    history_table,
    last_message,
    short_id,
    state_view,
)

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

CHAT_HELP = """\
Commands:
  /show [id]            the messages of the head (or of checkpoint id), numbered, with ‹i/n› alternatives
  /edit <n> <text>      send text in place of message n of /show (a sibling branch; the first message too)
  /regen [n]            regenerate answer n of /show (default: the last answer): a sibling answer
  /branches             the thread's branches (one per leaf), newest first
  /switch <id>          make checkpoint id the head (no new checkpoint); the next message continues there
  /fork                 copy this branch (up to the head, or /branch's checkpoint) into a new thread
  /diff <a> <b>         what two checkpoints have in common, and the messages only each has
  /history [N] [full]   the thread's last N checkpoints (default 10); "full" shows whole ids
  /tree                 the thread's checkpoints as a branch tree
  /branch <id>          start the next message from this checkpoint (full id or short id)
  /resume <value>       answer the question the agent waits on (JSON, else plain text: /resume yes);
                        with several waiting, /resume <interrupt id> <value> answers one
  /cancel [text]        leave the question unanswered: send text (or your next message) past it
  /thread <id>          switch to another thread (a new id starts a new thread)
  /new                  start a new thread with the next message
  /help                 this help
  /quit                 leave (also Ctrl-D)
Ids: a full checkpoint id or its last 8 characters. Anything else is sent to the agent."""


@app.command()
def chat(
    database_url: DatabaseUrl = None,
    model: Model = None,
    thread_id: Annotated[
        str | None, typer.Option("--thread-id", metavar="ID", help="Continue this thread. Unset: a new one.")
    ] = None,
    user_id: UserId = None,
    tracing: Tracing = False,
    agent_file: AgentFile = None,
) -> None:
    """Talk to the agent. Type /help for /show, /edit, /regen, /branches, /switch, /fork, /diff, /resume and more."""
    store = store_label(database_url)
    with agent_errors(store=store), open_agent(database_url, model, tracing, responses=True, agent_file=agent_file) as agent:
        # An agent file may choose its own store: name the one it opened.
        _Chat(agent, thread_id=thread_id, user_id=user_id, store=agent.info().store).run()


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
        #: The graph's questions the last turn stopped at (custom_outputs.interrupts), for /resume.
        self.pending: list[dict[str, Any]] = []
        #: The next message goes past a pending question (/cancel).
        self.cancel_next = False
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

    def send(self, text: str, **options) -> None:
        from agent.errors import InterruptPending

        if self.cancel_next and "resume" not in options:
            options.setdefault("cancel_interrupts", True)
        try:
            result = send_turn(
                self.agent, text, thread_id=self.thread_id, checkpoint_id=self.branch_from, user_id=self.user_id, **options
            )
        except KeyboardInterrupt:
            console.print("\n[yellow]Interrupted.[/]")
            return
        except InterruptPending:
            # The agent's message speaks of custom_inputs; here the answer is a command.
            console.print(
                "[red]The agent waits for your answer first:[/] /resume <value> answers its question; "
                "/cancel <text> sends your message past it. Nothing was written."
            )
            return
        self.thread_id = result["thread_id"]
        self.branch_from = None
        self.pending = list(result.get("interrupts") or [])
        self.cancel_next = False

    def command(self, line: str) -> bool:
        """Run one /command; False means quit."""
        name, *args = line.split()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            console.print(CHAT_HELP, markup=False)
        elif name == "/new":
            self.thread_id, self.branch_from, self.pending = None, None, []
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
        elif name == "/resume":
            if self.require_thread():
                self.resume(line.split(maxsplit=1)[1] if " " in line else "")
        elif name == "/cancel":
            self.cancel(line.split(maxsplit=1)[1].strip() if " " in line else "")
        elif name in BRANCH_COMMANDS:
            if self.require_thread():
                getattr(self, BRANCH_COMMANDS[name])(line.split(maxsplit=1)[1] if " " in line else "")
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
        self.thread_id, self.branch_from, self.pending = args[0], None, []
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

    # -- answering the graph's interrupt() ------------------------------------------------------------
    def resume(self, rest: str) -> None:
        """`/resume <value>` or `/resume <interrupt id> <value>`: the value is JSON if it parses, else the text."""
        rest = rest.strip()
        if not rest:
            console.print("[red]Usage: /resume <value>[/] (JSON such as true or {\"approve\": true}, or text such as yes)")
            return
        first, _, after = rest.partition(" ")
        chosen = [p["id"] for p in self.pending if len(first) >= 4 and p["id"].startswith(first)] if after else []
        if len(chosen) == 1:  # one of several, by (the start of) its id
            self.send("", resume={chosen[0]: _json_or_text(after.strip())})
        else:
            self.send("", resume=_json_or_text(rest))

    def cancel(self, text: str) -> None:
        """`/cancel [text]`: send `text` (or the next message) with cancel_interrupts, leaving the question unanswered."""
        self.cancel_next = True
        if text:
            self.send(text)
        else:
            console.print("Your next message goes past the question, which stays unanswered on its checkpoint.")

    # -- branch operations (the argument is the rest of the line) ------------------------------------
    def show(self, rest: str) -> None:
        checkpoint_id = self.checkpoint(rest) if rest else self.branch_from
        state = self.agent.get_checkpoint_state(self.thread_id, checkpoint_id, user_id=self.user_id)
        console.print(state_view(state))

    def edit(self, rest: str) -> None:
        number, _, text = rest.partition(" ")
        items = self.agent.get_checkpoint_state(self.thread_id, self.branch_from, user_id=self.user_id)["messages"]
        if not number.isdigit() or not 1 <= int(number) <= len(items) or not text.strip():
            console.print(f"[red]Usage: /edit <n> <text>[/], n from 1 to {len(items)} (the numbers of /show)")
            return
        if items[int(number) - 1].get("role") != "user":  # a turn edits user messages (`operations.edits`)
            console.print(f"[red]Message {number} is not yours:[/] /edit changes your messages; /regen {number} asks for another answer.")
            return
        self.send(text.strip(), edit_message_id=items[int(number) - 1]["id"])

    def regen(self, rest: str) -> None:
        if not rest.strip():
            self.send("", regenerate=True)
            return
        items = self.agent.get_checkpoint_state(self.thread_id, self.branch_from, user_id=self.user_id)["messages"]
        number = rest.strip()
        if not number.isdigit() or not 1 <= int(number) <= len(items):
            console.print(f"[red]Usage: /regen \\[n][/], n from 1 to {len(items)} (the number of an answer in /show)")
            return
        self.send("", regenerate_message_id=items[int(number) - 1]["id"])

    def branches(self, rest: str) -> None:
        console.print(branches_table(self.agent.list_branches(self.thread_id, user_id=self.user_id)))

    def switch(self, rest: str) -> None:
        if not rest:
            console.print("[red]Usage: /switch <checkpoint_id>[/] (a full id or a short id from /branches or /history)")
            return
        moved = self.agent.set_head(self.thread_id, self.checkpoint(rest), user_id=self.user_id)
        self.branch_from = None
        console.print(
            f"The head is now checkpoint {short_id(moved['checkpoint_id'])} (was {short_id(moved['previous_checkpoint_id'])}); "
            "your next message continues there."
        )

    def fork(self, rest: str) -> None:
        fork = self.agent.fork_thread(self.thread_id, self.branch_from, user_id=self.user_id)
        console.print(
            f"You are now on thread {fork['thread_id']}, a fork of checkpoint "
            f"{short_id(fork['forked_from']['checkpoint_id'])} of thread {fork['forked_from']['thread_id']}."
        )
        self.thread_id, self.branch_from, self.pending = fork["thread_id"], None, []

    def diff(self, rest: str) -> None:
        refs = rest.split()
        if len(refs) != 2:
            console.print("[red]Usage: /diff <checkpoint_a> <checkpoint_b>[/] (full or short ids)")
            return
        a, b = (self.checkpoint(ref) for ref in refs)
        console.print(diff_view(self.agent.compare_checkpoints(self.thread_id, a, b, user_id=self.user_id)))

    def checkpoint(self, ref: str) -> str:
        entries = self.agent.get_checkpoint_history(self.thread_id, limit=MAX_LISTED, user_id=self.user_id)
        return _resolve(entries, self.thread_id, ref.strip())

    def require_thread(self) -> bool:
        if self.thread_id is None:
            console.print("[red]No thread yet:[/] send a message first, or /thread <id>.")
            return False
        return True

    def notes(self) -> dict[str, str]:
        return {self.branch_from: "next message branches from here"} if self.branch_from else {}



#: Slash commands of the branch operations -> the `_Chat` method that runs them.
BRANCH_COMMANDS = {
    "/show": "show",
    "/edit": "edit",
    "/regen": "regen",
    "/branches": "branches",
    "/switch": "switch",
    "/fork": "fork",
    "/diff": "diff",
}


def _json_or_text(value: str) -> Any:
    """`/resume`'s value: JSON when it parses (`true`, `{"approve": true}`, `"yes"`), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _resolve(entries: list[dict], thread_id: str, ref: str) -> str:
    from agent.operations.history import resolve_checkpoint_ref  # imported on use: it loads LangGraph

    return resolve_checkpoint_ref(entries, thread_id, ref)
