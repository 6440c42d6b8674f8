"""Builders for the reliability and security tests: chat models that block or fail on cue,
a thread's committed messages, row counts per table, throwaway Postgres databases, child processes.

The chat models are the only stand-ins; every database here is real.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from psycopg import sql

from agent.models import OfflineChatModel
from tests.helpers import REPO_ROOT
from tests.helpers.offline import without_input_note
from tests.helpers.preloaded import start_source
from tests.helpers.scenario import say
from tests.helpers.databases import dbname_of, fresh_database, with_dbname  # noqa: F401 - used by the tests

#: The tables that hold a thread's rows, per backend (each has a `thread_id` column).
POSTGRES_THREAD_TABLES = (
    "checkpoints", "checkpoint_blobs", "checkpoint_writes", "agent_threads", "agent_claims", "agent_idempotency",
)  # fmt: skip
SQLITE_THREAD_TABLES = ("checkpoints", "writes", "agent_threads", "agent_claims", "agent_idempotency", "agent_checkpoint_ids")

#: Seconds a test waits for something that should happen at once; only a hang reaches it.
HANG_TIMEOUT = 60


def _last_human_text(messages: Sequence[BaseMessage]) -> str:
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    return humans[-1].text if humans else ""


class GatedChatModel(OfflineChatModel):
    """The offline model, except that a call whose last user message contains `block_on` first sets
    `entered` and then waits until `gate` is set (at most `HANG_TIMEOUT` seconds).

    Other calls answer at once, so a turn can be held inside the model while others run.
    With `mid_stream`, a streamed call sends its first chunk before it waits (a turn held
    half-way through its reply); a whole (unstreamed) call waits before it answers either way.
    Every call adds 1 to `calls[0]`, and every held call releases `arrivals` (a Semaphore),
    so a test can count model calls and wait until N turns are inside the model.
    """

    gate: Any = None
    entered: Any = None
    block_on: str = "block"
    mid_stream: bool = False
    # Any, not list: pydantic would copy a list, and the copies bind_tools makes would count apart.
    calls: Any = None
    arrivals: Any = None

    def _held(self, messages: Sequence[BaseMessage]) -> bool:
        self.calls[0] += 1
        return self.block_on in _last_human_text(messages)

    def _arrive(self) -> None:
        self.entered.set()
        self.arrivals.release()

    def _wait(self) -> None:
        self._arrive()
        if not self.gate.wait(HANG_TIMEOUT):
            raise TimeoutError("the test never opened the gate")

    async def _await(self) -> None:
        # Polled, not awaited in a thread: a cancelled turn must leave nothing waiting behind.
        self._arrive()
        for _ in range(HANG_TIMEOUT * 100):
            if self.gate.is_set():
                return
            await asyncio.sleep(0.01)
        raise TimeoutError("the test never opened the gate")

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        if self._held(messages):
            self._wait()
        return super()._generate(messages, stop, run_manager, **kwargs)

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        held = self._held(messages)
        chunks = super()._stream(messages, stop, run_manager, **kwargs)
        if held and self.mid_stream:
            yield next(chunks)
        if held:
            self._wait()
        yield from chunks

    # The async path (the HTTP server) waits without blocking the event loop, as a real HTTP call would.
    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        if self._held(messages):
            await self._await()
        return await super()._agenerate(messages, stop, run_manager, **kwargs)

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        held = self._held(messages)
        first = True
        if held and not self.mid_stream:
            await self._await()
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk
            if first and held and self.mid_stream:
                await self._await()
            first = False


def gated_model(**fields: Any) -> GatedChatModel:
    """A `GatedChatModel` with a fresh closed gate, a fresh `entered` event and its counters at 0."""
    return GatedChatModel(
        gate=threading.Event(), entered=threading.Event(), calls=[0], arrivals=threading.Semaphore(0), **fields
    )


class FailingChatModel(OfflineChatModel):
    """The offline model, except that its next `failures[0]` calls raise `RuntimeError` (counting down).

    `failures` is a one-element list shared by the copies `bind_tools` makes.
    Calls that return a tool call are exempt when `fail_after_tool_call` is set,
    so a turn can fail half-way: after the tool ran, before the final reply.
    """

    # Any, not list: pydantic would copy a list, and the test could no longer arm the model.
    failures: Any = None
    fail_after_tool_call: bool = False

    def _maybe_fail(self, messages: Sequence[BaseMessage]) -> None:
        reply = self._reply(list(messages))
        if self.fail_after_tool_call and reply.tool_calls:
            return
        if self.failures and self.failures[0] > 0:
            self.failures[0] -= 1
            raise RuntimeError("the chat model is down (injected)")

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self._maybe_fail(messages)
        return super()._generate(messages, stop, run_manager, **kwargs)

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        self._maybe_fail(messages)
        yield from super()._stream(messages, stop, run_manager, **kwargs)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        self._maybe_fail(messages)
        return await super()._agenerate(messages, stop, run_manager, **kwargs)

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        self._maybe_fail(messages)
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk


def head_messages(agent, thread_id: str) -> list[BaseMessage]:
    """The messages of the thread's committed head checkpoint (empty for an unknown thread)."""
    record = agent.storage.get_thread(thread_id)
    if record is None:
        return []
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": record.head_checkpoint_id}}
    return list(agent.graph.get_state(config).values.get("messages", []))


