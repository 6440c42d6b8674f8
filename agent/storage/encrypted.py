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

**Compressed blobs** (`compression`): a long serialized value is compressed
before it is sealed, its type marked (`msgpack.zd1+aesgcm`); every form read.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.base import CipherProtocol, SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from agent.encryption import CIPHER_NAME, Keyring
from agent.errors import EncryptionKeyError
from agent.storage import compression


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


class KeyringSerializer(EncryptedSerializer):
    """`serde` with blobs compressed when long (`compression.COMPRESS_AT`) and sealed by `keyring` (plaintext when it has
    no key); reads every form, and rows written without compression or a key."""

    def __init__(self, keyring: Keyring, serde: SerializerProtocol) -> None:
        super().__init__(KeyringCipher(keyring), serde)
        self.keyring = keyring

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        typ, data = compression.compress(*self.serde.dumps_typed(obj))
        if not self.keyring.enabled:
            return typ, data
        ciphername, ciphertext = self.cipher.encrypt(data)
        return f"{typ}+{ciphername}", ciphertext

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        typ, payload = data
        if "+" in typ:  # sealed (`EncryptedSerializer`'s form)
            typ, ciphername = typ.split("+", 1)
            payload = self.cipher.decrypt(ciphername, payload)
        return self.serde.loads_typed(compression.decompress(typ, payload))
