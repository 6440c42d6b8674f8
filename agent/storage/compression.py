"""Long serialized values stored zlib-compressed, their type marked; read by the saver's serializer and the light reader.

A serialized value (`SerializerProtocol.dumps_typed`'s `(type, bytes)`) of at
least `COMPRESS_AT` bytes is stored compressed (stdlib zlib, level 6, with a
preset dictionary: see below) when that makes it smaller, its type marked with
`ZDICT_SUFFIX` (`msgpack.zd1`); values marked `ZLIB_SUFFIX` (`msgpack.zlib`,
no dictionary, written before) and types without a mark are read as they
always were, so stored rows need no rewrite.
`agent.storage.encrypted.KeyringSerializer` compresses before it seals (a
sealed value does not compress): `msgpack.zd1+aesgcm`.

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

**A preset dictionary.** A turn's delta is short, and much of it is the same
every turn: the msgpack keys and shapes of a message record, `lc_run--`,
`usage_metadata` with its token counts, a chat model's `response_metadata`.
zlib starts each value with an empty window, so it pays for those again in
every blob; compressed against `DICTIONARY_V1` (zlib's `zdict`: the serialized
delta of a representative turn, with a tool call and OpenAI's metadata, after
some of the commonest English words) a turn's blob is about 50 bytes smaller
(625 instead of 672 with the storage benchmark's 200-byte messages, 1,956
instead of 2,019 with 5,000-byte ones), on both backends. Such values are
marked `ZDICT_SUFFIX` (`msgpack.zd1`), and the dictionary is frozen: every
value compressed with it needs exactly these bytes to be read again
(`DICTIONARY_V1_SHA256`, checked by a test). A better one would be
`DICTIONARY_V2` with a suffix of its own, the old one kept for reading.
"""

from __future__ import annotations

import base64
import zlib