def user_texts(messages: Sequence[BaseMessage]) -> list[str]:
    """The texts of the user messages, in order."""
    return [m.text for m in messages if isinstance(m, HumanMessage)]


def assert_each_user_message_followed_by_its_reply(messages: Sequence[BaseMessage]) -> None:
    """Every user message is directly followed by the offline model's reply to it (no interleaving).

    The offline model quotes the user messages it saw, oldest first, so its reply
    to a message ends with that message, quoted.
    """
    for index, message in enumerate(messages):
        if isinstance(message, HumanMessage):
            assert index + 1 < len(messages), f"user message {message.text!r} has no reply"
            reply = messages[index + 1]
            assert isinstance(reply, AIMessage), f"user message {message.text!r} is followed by {reply!r}"
            quote = without_input_note(reply.text)
            assert quote.endswith(f'"{message.text}"'), f"reply to {message.text!r} is {reply.text!r}"


def assert_linear_chain(start: str, steps: Sequence[tuple[str, str]]) -> None:
    """`steps` ((parent, checkpoint) pairs, any order) form one chain starting at `start`.

    That holds when turns were serialized: each started from the previous one's checkpoint.
    """
    children = {}
    for parent, child in steps:
        assert parent not in children, f"two turns started from checkpoint {parent}"
        children[parent] = child
    current, walked = start, 0
    while current in children:
        current, walked = children[current], walked + 1
    assert walked == len(steps), f"the chain from {start} covers {walked} of {len(steps)} turns"


# --- rows -----------------------------------------------------------------------------------


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path(url: str) -> str:
    return url[len("sqlite:///") :]


def thread_rows(url: str, thread_id: str) -> dict[str, int]:
    """Rows per table that belong to `thread_id`, read on a separate connection."""
    if is_postgres(url):
        with psycopg.connect(url) as conn:
            return {
                table: conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE thread_id = %s").format(sql.Identifier(table)), (thread_id,)
                ).fetchone()[0]
                for table in POSTGRES_THREAD_TABLES
            }
    with sqlite3.connect(sqlite_path(url)) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread_id,)).fetchone()[0]
            for table in SQLITE_THREAD_TABLES
        }


def all_rows(url: str) -> dict[str, int]:
    """Rows per table over all threads (to prove a refused request wrote nothing)."""
    tables = POSTGRES_THREAD_TABLES if is_postgres(url) else SQLITE_THREAD_TABLES
    if is_postgres(url):
        with psycopg.connect(url) as conn:
            return {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0] for t in tables}
    with sqlite3.connect(sqlite_path(url)) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


# --- Postgres -------------------------------------------------------------------------------


