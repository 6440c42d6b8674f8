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
"""

from __future__ import annotations

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


class KeyringSerializer(EncryptedSerializer):
    """`serde` with blobs sealed by `keyring` (plaintext when it has no key); reads both."""

    def __init__(self, keyring: Keyring, serde: SerializerProtocol) -> None:
        super().__init__(KeyringCipher(keyring), serde)
        self.keyring = keyring

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if not self.keyring.enabled:
            return self.serde.dumps_typed(obj)
        return super().dumps_typed(obj)
