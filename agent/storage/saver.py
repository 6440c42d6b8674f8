"""`TurnSaverMixin`: what the agent adds to LangGraph's savers (buffered turns, message deltas, summaries).

Mixed into `PostgresSaver` and `SqliteSaver` by the backends (`memory://` is the
SQLite one on `:memory:`), which provide the `_backend_*` hooks,
`_fetch_thread_messages` and the transaction statements (`transaction.Tx`):

* **Buffered turns.** While a turn runs (`buffering`), `put`/`put_writes` for
  its thread go to the turn's buffer and `get_tuple` answers from what the
  claim read, so the graph runs without touching the database; the storage's
  commit writes the buffer (`write_turn`) in one transaction. LangGraph itself
  would write a failed step and make it the latest checkpoint even with
  `durability="exit"`.
* **Messages stored once** (`deltas.py`) and a **summary** in each checkpoint's
  metadata (`summaries.py`), with what the turn sent the model and the tokens it
  used (the run's turn report, `summaries.TURN_REPORT_KEY`). The summary leaves
  out the message previews that the checkpoint's own delta gives back
  (`summaries`, "Previews from the delta"): `agent_tuple` and `agent_rows` put
  them back when the agent reads a checkpoint or a listing.
* **A LangGraph checkpointer for any graph.** Outside a turn the saver is an
  ordinary checkpointer (`langgraph-checkpoint-conformance` passes on it, and
  tests/storage/test_foreign_graphs.py runs graphs of other shapes on it): a `messages`
  value that is not a list of LangChain messages is stored as LangGraph would
  store it (only a list of messages is a delta); the summary sits under one
  metadata key (`summaries.SUMMARY_KEY`), so every key a caller wrote is kept;
  channel versions may be int, float or str (`langgraph.checkpoint.base.V`);
  `get_delta_channel_history` walks resolved checkpoints (LangGraph's default),
  so it never returns a stored delta, and its sync and async forms agree.
* **Thread operations that know the deltas and the thread records**
  (`delete_thread`, `prune`, `copy_thread`, `delete_for_runs`), inherited from
  `saver_threads.SaverThreadOperations`, which says why LangGraph's own cannot serve.
* **Encryption at rest** (`agent.encryption`): the saver's serializer is
  LangGraph's `EncryptedSerializer` with the storage's keyring as its cipher
  (`encrypted.KeyringSerializer`), so every blob, the message deltas included,
  is sealed when a key is configured, and the message previews the summary
  stores are sealed with it (`summaries.pack`). A delta is sealed as one blob: the
  encoding, and so the storage's linear growth, is unchanged. The same
  serializer compresses long values first (`compression`).
* **Short channel versions.** LangGraph's Postgres and SQLite savers write a
  version as `f"{n:032}.{random():016}"` (about 50 characters; the random part
  keeps two branches from one parent from writing the same blob key). A
  checkpoint holds five or so versions, and a blob's key one more (and its
  primary-key entry on Postgres another), so on a thread of short messages they
  were a tenth of a turn's storage. `get_next_version` writes `compact_version`:
  a letter giving the counter's length, the counter in base 36, a dot and
  `VERSION_RANDOM_CHARS` random base-36 digits (`c1ab.k3x9q0`, 8 to 11
  characters; the same shape, counter dot random, and the same order within a
  thread: a longer counter has a later letter, and base-36 digits sort as
  their values in ASCII). Versions are compared as text (`max()` and `>` in
  LangGraph's loop), and a thread mixing forms would compare them wrongly, so a
  thread whose versions already have a digit-led form keeps writing it:
  LangGraph's 32 digits, or the 10 digits and 7 hex digits this saver wrote
  before (`LEGACY_DIGITS`). A compact version starts with a letter, those with
  a digit, so the form of `current` tells which to write.
* **No blocking on the event loop.** Every async method either answers from
  memory (a running turn's buffer) or runs the sync method in a worker thread
  (`asyncio.to_thread`): both backends' drivers are synchronous, and the
  conformance suite exercises only the async API, detecting a capability by
  whether the async method is overridden.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, copy_checkpoint

from agent.encryption import Keyring
from agent.storage import deltas, search, staging, summaries
from agent.storage.encrypted import KeyringSerializer
from agent.storage.records import Turn
from agent.storage.saver_threads import SaverThreadOperations
from agent.storage.summaries import TURN_REPORT_KEY, model_input_summary, summarize

if TYPE_CHECKING:
    from collections.abc import Callable


#: Digits of the counter in the short channel versions this saver wrote before `compact_version`
#: (`0000000042.5f3a9c1`); a thread written so keeps that form (see "Short channel versions" above).
LEGACY_DIGITS = 10
#: Random hex digits after the dot of those versions.
LEGACY_RANDOM_HEX = 7
#: Random base-36 digits after the dot of a compact version (about 31 bits): two branches from one
#: checkpoint get different versions, so different blob keys.
VERSION_RANDOM_CHARS = 6
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    digits = ""
    while True:
        n, d = divmod(n, 36)
        digits = _BASE36[d] + digits
        if n == 0:
            return digits


def compact_version(counter: int) -> str:
    """The compact channel version of `counter` (>= 0): a letter for the counter's length in base-36
    digits (`a` for one, `b` for two, ...), the counter in base 36, a dot and `VERSION_RANDOM_CHARS`
    random base-36 digits. Versions of larger counters sort after as text (`c1ab.k3x9q0`)."""
    digits = _base36(counter)
    if len(digits) > 26:  # pragma: no cover - 36**26 versions
        raise ValueError(f"channel version counter {counter} is too large")
    draw = random.randrange(36**VERSION_RANDOM_CHARS)
    return f"{chr(ord('a') + len(digits) - 1)}{digits}.{_base36(draw).rjust(VERSION_RANDOM_CHARS, '0')}"


def version_counter(version: str) -> int:
    """The counter of a channel version in any form this saver reads: LangGraph's (`f"{n:032}.…"`), the
    earlier short one (`f"{n:010}.…"`) or `compact_version`'s.

    Raises:
        ValueError: `version` has none of these forms.
    """
    head = version.split(".")[0]
    if head[:1].isdigit():
        return int(head)
    if not head or not "a" <= head[0] <= "z" or len(head) != ord(head[0]) - ord("a") + 2:
        raise ValueError(f"not a channel version: {version!r}")
    return int(head[1:], 36)


class TurnSaverMixin(SaverThreadOperations):
    """Turn buffering, message deltas and summaries, mixed into a LangGraph saver."""

    def get_next_version(self, current, channel):
        """The version after `current`: compact (`compact_version`) unless `current` has a digit-led form.

        LangGraph gives `current` as the largest version of the checkpoint, so one thread keeps one form.
        """
        if current is None:
            return compact_version(1)
        if isinstance(current, (int, float)):
            return compact_version(int(current) + 1)
        digits = current.split(".")[0]
        if len(digits) > LEGACY_DIGITS:  # LangGraph's own form, on a thread written before
            return super().get_next_version(current, channel)
        if digits[:1].isdigit():  # this saver's earlier short form, on a thread written before
            return f"{int(digits) + 1:0{LEGACY_DIGITS}}.{random.getrandbits(4 * LEGACY_RANDOM_HEX):0{LEGACY_RANDOM_HEX}x}"
        return compact_version(version_counter(current) + 1)

    def _init_turns(self, message_cache_size: int, keyring: Keyring) -> None:
        #: Seals what the saver writes (blobs, message previews); without a key it only refuses sealed data.
        self.keyring = keyring
        self.serde = KeyringSerializer(keyring, self.serde)
        self._turns: dict[str, Turn] = {}
        self._turns_lock = threading.Lock()
        self.message_cache = deltas.MessageCache(message_cache_size)
        #: The search keys of recent checkpoints' message lists (`search.KeySets`).
        self.search_keys = search.KeySets()
        #: What a checkpoint waits to run, `(checkpoint, *, step, checkpoint_ns) -> node names`: set by
        #: `agent.graph.compile_graph` (`agent.storage.next_nodes` of its graph). None: the saver is a plain
        #: checkpointer, and the summary's `next_nodes` is [].
        self.next_nodes: Callable[..., list[str]] | None = None

    # -- turns -------------------------------------------------------------
    @contextmanager
    def buffering(self, turn: Turn) -> Iterator[Turn]:
        """Route this thread's writes to `turn` (and its reads to what the turn loaded) until the block ends."""
        with self._turns_lock:
            if turn.thread_id in self._turns:
                # The thread's claim makes this unreachable; guard the invariant anyway.
                raise RuntimeError(f"thread {turn.thread_id!r} already has a turn in this process")
            self._turns[turn.thread_id] = turn
        try:
            yield turn
        finally:
            with self._turns_lock:
                self._turns.pop(turn.thread_id, None)

    def active_turn(self, thread_id: str) -> Turn | None:
        return self._turns.get(thread_id)

    def write_turn(self, turn: Turn) -> None:
        """Write a turn's buffered checkpoints and writes. The caller holds the write transaction."""
        for config, checkpoint, metadata, new_versions in turn.puts:
            self._write_checkpoint(config, checkpoint, metadata, new_versions, turn)
        for config, writes, task_id, task_path in turn.writes:
            self._backend_put_writes(config, writes, task_id, task_path)

    def agent_tuple(self, tup: CheckpointTuple | None) -> CheckpointTuple | None:
        """`tup` (its messages resolved) with its metadata as the agent's operations read it
        (`summaries.agent_view`, the previews it does not store taken from its messages)."""
        if tup is None:
            return None
        view = summaries.agent_view(tup.metadata, self.keyring.open_text)
        if summaries.lacks_previews(view):
            messages = tup.checkpoint.get("channel_values", {}).get("messages")
            # A resolved list is used as it is: `added_messages` would check every message's class.
            resolved = isinstance(messages, deltas.MessageList)
            summaries.fill_previews(view, messages if resolved else deltas.added_messages(messages))
        return tup._replace(metadata=view)

    def agent_rows(self, thread_id: str, rows: list[dict]) -> list[dict]:
        """`rows` of the thread's root namespace (`checkpoint_id`, `metadata` as `summaries.agent_view`
        reads it) with the previews they lack: from the cached message lists, else from their stored
        deltas, read in one query (`summaries.agent_rows`)."""
        fetch = lambda checkpoint_ids: self._fetch_checkpoint_messages(thread_id, checkpoint_ids)  # noqa: E731
        return summaries.agent_rows(rows, fetch, self.message_cache.get)

    # -- BaseCheckpointSaver ------------------------------------------------
    def get_tuple(self, config):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None or configurable.get("checkpoint_ns", ""):
            return self._backend_get_tuple(config)
        # Without a checkpoint_id LangGraph asks for the latest checkpoint (to
        # tell a branch from a continuation, `checkpoint_superseded`): while a
        # turn holds the thread that is its last buffered put, else the head.
        checkpoint_id = configurable.get("checkpoint_id") or turn.latest_id
        if checkpoint_id is None:
            return None
        if checkpoint_id not in turn.loaded:
            turn.loaded[checkpoint_id] = self._backend_get_tuple(
                {**config, "configurable": {**configurable, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
            )
        return turn.loaded[checkpoint_id]

    async def aget_tuple(self, config):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is not None and not configurable.get("checkpoint_ns", ""):
            wanted = configurable.get("checkpoint_id") or turn.latest_id
            if wanted is None or wanted in turn.loaded:
                return self.get_tuple(config)  # answered from memory, no I/O
        return await asyncio.to_thread(self.get_tuple, config)

    def put(self, config, checkpoint, metadata, new_versions):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None:
            return self._write_checkpoint(config, checkpoint, metadata, new_versions, None)
        # Copies: LangGraph mutates the checkpoint it runs from (its channel versions), and a
        # buffered checkpoint is also what the rest of the turn reads back from `turn.loaded`.
        stored, loaded = copy_checkpoint(checkpoint), copy_checkpoint(checkpoint)
        turn.puts.append((config, stored, dict(metadata), dict(new_versions)))
        address = {
            "thread_id": configurable["thread_id"],
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"],
        }
        turn.loaded[checkpoint["id"]] = CheckpointTuple(
            config={"configurable": address},
            checkpoint=loaded,
            metadata=dict(metadata),
            parent_config={"configurable": {**address, "checkpoint_id": configurable["checkpoint_id"]}}
            if configurable.get("checkpoint_id")
            else None,
            pending_writes=[],
        )
        return {"configurable": address}

    async def aput(self, config, checkpoint, metadata, new_versions):
        if self.active_turn(config["configurable"]["thread_id"]) is not None:
            return self.put(config, checkpoint, metadata, new_versions)
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        turn = self.active_turn(config["configurable"]["thread_id"])
        if turn is None:
            return self._backend_put_writes(config, writes, task_id, task_path)
        turn.writes.append((config, list(writes), task_id, task_path))

    async def aput_writes(self, config, writes, task_id, task_path=""):
        if self.active_turn(config["configurable"]["thread_id"]) is not None:
            return self.put_writes(config, writes, task_id, task_path)
        return await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        for item in await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit))):
            yield item

    def with_allowlist(self, extra_allowlist):
        # LangGraph rebuilds an EncryptedSerializer as its own class here (LANGGRAPH_STRICT_MSGPACK), which
        # would encrypt even without a key; keep the keyring's.
        clone = super().with_allowlist(extra_allowlist)
        if clone is not self and not isinstance(clone.serde, KeyringSerializer):
            clone.serde = KeyringSerializer(self.keyring, getattr(clone.serde, "serde", clone.serde))
        return clone

    # LangGraph's default walk reads resolved checkpoints through get_tuple. The backends' fast paths read
    # stored channel values, which for `messages` would be deltas; and SqliteSaver's sync path and the base
    # class's async one disagreed about a channel stored as None.
    get_delta_channel_history = BaseCheckpointSaver.get_delta_channel_history

    async def aget_delta_channel_history(self, *, config, channels):
        return await asyncio.to_thread(lambda: self.get_delta_channel_history(config=config, channels=channels))

    # -- shared write / read paths -----------------------------------------
    def _write_checkpoint(self, config, checkpoint, metadata, new_versions, turn: Turn | None):
        # Its cache entries wait for the write to land: the commit of the storage's transaction that runs it
        # (whose scope this joins), else this write's own statements (`staging`).
        with staging.scope() as staged:
            written = self._put_checkpoint(config, checkpoint, metadata, new_versions, turn)
            staged.publish()
            return written

    def _put_checkpoint(self, config, checkpoint, metadata, new_versions, turn: Turn | None):
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        values = dict(checkpoint["channel_values"])
        messages = values.get("messages")
        listed = deltas.is_message_list(messages)
        kept = trailing = 0
        if listed:
            base = self._parent_messages(thread_id, checkpoint_ns, parent_id, turn) if parent_id else ()
            values["messages"] = deltas.encode(messages, parent_id, base)
            kept = values["messages"]["k"]
            trailing = deltas.kept_trailing(messages, base, kept) if kept < len(messages) else 0
            self.message_cache.put(checkpoint["id"], messages)
        parent_summary = summaries.unpack(self._parent_metadata(config, parent_id, turn)) if parent_id else None
        summary = {
            **summarize(
                messages if listed else [],
                checkpoint,
                self.next_nodes(checkpoint, step=metadata.get("step", -1), checkpoint_ns=checkpoint_ns)
                if self.next_nodes is not None
                else [],
                kept_messages=kept,
                kept_trailing=trailing,
            ),
            **model_input_summary(configurable.get(TURN_REPORT_KEY), parent_id, parent_summary),
        }
        if parent_id is None:
            summary.update({key: metadata[key] for key in summaries.ROOT_CARRIED_FIELDS if key in metadata})
        if listed and new_versions.get("messages") is not None:
            # The previews are read from the delta stored here (`summaries`, "Previews from the delta").
            summary = summaries.stored_previews(summary, messages[kept:])
        # The agent's own `tt_` configurable keys (the turn report) are not metadata, nor is a summary
        # handed back in: the agent's copies (fork_thread, import_thread, inside a turn) pass the metadata
        # they read, whose summary fields are recomputed here. A caller's keys are kept.
        clean = {
            key: value
            for key, value in metadata.items()
            if key != summaries.SUMMARY_KEY
            and not (key.startswith("tt_") and key in configurable)
            and not (turn is not None and key in summaries.SUMMARY_FIELDS)
        }
        config = {**config, "configurable": {k: v for k, v in configurable.items() if not k.startswith("tt_")}}
        stored = {**checkpoint, "channel_values": values}
        seal = self.keyring.seal_text if self.keyring.enabled else None
        written = {**clean, **summaries.pack(summary, seal)}
        if turn is not None:
            turn.written[checkpoint["id"]] = (config, written)
        terms = None
        if not checkpoint_ns and not self.keyring.enabled:
            # The words of the messages that first appear here that the inherited ones lack (`search`), and a
            # row at every root, which says the thread is indexed; nothing with encryption at rest.
            keys = self.search_keys.row(checkpoint["id"], parent_id, messages, kept) if listed else []
            if keys or parent_id is None:
                terms = keys
        return self._backend_put(config, stored, written, new_versions, terms)

    def _parent_metadata(self, config, parent_id: str, turn: Turn | None) -> Mapping[str, Any] | None:
        # A turn's parent is its start, which the claim read (or a root written in the same commit).
        if turn is not None and turn.loaded.get(parent_id) is not None:
            return turn.loaded[parent_id].metadata
        configurable = {**config["configurable"], "checkpoint_id": parent_id}
        parent = self._backend_get_tuple({**config, "configurable": configurable})
        return parent.metadata if parent is not None else None

    def _parent_messages(self, thread_id: str, checkpoint_ns: str, parent_id: str, turn: Turn | None):
        # A parent written earlier in the same commit (a thread's root) is not stored yet.
        if turn is not None and turn.loaded.get(parent_id) is not None:
            found = turn.loaded[parent_id].checkpoint["channel_values"].get("messages")
            return found if deltas.is_message_list(found) else ()
        return self.messages_of(thread_id, checkpoint_ns, parent_id)

    def stored_messages(self, thread_id: str) -> Mapping[str, Any]:
        """The stored `messages` value (a delta, as written; None where there is none) of every
        root-namespace checkpoint of the thread, by checkpoint id: what the search reads (`search`).
        One query, no resolving."""
        return self._fetch_thread_messages(thread_id, "")

    def messages_of(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> tuple:
        """The full message list of a stored checkpoint (cached; a miss reads the thread's deltas once);
        empty when the checkpoint holds no list of messages."""
        cached = self.message_cache.get(checkpoint_id)
        if cached is not None:
            return cached
        return deltas.resolve_stored(checkpoint_id, self._fetch_thread_messages(thread_id, checkpoint_ns), self.message_cache)

    def _resolve_tuple(self, tup: CheckpointTuple | None) -> CheckpointTuple | None:
        if tup is None:
            return None
        values = tup.checkpoint.get("channel_values") or {}
        stored = values.get("messages")
        if not deltas.is_delta(stored):
            return tup
        configurable = tup.config["configurable"]
        checkpoint_id = configurable["checkpoint_id"]
        resolved = self.message_cache.get_list(checkpoint_id)
        if resolved is None:
            resolved = deltas.MessageList(
                deltas.resolve(
                    stored,
                    self.message_cache,
                    lambda: self._fetch_thread_messages(configurable["thread_id"], configurable["checkpoint_ns"]),
                )
            )
            self.message_cache.put(checkpoint_id, resolved)
        checkpoint = {**tup.checkpoint, "channel_values": {**values, "messages": resolved}}
        return tup._replace(checkpoint=checkpoint)

    # -- backend hooks -------------------------------------------------------
    def _backend_get_tuple(self, config):  # pragma: no cover - abstract
        raise NotImplementedError

    def _backend_put(self, config, checkpoint, metadata, new_versions, terms: list[int] | None):  # pragma: no cover
        """LangGraph's `put` of the checkpoint, and its search terms (`search.new_keys`; None: no index row) in
        the same transaction (the running one, when there is one)."""
        raise NotImplementedError

    def _backend_put_writes(self, config, writes, task_id, task_path):  # pragma: no cover - abstract
        raise NotImplementedError

    def _fetch_checkpoint_messages(self, thread_id: str, checkpoint_ids: Sequence[str]) -> Mapping[str, Any]:  # pragma: no cover
        """The stored `messages` value (a delta, as written) of each of the root-namespace checkpoints
        `checkpoint_ids` that exists, keyed by checkpoint id; one query (history's previews: `agent_rows`)."""
        raise NotImplementedError

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:  # pragma: no cover
        """Every stored `messages` value of a thread's namespace, keyed by checkpoint id (None where a
        checkpoint has none: every checkpoint of the namespace is a key)."""
        raise NotImplementedError