def terminate_backends(server_url: str, dbname: str) -> int:
    """`pg_terminate_backend` every connection to `dbname` but this admin one; returns how many."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


# --- child processes ------------------------------------------------------------------------


class Child:
    """A Python child process running `code` with `args` (in sys.argv[1:]), speaking JSON lines.

    The code runs in phases. Before each phase it prints `"ready"` and waits
    for a line on stdin, so several children can be released at the same
    moment (`release_together`); during the phase it prints one JSON value per
    result, and after it `"done"`.
    """

    def __init__(self, code: str, *args: str) -> None:
        # Forked from the preloaded server (`preloaded`): a new interpreter spent about 3 s of CPU importing
        # the agent, and the suite starts dozens of children. stderr goes to a file: a pipe nobody reads
        # could fill up and block the child.
        self._stderr = tempfile.NamedTemporaryFile(mode="w+", prefix="tt-child-stderr-")  # noqa: SIM115 - kept open
        self.process = start_source(code, args, cwd=REPO_ROOT, env=dict(os.environ), stderr_path=self._stderr.name)
        # A reader thread, so that a child that hangs fails the test instead of hanging it.
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()

    def _read_lines(self) -> None:
        for line in self.process.lines():
            self._lines.put(line)
        self._lines.put("")

    def _line(self) -> Any:
        try:
            line = self._lines.get(timeout=HANG_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"child said nothing for {HANG_TIMEOUT} s (hung)") from None
        if not line:
            self.process.wait()
            raise RuntimeError(f"child exited with {self.process.returncode}:\n{self.stderr()}")
        return json.loads(line)

    def next_value(self) -> Any:
        """The next JSON value the child prints; raise if it exits or hangs first."""
        return self._line()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def wait_ready(self) -> None:
        line = self._line()
        if line != "ready":
            raise RuntimeError(f"child said {line!r} instead of ready")

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def phase_results(self) -> list[Any]:
        """Every JSON value the child printed until `"done"`."""
        results = []
        while (line := self._line()) != "done":
            results.append(line)
        return results

    def results_until_exit(self) -> list[Any]:
        """Every JSON value the child printed until it exited; raise if it failed or hangs."""
        results = []
        while True:
            try:
                line = self._lines.get(timeout=HANG_TIMEOUT)
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"child said nothing for {HANG_TIMEOUT} s (hung)") from None
            if not line:
                break
            results.append(json.loads(line))
        self.finish()
        return results

    def finish(self) -> None:
        """Wait for the child to exit; raise if it failed or hangs."""
        try:
            self.process.wait(timeout=HANG_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("child hung") from None
        if self.process.returncode != 0:
            raise RuntimeError(f"child exited with {self.process.returncode}:\n{self.stderr()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def release_together(children: Sequence[Child], phases: int = 1) -> list[list[list[Any]]]:
    """Run `phases` phases: each time wait until every child is ready, release them all at once,
    and collect each one's results. Returns results[phase][child]."""
    try:
        results = []
        for _ in range(phases):
            for child in children:
                child.wait_ready()
            for child in children:
                child.go()
            results.append([child.phase_results() for child in children])
        for child in children:
            child.finish()
        return results
    finally:
        for child in children:
            child.kill()


def history_ids(agent, thread_id: str) -> list[str]:
    """The thread's checkpoint ids, newest first (up to 100)."""
    return [h["checkpoint_id"] for h in agent.get_checkpoint_history(thread_id, limit=100)]


def timed(call) -> tuple[BaseException | None, float]:
    """Run `call()`: (what it raised, or None; the seconds it took)."""
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def turn_with_fault(agent, model, fault, text: str, **custom_inputs):
    """A turn of `text` whose model call (a `gated_model`'s) is held while `fault()` runs, then let go: the
    turn's response, or what it raised."""
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(say, agent, text, **custom_inputs)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            fault()
        finally:
            model.gate.set()
        return in_flight.result(timeout=HANG_TIMEOUT)
