"""`SaverThreadOperations`: LangGraph's thread operations (delete, prune, copy, delete for runs) for our savers.

LangGraph's own `delete_thread`/`prune`/`copy_thread` know neither
`agent_threads` nor the delta encoding (a `keep_latest` prune would delete the
checkpoints a kept delta points to), so they are replaced here: each runs in
one transaction (`ThreadStorage.transaction`) and is refused (`ThreadBusy`,
nothing written) while a turn holds a thread. `prune(keep_latest)` stores each
kept checkpoint's messages whole before deleting its ancestors;
`delete_for_runs` stores whole the messages of each surviving checkpoint whose
parent it deletes and hangs it from its nearest surviving ancestor;
`copy_thread` copies the rows (same checkpoint ids, so every delta's base is
copied with it) and the thread record. For a thread the agent knows, the
checkpoint `prune` keeps in the root namespace is its head (LangGraph's
"latest" is the newest id, which after a branch switch is not the head).

The async forms run the sync ones in a worker thread (both backends' drivers
are synchronous); the conformance suite detects each capability by whether
its async method is overridden.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from agent.errors import InvalidRequest, ThreadBusy, ThreadExists, ThreadNotFound, shown_id
from agent.storage import deltas, summaries
from agent.storage.transaction import Tx

#: `prune` strategies, as LangGraph names them.
PRUNE_STRATEGIES = ("keep_latest", "delete")


class SaverThreadOperations:
    """The thread operations of `saver.TurnSaverMixin`; each writes in one `ThreadStorage.transaction`."""

    #: The storage the saver belongs to (set by the backend): its `transaction` runs these operations.
    _storage: Any

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and blob of the thread (all namespaces) and its record.

        Args:
            thread_id: the thread; an unknown one is a no-op.

        Raises:
            ThreadBusy: a turn holds the thread; nothing was deleted.
            StorageUnavailable: the database failed; nothing was deleted.
        """
        self.prune([thread_id], strategy="delete")

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the threads, each in the same one transaction.

        Args:
            thread_ids: the threads (unknown ones are skipped).
            strategy: `"keep_latest"` keeps, per namespace, the newest checkpoint (in the root namespace of
                a thread the agent knows: its head) with its pending writes, its messages stored whole and
                no parent, and deletes the rest; `"delete"` deletes every row of the threads and their records.

        Raises:
            InvalidRequest: `thread_ids` is a single string, or `strategy` is unknown; nothing was written.
            ThreadBusy: a turn holds one of the threads; nothing was written.
            StorageUnavailable: the database failed; nothing was written.
        """
        ids = _thread_ids(thread_ids)
        if strategy not in PRUNE_STRATEGIES:
            raise InvalidRequest(f"Unknown prune strategy {strategy!r}; use one of {', '.join(PRUNE_STRATEGIES)}.")
        if not ids:
            return

        def apply(tx: Tx) -> None:
            _refuse_busy(tx, ids)
            for thread_id in ids:
                if strategy == "delete":
                    tx.delete_thread(thread_id)
                else:
                    self._keep_latest(tx, thread_id)

        self._storage.transaction(apply)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune` in a worker thread."""
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and blob of a thread (all namespaces, same checkpoint ids) and
        its record (with `forked_from` naming the source's head) to a new thread.

        Raises:
            ThreadNotFound: the source has no checkpoint; nothing was written.
            ThreadExists: the target has checkpoints or a record already; nothing was written.
            InvalidRequest: source and target are the same thread.
            StorageUnavailable: the database failed; nothing was written.
        """
        if source_thread_id == target_thread_id:
            raise InvalidRequest(f"copy_thread needs two threads; got {source_thread_id!r} twice.")

        def apply(tx: Tx) -> None:
            if not tx.thread_has_rows(source_thread_id):
                raise ThreadNotFound(f"Thread {shown_id(source_thread_id)} has no checkpoint to copy.", thread_id=source_thread_id)
            if tx.thread_has_rows(target_thread_id) or tx.thread_record(target_thread_id) is not None:
                raise ThreadExists(
                    f"Thread {target_thread_id!r} already exists; nothing was copied.", thread_id=target_thread_id
                )
            tx.copy_thread_rows(source_thread_id, target_thread_id)
            record = tx.thread_record(source_thread_id)
            if record is not None:
                tx.insert_thread(
                    target_thread_id,
                    user_id=record.user_id,
                    head_checkpoint_id=record.head_checkpoint_id,
                    message_count=record.message_count,
                    title=record.title,
                    metadata=record.metadata,
                    forked_from={"thread_id": source_thread_id, "checkpoint_id": record.head_checkpoint_id},
                )

        self._storage.transaction(apply)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata `run_id` is one of `run_ids` (any thread, any namespace),
        with its pending writes, in one transaction.

        A surviving checkpoint whose parent is deleted gets its nearest surviving ancestor as parent (or
        none) and its messages stored whole; a thread record whose head is deleted moves to the head's
        nearest surviving ancestor (else the thread's newest checkpoint; with none left, it is deleted).

        Raises:
            InvalidRequest: `run_ids` is a single string; nothing was written.
            ThreadBusy: a turn holds one of the threads; nothing was written.
            StorageUnavailable: the database failed; nothing was written.
        """
        runs = _thread_ids(run_ids, name="run_ids")
        if not runs:
            return

        def apply(tx: Tx) -> None:
            threads = tx.threads_of_runs(runs)
            _refuse_busy(tx, threads)
            for thread_id in threads:
                self._delete_runs(tx, thread_id, set(runs))

        self._storage.transaction(apply)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    def _thread_tuples(self, thread_id: str) -> list[CheckpointTuple]:
        """Every checkpoint of the thread, every namespace, messages resolved (in the running transaction)."""
        return list(self.list({"configurable": {"thread_id": thread_id}}))

    def _keep_latest(self, tx: Tx, thread_id: str) -> None:
        tuples = self._thread_tuples(thread_id)
        if not tuples:
            return
        record = tx.thread_record(thread_id)
        kept: dict[str, CheckpointTuple] = {}
        for tup in tuples:
            ns, checkpoint_id = _address(tup)
            if ns not in kept or checkpoint_id > _address(kept[ns])[1]:
                kept[ns] = tup
        if record is not None:
            head = next((t for t in tuples if _address(t) == ("", record.head_checkpoint_id)), None)
            if head is not None:
                kept[""] = head
        for tup in kept.values():
            tx.rewrite_checkpoint(thread_id, tup, parent_id=None, metadata=summaries.with_fields(tup.metadata, kept_messages=0))
        tx.delete_checkpoints(thread_id, keep=[_address(t) for t in kept.values()])

    def _delete_runs(self, tx: Tx, thread_id: str, runs: set[str]) -> None:
        tuples = self._thread_tuples(thread_id)
        by_address = {_address(t): t for t in tuples}
        doomed = {a for a, t in by_address.items() if t.metadata.get("run_id") in runs}
        if not doomed:
            return

        def surviving_ancestor(address: tuple[str, str]) -> str | None:
            current = _parent_id(by_address[address])
            while current is not None and (address[0], current) in doomed:
                found = by_address.get((address[0], current))
                current = _parent_id(found) if found is not None else None
            return current

        for address, tup in by_address.items():
            parent = _parent_id(tup)
            if address in doomed or parent is None or (address[0], parent) not in doomed:
                continue
            new_parent = surviving_ancestor(address)
            messages = _message_list(tup)
            base = _message_list(by_address[(address[0], new_parent)]) if new_parent is not None else None
            kept = trailing = 0
            if messages is not None and base is not None:
                kept = deltas.common_prefix(messages, base)
                trailing = deltas.kept_trailing(messages, base, kept)
            metadata = summaries.with_fields(tup.metadata, kept_messages=kept, kept_trailing=trailing)
            tx.rewrite_checkpoint(thread_id, tup, parent_id=new_parent, metadata=metadata)
        tx.delete_checkpoints(thread_id, keep=[a for a in by_address if a not in doomed])
        record = tx.thread_record(thread_id)
        if record is None or ("", record.head_checkpoint_id) not in doomed:
            return
        head = surviving_ancestor(("", record.head_checkpoint_id))
        if head is None:
            roots = sorted(cid for ns, cid in by_address if ns == "" and (ns, cid) not in doomed)
            head = roots[-1] if roots else None
        if head is None:
            tx.delete_thread(thread_id)
            return
        messages = _message_list(by_address[("", head)]) or ()
        tx.set_head(thread_id, head, message_count=len(messages))


def _thread_ids(ids: Sequence[str], *, name: str = "thread_ids") -> list[str]:
    if isinstance(ids, (str, bytes)):
        raise InvalidRequest(f"{name} must be a sequence of ids, not one string: {ids!r:.60}")
    return [str(i) for i in ids]


def _refuse_busy(tx: Tx, thread_ids: Sequence[str]) -> None:
    busy = tx.busy_threads(thread_ids)
    if busy:
        raise ThreadBusy(
            f"A turn holds thread {busy[0]!r}; nothing was written. Retry once it has finished.", thread_id=busy[0]
        )


def _address(tup: CheckpointTuple) -> tuple[str, str]:
    configurable = tup.config["configurable"]
    return configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"]


def _parent_id(tup: CheckpointTuple) -> str | None:
    return (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")


def _message_list(tup: CheckpointTuple) -> Sequence[Any] | None:
    found = tup.checkpoint["channel_values"].get("messages")
    return found if deltas.is_message_list(found) else None
