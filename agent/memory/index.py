"""An in-process copy of users' memories, checked against the store on every read, and the ranking over it.

Why: retrieval runs before every turn, and a user may have thousands of
memories. Ranking them in SQL parses every memory's JSON on every turn (about
3 ms for 1,000 memories on SQLite, more on Postgres, against a 3 ms turn);
LangGraph's SQLite vector search also computes every distance in SQL. A memory
never changes once written (it is only inserted or deleted), so each process
keeps the memories it has read, by user, and before every search asks the
store for one thing: the keys of the user's live (not expired) memories
(`MemoryStore.live_keys`, an index scan; on SQLite the store answers from its
last listing while `PRAGMA data_version` and its own writes say nothing
changed, `sqlite`). Keys it does not hold are fetched;
keys no longer listed are dropped. So a memory deleted or expired through any
process is never returned, and a search costs one key listing plus the
ranking in Python: keyword counts, or one matrix product for cosine
similarity (with pgvector the similarity ranking is one query in the server
instead, over exactly the memories this copy holds, and the copy keeps no
vectors: `postgres`).

The copy is bounded (`MAX_CACHED_BYTES`, least recently searched users go first).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from agent.memory.store import MemoryStore
from agent.types import Memory

if TYPE_CHECKING:
    import numpy  # a dependency of MLflow; imported where vectors are ranked (about 0.1 s at start-up)

#: `similar(vector, limit, among=None, excluding=())`: the database's exact ranking by cosine similarity
#: to `vector` of the user's memories (those `among`, else all but those `excluding`), best first, as
#: `(key, similarity)` (`PostgresMemoryStore.similar`).
Similar = Callable[..., list[tuple[str, float]]]
#: Most candidates a server search names (`among`); more are found by asking for more and dropping others.
MAX_NAMED_CANDIDATES = 64

#: Bytes of memories (text and vectors) one process keeps, about.
MAX_CACHED_BYTES = 64 * 1024 * 1024
_ENTRY_OVERHEAD = 400  # bytes of a cached Memory and its bookkeeping beyond its text and vector, about


@dataclass(frozen=True)
class Entry:
    memory: Memory
    text: str
    """The content, lower-cased (what keyword search matches)."""
    vector: numpy.ndarray | None
    """The unit-length embedding of the content, if it has one."""

    @property
    def size(self) -> int:
        return _ENTRY_OVERHEAD + len(self.text) + (self.vector.nbytes if self.vector is not None else 0)


@dataclass
class _UserCopy:
    entries: dict[str, Entry] = field(default_factory=dict)
    size: int = 0
    listing: str = ""
    """The store's listing of the keys this copy was made from (`MemoryStore.live_keys`)."""
    newest_first: list[str] = field(default_factory=list)
    """The keys, newest first (keys are time-ordered)."""
    text: str = ""
    """Every entry's lower-cased content, newest first, each followed by a NUL (a memory never holds one)."""
    starts: list[int] = field(default_factory=list)
    """Where each entry of `newest_first` starts in `text`."""
    matrix: numpy.ndarray | None = None
    """The entries' unit vectors stacked (built on the first semantic search), and their entries in row order."""
    embedded: list[Entry] = field(default_factory=list)
    embedded_keys: list[str] = field(default_factory=list)
    """The version ids of `embedded`, in row order."""
    current: frozenset[str] | None = None
    """The newest version of each memory, when some memory has several; None: every entry is current."""
    anchors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The extracted versions by the message they are anchored to (`scopes`: the branch rule)."""

    @classmethod
    def of(cls, entries: dict[str, Entry], listing: str) -> _UserCopy:
        newest_first = sorted(entries, reverse=True)
        starts, offset = [], 0
        for key in newest_first:
            starts.append(offset)
            offset += len(entries[key].text) + 1
        text = "".join(entries[key].text + "\0" for key in newest_first)
        size = sum(entry.size for entry in entries.values()) + 2 * len(text)
        copy = cls(entries, size, listing, newest_first, text, starts)
        if any(entry.memory.version_id != entry.memory.memory_id for entry in entries.values()):
            copy.current = visible(copy, entries.keys())
        anchors: dict[str, list[str]] = {}
        for key, entry in entries.items():
            if entry.memory.source_message_id:
                anchors.setdefault(entry.memory.source_message_id, []).append(key)
        copy.anchors = {message_id: tuple(keys) for message_id, keys in anchors.items()}
        return copy


class MemoryIndex:
    """Users' memories as last read from `store`, refreshed by key on every `current` call. Thread-safe."""

    def __init__(self, store: MemoryStore, *, max_bytes: int = MAX_CACHED_BYTES) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._users: OrderedDict[str, _UserCopy] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def current(self, prefix: str, *, listing: str | None = None) -> _UserCopy:
        """The live memories under `prefix` (one key listing; the rows of new keys are fetched). `listing`:
        the store's `live_keys(prefix)` as the caller just read it (with a search, in the same statement),
        which saves the listing's round trip."""
        if listing is None:
            listing = self.store.live_keys(prefix)
        with self._lock:
            held = self._users.get(prefix)
            if held is not None and held.listing == listing:  # the usual case: nothing changed since the last search
                self._users.move_to_end(prefix)
                return held
            known = dict(held.entries) if held is not None else {}
        keys = frozenset(listing.split(",")) if listing else frozenset()
        missing = keys - known.keys()
        if missing:
            for memory, vector in self.store.read(prefix, sorted(missing)):
                known[memory.version] = Entry(memory, memory.content.lower(), _unit(vector))
        copy = _UserCopy.of({key: known[key] for key in keys if key in known}, listing)
        self._keep(prefix, copy)
        return copy

    def forget(self, prefix: str) -> None:
        """Drop the copy of one user's memories (after deleting them all)."""
        with self._lock:
            held = self._users.pop(prefix, None)
            if held is not None:
                self._size -= held.size

    def _keep(self, prefix: str, copy: _UserCopy) -> None:
        with self._lock:
            old = self._users.pop(prefix, None)
            self._size -= old.size if old is not None else 0
            self._users[prefix] = copy
            self._size += copy.size
            while self._size > self.max_bytes and len(self._users) > 1:
                _, evicted = self._users.popitem(last=False)
                self._size -= evicted.size


