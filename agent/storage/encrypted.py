"""Checkpoint blobs sealed by the agent's keyring, through LangGraph's own `EncryptedSerializer`.

LangGraph's `EncryptedSerializer` (`langgraph.checkpoint.serde.encrypted`)
wraps a serializer: it appends the cipher's name to a blob's type
(`msgpack+aesgcm`) and reads a type without one as plaintext, which is how rows
written before encryption was turned on keep reading. Its ready-made cipher
(`from_pycryptodome_aes`) takes one key, in EAX mode, from pycryptodome; here
the cipher is the agent's `Keyring` (AES-GCM from `cryptography`, several keys
for rotation, errors that name the setting), so blobs and the agent's own
columns share one key list and one format (`agent.encryption`).

`KeyringSerializer` also stands in front of the saver's serializer when no key
is configured: it writes plaintext then, and an encrypted blob read without
its key is `EncryptionKeyError` rather than LangGraph's "unknown type".

**Compressed blobs.** A serialized value of at least `COMPRESS_AT` bytes is
stored zlib-compressed (stdlib, level 6) when that makes it smaller, its type
marked with `ZLIB_SUFFIX` (`msgpack.zlib`, sealed: `msgpack.zlib+aesgcm`),
before it is sealed (a sealed blob does not compress). A type without the mark
is read as it always was, so stored rows need no rewrite. Why: a turn's message
delta is most of its blob bytes and chat text compresses about 2:1 (with 200-
byte messages, 1,160 bytes of blob became about 640); LangGraph's serde has no
compression of its own (`langgraph.checkpoint.serde` offers msgpack, JSON,
pickle and encryption), and Postgres compresses (TOAST) only values of about
2 kB and more, SQLite never. Below `COMPRESS_AT` zlib's header and the lost
byte alignment earn nothing. Compressing costs about 35 us per kilobyte, reading
it back less.
"""

from __future__ import annotations

import zlib
from typing import Any

from langgraph.checkpoint.serde.base import CipherProtocol, SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from agent.encryption import CIPHER_NAME, Keyring
from agent.errors import EncryptionKeyError


class KeyringCipher(CipherProtocol):
    """LangGraph's cipher protocol over a `Keyring`: `(name, sealed bytes)`."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return CIPHER_NAME, self.keyring.encrypt(plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        if ciphername != CIPHER_NAME:
            raise EncryptionKeyError(
                f"A checkpoint blob is encrypted with cipher {ciphername!r}, which this agent does not read "
                f"(it reads {CIPHER_NAME!r}). Nothing was written."
            )
        return self.keyring.decrypt(ciphertext, what="A checkpoint blob")


#: Smallest serialized value stored compressed, in bytes (see "Compressed blobs" above).
COMPRESS_AT = 256
#: The mark of a compressed value's type: `msgpack.zlib` is `msgpack` bytes, zlib-compressed.
ZLIB_SUFFIX = ".zlib"
#: Types whose bytes are compressed when long enough (LangGraph's "bytes" and "null" are left as they are).
COMPRESSED_TYPES = frozenset({"msgpack", "json", "pickle"})


class KeyringSerializer(EncryptedSerializer):
    """`serde` with blobs compressed when long (`COMPRESS_AT`) and sealed by `keyring` (plaintext when it has
    no key); reads every form, and rows written without compression or a key."""

    def __init__(self, keyring: Keyring, serde: SerializerProtocol) -> None:
        super().__init__(KeyringCipher(keyring), serde)
        self.keyring = keyring

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        typ, data = self.serde.dumps_typed(obj)
        if typ in COMPRESSED_TYPES and len(data) >= COMPRESS_AT:
            packed = zlib.compress(data)
            if len(packed) < len(data):
                typ, data = typ + ZLIB_SUFFIX, packed
        if not self.keyring.enabled:
            return typ, data
        ciphername, ciphertext = self.cipher.encrypt(data)
        return f"{typ}+{ciphername}", ciphertext

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        typ, payload = data
        if "+" in typ:  # sealed (`EncryptedSerializer`'s form)
            typ, ciphername = typ.split("+", 1)
            payload = self.cipher.decrypt(ciphername, payload)
        if typ.endswith(ZLIB_SUFFIX):
            typ, payload = typ[: -len(ZLIB_SUFFIX)], zlib.decompress(payload)
        return self.serde.loads_typed((typ, payload))
