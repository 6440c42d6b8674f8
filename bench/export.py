"""Export benchmark: the size of a thread document against its messages, and the round trip to the other backend.

Usage::

    python -m bench.export [--quick] [--json out.json] [--database-url URL]

The Postgres server comes from `--database-url`, else `AGENT_TEST_DATABASE_URL`,
else `postgresql://postgres@127.0.0.1:5432/postgres`; the run uses one scratch
database (`tt_export_<hex>`), dropped at the end whatever happens, and a SQLite
file in a temporary directory. The agent runs in this process
(`create_agent(url, model="offline", tracing=False)`).

Threads, built on Postgres (user messages of `user_message_bytes` ASCII bytes
drawn from a vocabulary, the offline model's answers):

* **branched**: `turns` (200) turns, then `branches` (20) branches, each an edit
  of a user message at evenly spaced positions (`edit_message_id`) followed by
  `BRANCH_TURNS` more turns, then `set_head` back to the end of the 200 turns
  (the shape of `bench.branches`);
* **the issue's thread**: `issue_turns` (61) turns of 2,000-byte user messages, which
  exported to 6.3 MB in version 1 of the document.

Figures:

1. the branched thread's document (`json.dumps(export_thread(...))`, in bytes) over
   its **messages' own bytes**: the JSON (`json.dumps`, LangChain's `messages_to_dict`
   form, as the document holds them) of each distinct message of the thread once,
   distinct meaning another id or another content; target <= 1.5;
2. the same thread as version 1 wrote it (every checkpoint's whole values), for reference;
3. the bytes a checkpoint costs besides its messages: the document minus the messages'
   own bytes, per checkpoint (ids, timestamp, metadata, LangGraph's channel versions);
4. the issue's thread's document over its messages' own bytes, for reference, and against `max_request_bytes` (the `import_thread`
   action's limit, 1,000,000 bytes by default): target, it fits;
5. export and import times of the branched thread (the import into a SQLite file), for
   reference; the import is checked: history, every checkpoint's messages and the branches
   read the same in SQLite as in Postgres, or the run fails.

Output: a table `figure | measured | target | pass` and `targets met: X/Y`; `--json`
also saves every measurement. Exit code 0 even when a target is missed; 1 when the
benchmark failed; 2 when Postgres cannot be reached.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.databases import scratch_database, server_version

#: Turns on each branch after its edit.
BRANCH_TURNS = 2
VOCABULARY = "trip city museum train hotel dinner flight ticket beach river market bridge castle garden".split()
#: The issue's target: a document of at most this many times its messages' own bytes.
RATIO_TARGET = 1.5
#: Bytes of each user message of the issue's thread.
ISSUE_MESSAGE_BYTES = 2000


@dataclass(frozen=True)
class Sizes:
    turns: int = 200
    branches: int = 20
    user_message_bytes: int = 500
    issue_turns: int = 61


QUICK = Sizes(turns=12, branches=3, issue_turns=4)


def figures(sizes: Sizes) -> dict[str, report.Figure]:
    """Every figure of the report, in table order."""
    shape = f"{sizes.turns}-turn thread with {sizes.branches} branches"
    return {
        "document_ratio": report.Figure(
            f"document / its messages' own bytes, {shape}", f"<= {RATIO_TARGET:g}", lambda v: v <= RATIO_TARGET, report.fixed(2)
        ),
        "version_1_ratio": report.Figure("the same in version 1 (whole lists) / messages' own bytes", fmt=report.fixed(1)),
        "checkpoint_bytes": report.Figure("document bytes per checkpoint besides its messages", fmt=report.fixed(0)),
        "issue_ratio": report.Figure(
            f"document / its messages' own bytes, {sizes.issue_turns} turns of {ISSUE_MESSAGE_BYTES}-byte messages",
            fmt=report.fixed(2),
        ),
        "issue_fits": report.Figure(
            f"{sizes.issue_turns} turns of {ISSUE_MESSAGE_BYTES}-byte messages: document / max_request_bytes",
            "< 1 (the import_thread action takes it)",
            lambda v: v < 1,
            report.fixed(2),
        ),
        "export_ms": report.Figure(f"export_thread of the {shape}", fmt=report.fixed(0, " ms")),
        "import_ms": report.Figure("import_thread of it into a SQLite file", fmt=report.fixed(0, " ms")),
    }


def user_message(rng: random.Random, n: int, size: int) -> str:
    text = f"turn {n}:"
    while len(text) < size:
        text += " " + rng.choice(VOCABULARY)
    return text[:size]


def own_bytes(document: dict[str, Any]) -> int:
    """The JSON of each distinct message of the thread once (another id or another content is another message)."""
    from langchain_core.messages import messages_to_dict

    from agent.operations.transfer import parse_document

    distinct = {json.dumps(d, sort_keys=True): d for ms in parse_document(document).messages.values() for d in messages_to_dict(ms)}
    return sum(len(json.dumps(d)) for d in distinct.values())


def version_1_bytes(document: dict[str, Any]) -> int:
    """The document's size in version 1: every checkpoint's values whole, as that version wrote them."""
    from agent.operations.transfer import parse_document
    from agent.operations.transfer.export import encode_value

    restored = parse_document(document)
    checkpoints = []
    for checkpoint in document["checkpoints"]:
        values = restored.values[checkpoint["checkpoint_id"]]
        whole = {channel: encode_value(channel, value, checkpoint["checkpoint_id"]) for channel, value in values.items()}
        checkpoints.append({"updated_channels": None, "pending_writes": [], **checkpoint, "channel_values": whole})
    # The summary fields version 1 also wrote into each checkpoint's metadata are left out: a lower bound.
    return len(json.dumps({**document, "version": 1, "checkpoints": checkpoints}))


class ExportBenchmark:
    def __init__(self, agent: Any, sizes: Sizes) -> None:
        self.agent = agent
        self.sizes = sizes
        self.rng = random.Random(11)

    def say(self, text: str, **custom_inputs: Any) -> dict:
        return self.agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom_inputs}).custom_outputs

    def branched(self) -> str:
        sizes = self.sizes
        texts = [user_message(self.rng, n, sizes.user_message_bytes) for n in range(sizes.turns)]
        thread_id = self.say(texts[0])["thread_id"]
        for text in texts[1:]:
            self.say(text, thread_id=thread_id)
        main_head = self.agent.storage.get_thread(thread_id).head_checkpoint_id
        users = [item for item in self.agent.get_checkpoint_state(thread_id)["messages"] if item["role"] == "user"]
        step = max(1, len(users) // sizes.branches)
        for k in range(sizes.branches):
            target = users[(k * step) % len(users)]
            self.say(f"edited {k}: " + texts[k % len(texts)], thread_id=thread_id, checkpoint_id=main_head,
                     edit_message_id=target["id"])  # fmt: skip
            for t in range(BRANCH_TURNS):
                self.say(user_message(self.rng, 1000 * k + t, sizes.user_message_bytes), thread_id=thread_id)
        self.agent.set_head(thread_id, main_head)
        return thread_id

    def issue_thread(self) -> str:
        thread_id = self.say(user_message(self.rng, 0, ISSUE_MESSAGE_BYTES))["thread_id"]
        for n in range(1, self.sizes.issue_turns):
            self.say(user_message(self.rng, n, ISSUE_MESSAGE_BYTES), thread_id=thread_id)
        return thread_id


def read_back(agent: Any, thread_id: str) -> dict[str, Any]:
    """What must read the same after the round trip: history, every checkpoint's messages, branches."""
    history = agent.get_checkpoint_history(thread_id, limit=1000)
    return {
        "history": history,
        "messages": {e["checkpoint_id"]: agent.get_checkpoint_state(thread_id, e["checkpoint_id"])["messages"] for e in history},
        "branches": agent.list_branches(thread_id),
    }