def visible(copy: _UserCopy, keys: Collection[str] | None) -> frozenset[str] | None:
    """Of the versions `keys` (None: all of the user's), the newest of each memory (version ids are
    time-ordered): what a turn that may see `keys` sees. None stands for all, when no memory has two versions."""
    if keys is None:
        return copy.current
    newest: dict[str, str] = {}
    for key in keys:
        entry = copy.entries.get(key)
        if entry is not None:
            memory_id = entry.memory.memory_id
            if key > newest.get(memory_id, ""):
                newest[memory_id] = key
    return frozenset(newest.values())


def anchored(copy: _UserCopy, message_ids: Collection[str]) -> set[str]:
    """The extracted versions anchored to one of `message_ids` (a branch's messages)."""
    if not copy.anchors:
        return set()
    return {key for message_id in message_ids if message_id in copy.anchors for key in copy.anchors[message_id]}


def rank(
    copy: _UserCopy,
    *,
    words: Sequence[str],
    vector: Sequence[float] | None,
    keys: Collection[str] | None,
    min_score: int,
    limit: int,
    similar: Similar | None = None,
) -> list[Memory]:
    """Up to `limit` of a user's memories (only `keys` if given), best first, newest first among equals (keys
    are time-ordered). With `vector`: by cosine similarity, memories without a vector last, ranked by
    `similar` in the database when given (pgvector, `PostgresMemoryStore.similar`), else here. Else by the
    number of `words` their content contains, only those with at least `min_score`."""
    if vector is not None and similar is not None:
        return _by_server_similarity(copy, vector, keys, limit, similar)
    if vector is not None:
        return _by_similarity(copy, _unit(vector), keys, limit)
    # Each word is looked up once in the user's whole text (str.find, in C) rather than in each memory:
    # the cost follows the matches, not the number of memories.
    scores: dict[int, int] = {}
    text, starts = copy.text, copy.starts
    for word in words:
        position = text.find(word)
        while position != -1:
            index = bisect.bisect_right(starts, position) - 1
            scores[index] = scores.get(index, 0) + 1
            following = starts[index + 1] if index + 1 < len(starts) else len(text)
            position = text.find(word, following)
    order = copy.newest_first
    # Best first; among equals the lower index, that is the newer memory.
    candidates = [(-score, index) for index, score in scores.items() if score >= min_score]
    if keys is not None:
        candidates = [item for item in candidates if order[item[1]] in keys]
    chosen = [(float(-negative), order[index]) for negative, index in heapq.nsmallest(limit, candidates)]
    if min_score <= 0 and len(chosen) < limit:  # the memories that match no word, newest first
        matched = set(scores)
        chosen += [(0.0, key) for index, key in enumerate(order) if index not in matched and (keys is None or key in keys)][
            : limit - len(chosen)
        ]
    return [_scored(copy.entries[key].memory, score) for score, key in chosen[:limit]]