#: Smallest serialized value stored compressed, in bytes.
COMPRESS_AT = 256
#: The mark of a compressed value's type: `msgpack.zlib` is `msgpack` bytes, zlib-compressed.
ZLIB_SUFFIX = ".zlib"
#: The mark of a value compressed with the preset dictionary `DICTIONARY_V1` (written now).
ZDICT_SUFFIX = ".zd1"
#: zlib's preset dictionary of `ZDICT_SUFFIX` values (module docstring). Never change these bytes.
DICTIONARY_V1 = base64.b64decode(
    "IHRoZSBiZSB0byBvZiBhbmQgYSBpbiB0aGF0IGhhdmUgaXQgZm9yIG5vdCBvbiB3aXRoIGhlIGFzIHlvdSBkbyBhdCB0aGlzIGJ1"
    "dCBoaXMgYnkgZnJvbSB0aGV5IHdlIHNheSBoZXIgc2hlIG9yIGFuIHdpbGwgbXkgb25lIGFsbCB3b3VsZCB0aGVyZSB0aGVpciB3"
    "aGF0IHNvIHVwIG91dCBpZiBhYm91dCB3aG8gZ2V0IHdoaWNoIGdvIG1lIHdoZW4gbWFrZSBjYW4gbGlrZSB0aW1lIG5vIGp1c3Qg"
    "aGltIGtub3cgdGFrZSBwZW9wbGUgaW50byB5ZWFyIHlvdXIgZ29vZCBzb21lIGNvdWxkIHRoZW0gc2VlIG90aGVyIHRoYW4gdGhl"
    "biBub3cgbG9vayBvbmx5IGNvbWUgaXRzIG92ZXIgdGhpbmsgYWxzbyBiYWNrIGFmdGVyIHVzZSB0d28gaG93IG91ciB3b3JrIGZp"
    "cnN0IHdlbGwgd2F5IGV2ZW4gbmV3IHdhbnQgYmVjYXVzZSBhbnkgdGhlc2UgZ2l2ZSBkYXkgbW9zdCB1cyBpcyBhcmUgd2FzIHdl"
    "cmUgaGFzIGhhZCBiZWVuIEknbSB5b3UncmUgaXQncyBkb24ndCBjYW4ndCB0aGFua3MgcGxlYXNlIGhlcmUgbGV0J3Mgc3VyZSCD"
    "on5twKFrAKFhlJSiYWmg2S5sY19ydW4tLTAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMC0wg7FyZXNwb25zZV9t"
    "ZXRhZGF0YYirdG9rZW5fdXNhZ2WFsWNvbXBsZXRpb25fdG9rZW5zOK1wcm9tcHRfdG9rZW5zzQTSrHRvdGFsX3Rva2Vuc80FCrlj"
    "b21wbGV0aW9uX3Rva2Vuc19kZXRhaWxzhLphY2NlcHRlZF9wcmVkaWN0aW9uX3Rva2VucwCsYXVkaW9fdG9rZW5zALByZWFzb25p"
    "bmdfdG9rZW5zALpyZWplY3RlZF9wcmVkaWN0aW9uX3Rva2VucwC1cHJvbXB0X3Rva2Vuc19kZXRhaWxzgqxhdWRpb190b2tlbnMA"
    "rWNhY2hlZF90b2tlbnMArm1vZGVsX3Byb3ZpZGVypm9wZW5haaptb2RlbF9uYW1ltmdwdC00by1taW5pLTIwMjQtMDctMTiyc3lz"
    "dGVtX2ZpbmdlcnByaW50rWZwXzAwMDAwMDAwMDCiaWTZJWNoYXRjbXBsLTAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDCsc2Vy"
    "dmljZV90aWVyp2RlZmF1bHStZmluaXNoX3JlYXNvbqp0b29sX2NhbGxzqGxvZ3Byb2JzwKp0b29sX2NhbGxzkYSkbmFtZapjYWxj"
    "dWxhdG9ypGFyZ3OBqmV4cHJlc3Npb26jNio3omlkvWNhbGxfMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwpHR5cGWpdG9vbF9jYWxs"
    "rnVzYWdlX21ldGFkYXRhhaxpbnB1dF90b2tlbnPNBNKtb3V0cHV0X3Rva2VuczisdG90YWxfdG9rZW5zzQUKs2lucHV0X3Rva2Vu"
    "X2RldGFpbHOCpWF1ZGlvAKpjYWNoZV9yZWFkALRvdXRwdXRfdG9rZW5fZGV0YWlsc4KlYXVkaW8AqXJlYXNvbmluZwCUpHRvb2yi"
    "NDLZJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMIKkbmFtZapjYWxjdWxhdG9yrHRvb2xfY2FsbF9pZL1jYWxs"
    "XzAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMJOlaHVtYW6kVGhlINkkMDAwMDAwMDAtMDAwMC0wMDAwLTAwMDAtMDAwMDAwMDAwMDAw"
    "lKJhaaRUaGUg2S5sY19ydW4tLTAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMC0wgrFyZXNwb25zZV9tZXRhZGF0"
    "YYirdG9rZW5fdXNhZ2WFsWNvbXBsZXRpb25fdG9rZW5zOK1wcm9tcHRfdG9rZW5zzQTSrHRvdGFsX3Rva2Vuc80FCrljb21wbGV0"
    "aW9uX3Rva2Vuc19kZXRhaWxzhLphY2NlcHRlZF9wcmVkaWN0aW9uX3Rva2VucwCsYXVkaW9fdG9rZW5zALByZWFzb25pbmdfdG9r"
    "ZW5zALpyZWplY3RlZF9wcmVkaWN0aW9uX3Rva2VucwC1cHJvbXB0X3Rva2Vuc19kZXRhaWxzgqxhdWRpb190b2tlbnMArWNhY2hl"
    "ZF90b2tlbnMArm1vZGVsX3Byb3ZpZGVypm9wZW5haaptb2RlbF9uYW1ltmdwdC00by1taW5pLTIwMjQtMDctMTiyc3lzdGVtX2Zp"
    "bmdlcnByaW50rWZwXzAwMDAwMDAwMDCiaWTZJWNoYXRjbXBsLTAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDCsc2VydmljZV90"
    "aWVyp2RlZmF1bHStZmluaXNoX3JlYXNvbqRzdG9wqGxvZ3Byb2JzwK51c2FnZV9tZXRhZGF0YYWsaW5wdXRfdG9rZW5zzQTSrW91"
    "dHB1dF90b2tlbnM4rHRvdGFsX3Rva2Vuc80FCrNpbnB1dF90b2tlbl9kZXRhaWxzgqVhdWRpbwCqY2FjaGVfcmVhZAC0b3V0cHV0"
    "X3Rva2VuX2RldGFpbHOCpWF1ZGlvAKlyZWFzb25pbmcAg6J+bdkkoWuhYZKTpWh1bWFu2dkklKJhadrZLmxjX3J1bi0tga51c2Fn"
    "ZV9tZXRhZGF0YYOsaW5wdXRfdG9rZW5zza1vdXRwdXRfdG9rZW5zzKx0b3RhbF90b2tlbnPN"
)
#: The SHA-256 of `DICTIONARY_V1`, which a test checks.
DICTIONARY_V1_SHA256 = "52567e99c556896dde17fef3d3c42fc3742c0b9418511c9eb4e5d45844ed68d6"
#: Types whose bytes are compressed when long enough (LangGraph's "bytes", "bytearray" and "null" are not).
COMPRESSED_TYPES = frozenset({"msgpack", "json", "pickle"})


def compress(typ: str, data: bytes) -> tuple[str, bytes]:
    """`(typ, data)` compressed against `DICTIONARY_V1` and marked `ZDICT_SUFFIX` when it is long enough and
    that makes it smaller, else as it is."""
    if typ in COMPRESSED_TYPES and len(data) >= COMPRESS_AT:
        compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS, zdict=DICTIONARY_V1)
        packed = compressor.compress(data) + compressor.flush()
        if len(packed) < len(data):
            return typ + ZDICT_SUFFIX, packed
    return typ, data


def decompress(typ: str, data: bytes) -> tuple[str, bytes]:
    """The serializer's `(type, bytes)` of a stored value (unsealed), whether `compress` compressed it or not.

    Raises:
        zlib.error: a marked value's bytes are not zlib data (a damaged row).
    """
    if typ.endswith(ZDICT_SUFFIX):
        decompressor = zlib.decompressobj(zlib.MAX_WBITS, zdict=DICTIONARY_V1)
        plain = decompressor.decompress(data) + decompressor.flush()
        if not decompressor.eof:
            raise zlib.error("incomplete or truncated stream")
        return typ[: -len(ZDICT_SUFFIX)], plain
    if typ.endswith(ZLIB_SUFFIX):
        return typ[: -len(ZLIB_SUFFIX)], zlib.decompress(data)
    return typ, data
