"""The in-process caches' entries made inside a write transaction, kept aside until it commits.

The saver keeps two caches by checkpoint id that every later read trusts: the
resolved message lists (`deltas.MessageCache`) and the search keys of those
lists (`search.KeySets`). Both assume that what a checkpoint id names never
changes, which holds for committed checkpoints only. A write that the
database refuses at its commit (a checkpoint id another thread holds, an
idempotency key taken, a lost claim, a dropped connection) rolls its rows back,
and an entry it had cached would then describe a checkpoint that is not
stored, or, worse, another thread's checkpoint of that id: an import whose
document named another user's checkpoint, refused with `ThreadExists`, used
to leave its text in the cache under that id, where the owner's reads (and a
fork, which copies what it reads) then found it.

So the storage's write transactions (`ThreadStorage.commit`, `transaction`)
run inside `scope()`. Inside it every cache `put` goes to the scope (reads
inside the transaction see their own writes there first: an import resolves a
checkpoint's parent written a moment before), and the storage calls
`Staged.publish` once its `COMMIT` succeeded. A scope holds no more entries
for a cache than the cache itself keeps (`Publishes.capacity`), dropping its
oldest: `publish` would evict them anyway, and a large import would otherwise
hold a message list per checkpoint until its commit. A lookup in the
transaction that misses a dropped entry reads the rows instead, which is
correct: the transaction reads its own writes. A scope left without `publish` is
dropped with everything it held. Outside a scope an entry goes straight to its
cache: only reads of committed rows and writes that already committed
(LangGraph's own `put`, in autocommit) put entries there.

A scope is a context variable, so it follows the transaction's thread and the
tasks and `asyncio.to_thread` calls it starts, and no other request sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol


class Publishes(Protocol):
    """A cache whose entries a scope can hold back: `publish` stores them as its own `put` would."""

    #: The most entries the cache keeps; a scope holds no more than that for it.
    capacity: int

    def publish(self, entries: dict[str, Any]) -> None: ...


class Staged:
    """The entries one write transaction made, by cache, in the order they were made."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Publishes, dict[str, Any]]] = {}

    def put(self, cache: Publishes, key: str, value: Any) -> None:
        """Hold `value` for `cache` under `key` until `publish` (a later put of the key replaces it); beyond
        `cache.capacity` entries, the oldest is dropped."""
        entries = self._entries.setdefault(id(cache), (cache, {}))[1]
        entries.pop(key, None)  # a replaced entry counts as the most recent one
        entries[key] = value
        while len(entries) > cache.capacity:
            del entries[next(iter(entries))]

    def get(self, cache: Publishes, key: str) -> Any | None:
        """What this transaction put for `cache` under `key`, or None."""
        found = self._entries.get(id(cache))
        return found[1].get(key) if found is not None else None

    def publish(self) -> None:
        """Hand every held entry to its cache, once the transaction committed; the scope is empty afterwards."""
        entries, self._entries = self._entries, {}
        for cache, held in entries.values():
            cache.publish(held)


class _Joined(Staged):
    """A scope opened inside another: it holds into the outer one, whose owner publishes after its commit."""

    def __init__(self, outer: Staged) -> None:
        self._outer = outer

    def put(self, cache: Publishes, key: str, value: Any) -> None:
        self._outer.put(cache, key, value)

    def get(self, cache: Publishes, key: str) -> Any | None:
        return self._outer.get(cache, key)

    def publish(self) -> None:
        pass


_CURRENT: ContextVar[Staged | None] = ContextVar("tt_staged_cache_entries", default=None)


def current() -> Staged | None:
    """The scope of the write transaction running in this context, if any."""
    return _CURRENT.get()


@contextmanager
def scope() -> Iterator[Staged]:
    """Hold back the cache entries made in the block until the caller's `publish()` after its commit.

    Opened inside another scope it joins that one, and its `publish()` does nothing.
    """
    outer = _CURRENT.get()
    if outer is not None:
        yield _Joined(outer)
        return
    staged = Staged()
    token = _CURRENT.set(staged)
    try:
        yield staged
    finally:
        _CURRENT.reset(token)