def _by_similarity(copy: _UserCopy, query: numpy.ndarray, keys: Collection[str] | None, limit: int) -> list[Memory]:
    import numpy

    if copy.matrix is None:  # built once per copy; a copy is replaced when the user's memories change
        copy.embedded = [entry for entry in copy.entries.values() if entry.vector is not None]
        dims = {entry.vector.shape for entry in copy.embedded}
        if len(dims) > 1:  # the embeddings model changed: compare with the current one's only
            copy.embedded = [entry for entry in copy.embedded if entry.vector.shape == query.shape]
        copy.matrix = numpy.stack([e.vector for e in copy.embedded]) if copy.embedded else numpy.zeros((0, 1))
        copy.embedded_keys = [entry.memory.version for entry in copy.embedded]
    found: list[Memory] = []
    vectors = copy.embedded_keys if copy.embedded and copy.matrix.shape[1] == query.shape[0] else []
    if vectors:
        scores = copy.matrix @ query
        if keys is None:
            rows = numpy.arange(len(vectors))
        else:
            rows = numpy.fromiter((row for row, key in enumerate(vectors) if key in keys), dtype=numpy.intp)
        picked = scores[rows]
        if len(rows) > limit:  # every row at least as similar as the limit-th best (ties kept), in numpy
            kth = numpy.partition(picked, len(picked) - limit)[len(picked) - limit]
            rows = rows[picked >= kth]
        # Best first, the newer (greater key) first among equals.
        best = heapq.nlargest(limit, ((float(scores[row]), vectors[row]) for row in rows.tolist()))
        found = [_scored(copy.entries[key].memory, score) for score, key in best]
    if len(found) < limit:  # memories saved without a vector (before embedding_model was set), newest first
        ranked = set(vectors)
        rest = sorted((k for k in copy.entries if k not in ranked and (keys is None or k in keys)), reverse=True)
        found += [copy.entries[key].memory for key in rest[: limit - len(found)]]
    return found


def _by_server_similarity(
    copy: _UserCopy, vector: Sequence[float], keys: Collection[str] | None, limit: int, similar: Similar
) -> list[Memory]:
    # Exactly the candidates this copy holds are ranked: a few are named to the server; else the server
    # ranks all the user's vectors but the copy's non-candidates, and rows the copy does not hold (saved or
    # expired since its listing) are dropped, asking again for more when that left fewer than `limit`.
    if keys is not None and len(keys) <= MAX_NAMED_CANDIDATES:
        ranked = similar(vector, limit, among=sorted(keys))
    else:
        excluding = [] if keys is None else [key for key in copy.entries if key not in keys]
        asked = limit
        while True:
            rows = similar(vector, asked, excluding=excluding)
            ranked = [(key, score) for key, score in rows if key in copy.entries]
            if len(ranked) >= limit or len(rows) < asked:
                break
            asked *= 4
    found = [_scored(copy.entries[key].memory, score) for key, score in ranked[:limit]]
    if len(found) < limit:  # memories saved without a vector (before embedding_model was set), newest first
        seen = {memory.version for memory in found}
        rest = [k for k in copy.newest_first if k not in seen and (keys is None or k in keys)]
        found += [copy.entries[key].memory for key in rest[: limit - len(found)]]
    return found


def _scored(memory: Memory, score: float) -> Memory:
    return dataclasses.replace(memory, score=score)


def _unit(vector: Sequence[float] | numpy.ndarray | None) -> numpy.ndarray | None:
    if vector is None:
        return None
    import numpy

    array = numpy.asarray(vector, dtype=numpy.float32)
    norm = float(numpy.linalg.norm(array))
    return array / norm if norm else array
