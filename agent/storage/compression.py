"""Long serialized values stored zlib-compressed, their type marked; read by the saver's serializer and the light reader.

A serialized value (`SerializerProtocol.dumps_typed`'s `(type, bytes)`) of at
least `COMPRESS_AT` bytes is stored compressed (stdlib zlib, level 6) when that
makes it smaller, its type marked with `ZLIB_SUFFIX` (`msgpack.zlib`); a type
without the mark is read as it always was, so stored rows need no rewrite.
`agent.storage.encrypted.KeyringSerializer` compresses before it seals (a
sealed value does not compress): `msgpack.zlib+aesgcm`.

Why: a turn's message delta is most of its blob bytes and chat text compresses
about 2:1 (with the storage benchmark's 200-byte messages a turn's blob went
from 1,160 bytes to about 640). LangGraph's serde has no compression of its
own (`langgraph.checkpoint.serde`: msgpack, JSON, pickle, encryption);
Postgres compresses (TOAST) only values of about 2 kB and more, SQLite never.
Below `COMPRESS_AT` zlib's header and checksum earn little. One rule on both
backends: leaving Postgres values of 2 kB and more to TOAST (its own
compression, out of the row) measured the same as compressing them here, within
`bench.turn_bytes`'s noise with 5,000-byte messages (about 300 bytes a turn
between runs). Compressing costs
about 35 us a kilobyte; decompressing less. This module imports only the
standard library: `sqlite.reads` decodes stored checkpoints without LangGraph.
"""

from __future__ import annotations

import zlib

#: Smallest serialized value stored compressed, in bytes.
COMPRESS_AT = 256
#: The mark of a compressed value's type: `msgpack.zlib` is `msgpack` bytes, zlib-compressed.
ZLIB_SUFFIX = ".zlib"
#: Types whose bytes are compressed when long enough (LangGraph's "bytes", "bytearray" and "null" are not).
COMPRESSED_TYPES = frozenset({"msgpack", "json", "pickle"})


def compress(typ: str, data: bytes) -> tuple[str, bytes]:
    """`(typ, data)` compressed and marked when it is long enough and that makes it smaller, else as it is."""
    if typ in COMPRESSED_TYPES and len(data) >= COMPRESS_AT:
        packed = zlib.compress(data)
        if len(packed) < len(data):
            return typ + ZLIB_SUFFIX, packed
    return typ, data


def decompress(typ: str, data: bytes) -> tuple[str, bytes]:
    """The serializer's `(type, bytes)` of a stored value (unsealed), whether `compress` compressed it or not.

    Raises:
        zlib.error: a marked value's bytes are not zlib data (a damaged row).
    """
    if typ.endswith(ZLIB_SUFFIX):
        return typ[: -len(ZLIB_SUFFIX)], zlib.decompress(data)
    return typ, data