def measure(source: Any, target: Any, sizes: Sizes) -> tuple[dict[str, float], dict[str, Any]]:
    bench = ExportBenchmark(source, sizes)
    thread_id = bench.branched()
    issue_id = bench.issue_thread()
    started = time.perf_counter()
    document = source.export_thread(thread_id)
    export_s = time.perf_counter() - started
    text = json.dumps(document)
    started = time.perf_counter()
    target.import_thread(json.loads(text))
    import_s = time.perf_counter() - started
    if read_back(target, thread_id) != read_back(source, thread_id):
        raise AssertionError("the imported thread does not read back as the exported one")
    own = own_bytes(document)
    issue_document = source.export_thread(issue_id)
    issue_bytes = len(json.dumps(issue_document))
    values = {
        "document_ratio": len(text) / own,
        "version_1_ratio": version_1_bytes(document) / own,
        "checkpoint_bytes": (len(text) - own) / len(document["checkpoints"]),
        "issue_ratio": issue_bytes / own_bytes(issue_document),
        "issue_fits": issue_bytes / source.settings.max_request_bytes,
        "export_ms": export_s * 1000,
        "import_ms": import_s * 1000,
    }
    measurements = {
        "document_bytes": len(text),
        "own_message_bytes": own,
        "checkpoints": len(document["checkpoints"]),
        "issue_document_bytes": issue_bytes,
        "max_request_bytes": source.settings.max_request_bytes,
    }
    return values, measurements


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run the benchmark on a scratch database of the Postgres server at `server_url`; return the report.

    The report is `bench.report.build_report`'s, with `settings`, `measurements` (bytes and counts)
    and `error` (None, or the failure's traceback; its figures are then None).
    """
    from agent import create_agent

    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url))
    started = time.perf_counter()
    values: dict[str, float] = {}
    measurements: dict[str, Any] = {}
    error = None
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tt-export-") as tmp,
            scratch_database(server_url, "tt_export") as url,
            create_agent(url, model="offline", tracing=False) as source,
            create_agent(f"sqlite:///{Path(tmp) / 'import.sqlite'}", model="offline", tracing=False) as target,
        ):
            values, measurements = measure(source, target, sizes)
    except Exception:  # noqa: BLE001 - reported: the figures say "not measured"
        error = traceback.format_exc()
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes), "branch_turns": BRANCH_TURNS,
                  "issue_message_bytes": ISSUE_MESSAGE_BYTES},  # fmt: skip
        measurements=measurements,
        error=error,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    sizes = result["settings"]["sizes"]
    report.print_report(
        f"Export: thread documents against their messages ({sizes['turns']} turns, {sizes['branches']} branches, "
        f"{sizes['user_message_bytes']}-byte user messages; Postgres to SQLite)",
        result,
    )


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="small threads (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())
