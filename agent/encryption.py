"""Encryption at rest: the configured keys (`Keyring`), and how a stored value is sealed and opened.

Opt-in: with `encryption_key` (`AGENT_ENCRYPTION_KEY`) or
`encryption_key_provider` set, what holds a conversation's words is stored
encrypted with AES-256-GCM (`cryptography`'s `AESGCM`, an authenticated cipher:
a value altered in the database, or opened with another key, fails its tag
instead of reading as garbage):

* checkpoint blobs (every channel value and pending write, the message deltas
  included), through LangGraph's own `EncryptedSerializer` with this keyring
  as its cipher (`agent.storage.encrypted`);
* the text fields of our own rows: the message previews a checkpoint's
  summary stores (`last_message`, `last_user_message`, when its delta cannot
  give them back: `agent.storage.summaries`), thread titles, long-term
  memories' content, stored idempotent responses, and on Postgres a channel
  value that LangGraph keeps inline as a string.

What stays plaintext, and why (docs/encryption.md says it for users): ids,
timestamps, counts, token usage and the tree's links (the history, the
catalogue and the sweep query them in SQL and read no message); a thread's
`metadata` (the catalogue filters on it in SQL: it is the caller's labels,
not the conversation); memory embeddings on SQLite (semantic search compares
them; they are not text); the idempotency fingerprint (a SHA-256 compared,
never read back).

**Keys and rotation.** A key is 32 random bytes, written in base64
(`generate_key()`). The setting holds one key or several, comma-separated,
newest first: everything is written with the first, and read with whichever
wrote it, so rotating is "put the new key first, keep the old ones after it
until nothing needs them". Each sealed value starts with its key's id (the
first 4 bytes of a SHA-256 of the key, which tell nothing of the key), so a
read tries one key, and a missing key is named by its id.

**Data written before encryption was turned on still reads**: a value that
does not carry the sealed form is taken as plaintext, and new writes are
sealed. LangGraph's `EncryptedSerializer` reads an unencrypted blob the same
way. Nothing is rewritten in place; `keep_latest` retention and new turns
write sealed rows, and exporting then importing a thread rewrites it whole.

**Errors.** An encrypted value with no key configured, or written with a key
the setting lacks, or one whose tag fails, is `EncryptionKeyError` (a
`ConfigurationError`) naming the setting and the key id: never garbage.

Formats: a sealed blob is `key id (4) | nonce (12) | ciphertext | tag (16)`;
the ciphertext is of one format byte and the value, deflate-compressed when that
makes it smaller (format 1) or as it is (format 0), so a sealed blob is at
most 33 bytes more than its plaintext. A sealed text is `SEALED_PREFIX` and
that blob in unpadded URL-safe base64.

**Why compress before encrypting.** Ciphertext does not compress, and
Postgres compresses large values (TOAST) before they reach the disk: sealed
as they are, the message deltas took 43% more room than plaintext ones, and
the storage benchmark went from 2.9 to 4.1 times the messages' bytes
(`bench.encryption`). Compressing first keeps the storage bound. The cost is
that a value's length says how compressible it is; someone who can read the
database *and* put text of their choosing into the same value as a secret
(the same turn's messages) could, over many tries, learn about that secret
from the lengths (the CRIME/BREACH attacks on TLS). At rest, with values
written once, that is a narrow risk; the alternative was to break the bound.
A random 96-bit nonce per value keeps one key safe for about 2**32 values
(NIST SP 800-38D, 8.3); rotate well before, which at one value per message
is billions of messages.

This module imports only the standard library until a key is configured
(`cryptography` is loaded then), so read-only commands stay light.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigurationError, EncryptionKeyError

if TYPE_CHECKING:
    from agent.config import AgentSettings

#: The setting, as messages name it.
SETTING = "encryption_key (AGENT_ENCRYPTION_KEY)"
#: Bytes of a key (AES-256).
KEY_BYTES = 32
#: How a sealed text starts (then base64 of a sealed blob). Old plaintext that starts so is taken as sealed.
SEALED_PREFIX = "ttenc1:"
#: The cipher's name in a blob's type (`msgpack+aesgcm`), as LangGraph's `EncryptedSerializer` records it.
CIPHER_NAME = "aesgcm"

_KEY_ID_BYTES, _NONCE_BYTES, _TAG_BYTES = 4, 12, 16
#: Bytes a sealed blob adds to its plaintext at most (key id, nonce, tag, format byte).
OVERHEAD_BYTES = _KEY_ID_BYTES + _NONCE_BYTES + _TAG_BYTES + 1
#: The format byte: the value as it is, or zlib-compressed. Values shorter than this are never compressed.
_RAW, _ZLIB = b"\x00", b"\x01"
_COMPRESS_FROM = 64
_SEPARATORS = re.compile(r"[\s,]+")


def generate_key() -> str:
    """A new random key, in the form the setting takes (URL-safe base64 of 32 bytes)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def key_id(key: bytes) -> bytes:
    """The 4-byte id a sealed value carries for `key` (see the module docstring)."""
    return hashlib.sha256(b"timetravel-agent encryption key id\x00" + key).digest()[:_KEY_ID_BYTES]


def parse_keys(value: str | Sequence[str]) -> list[bytes]:
    """The keys of a setting's value: one string of base64 keys separated by commas or spaces (or a list
    of such strings), newest first; duplicates dropped.

    Raises:
        ConfigurationError: a key that is not base64 of exactly 32 bytes (named by its position, never
            shown), or no key at all.
    """
    texts = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(text, str) for text in texts):
        raise ConfigurationError(f"{SETTING} must be a string of base64 keys (or a list of them).")
    parts = [part for text in texts for part in _SEPARATORS.split(text.strip()) if part]
    if not parts:
        raise ConfigurationError(f"{SETTING} holds no key.")
    keys: list[bytes] = []
    for position, part in enumerate(parts, start=1):
        key = _decode_key(part)
        if key is None:
            raise ConfigurationError(
                f"{SETTING}: key {position} of {len(parts)} is not the base64 of {KEY_BYTES} bytes. Make one with "
                "`python -c \"from agent.encryption import generate_key; print(generate_key())\"`."
            )
        if key not in keys:
            keys.append(key)
    return keys


def _decode_key(text: str) -> bytes | None:
    padded = text + "=" * (-len(text) % 4)
    for decode in (base64.urlsafe_b64decode, base64.standard_b64decode):
        try:
            key = decode(padded.encode("ascii"))
        except (binascii.Error, ValueError, UnicodeEncodeError):
            continue
        if len(key) == KEY_BYTES:
            return key
    return None


class Keyring:
    """The configured keys, newest first: seals with the first, opens with whichever sealed a value.

    `Keyring()` (no keys) is encryption off: `seal_*` return their input, `open_*` pass plaintext through
    and refuse a sealed value (`EncryptionKeyError`). Thread-safe (AES-GCM objects hold no state).
    """

    def __init__(self, keys: Sequence[bytes] = ()) -> None:
        self._ciphers: dict[bytes, Any] = {}
        self._first: bytes | None = None
        if keys:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            for key in keys:
                self._ciphers.setdefault(key_id(key), AESGCM(key))
            self._first = key_id(keys[0])

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> Keyring:
        """The keyring of `settings.encryption_key`, or of what `encryption_key_provider()` returns (called
        once, now); no keys when neither is set.

        Raises:
            ConfigurationError: both are set, the provider fails or returns no string, or a key is malformed.
        """
        secret = settings.encryption_key
        provider = settings.encryption_key_provider
        if secret is not None and provider is not None:
            raise ConfigurationError("Set encryption_key or encryption_key_provider, not both.")
        if provider is not None:
            try:
                value = provider()
            except Exception as exc:  # the provider's own error, e.g. a secret manager that cannot be reached
                raise ConfigurationError(f"encryption_key_provider failed: {type(exc).__name__}: {exc}") from None
            return cls(parse_keys(value))
        if secret is not None:
            return cls(parse_keys(secret.get_secret_value()))
        return cls()

    @property
    def enabled(self) -> bool:
        """Whether values are sealed (a key is configured)."""
        return self._first is not None

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys, newest first, in hex (what error messages name)."""
        return [kid.hex() for kid in self._ciphers]

    # -- bytes ----------------------------------------------------------------------------------
    def encrypt(self, data: bytes, *, associated_data: bytes = b"") -> bytes:
        """`data` sealed with the newest key (`associated_data` is authenticated, not stored).

        Raises:
            EncryptionKeyError: no key is configured.
        """
        if self._first is None:
            raise EncryptionKeyError(f"Cannot encrypt: no key is configured in {SETTING}.")
        body = _RAW + data
        if len(data) >= _COMPRESS_FROM:
            packed = _deflate(data)
            if len(packed) < len(data):
                body = _ZLIB + packed
        nonce = os.urandom(_NONCE_BYTES)
        return self._first + nonce + self._ciphers[self._first].encrypt(nonce, body, associated_data or None)

    def decrypt(self, sealed: bytes, *, associated_data: bytes = b"", what: str = "Stored data") -> bytes:
        """The plaintext of a value from `encrypt`.

        Raises:
            EncryptionKeyError: no key configured, the key that sealed it is not configured, or its tag
                fails (altered, or another key with the same id); `what` starts the message.
        """
        kid = bytes(sealed[:_KEY_ID_BYTES])
        if not self._ciphers:
            raise EncryptionKeyError(
                f"{what} is encrypted (key id {kid.hex()}), and no key is configured: set {SETTING} to the key "
                "it was written with. Nothing was written."
            )
        cipher = self._ciphers.get(kid)
        if cipher is None or len(sealed) < OVERHEAD_BYTES:
            raise EncryptionKeyError(
                f"{what} is encrypted with key id {kid.hex()}, which is not among the keys of {SETTING} "
                f"(ids {', '.join(self.key_ids)}): add that key after the newest one. Nothing was written."
            )
        from cryptography.exceptions import InvalidTag

        nonce, body = sealed[_KEY_ID_BYTES : _KEY_ID_BYTES + _NONCE_BYTES], sealed[_KEY_ID_BYTES + _NONCE_BYTES :]
        try:
            opened = cipher.decrypt(bytes(nonce), bytes(body), associated_data or None)
        except InvalidTag:
            raise EncryptionKeyError(
                f"{what} does not decrypt with key id {kid.hex()} of {SETTING}: it was altered, or written with "
                "another key. Nothing was written."
            ) from None
        form, value = opened[:1], opened[1:]
        if form == _ZLIB:
            return zlib.decompress(value, wbits=-15)  # authenticated above: only a key holder wrote it
        if form != _RAW:
            raise EncryptionKeyError(f"{what} is in an encrypted format this version does not read ({form.hex()}).")
        return value

    # -- text and JSON --------------------------------------------------------------------------
    def seal_text(self, text: str | None) -> str | None:
        """`text` sealed (`SEALED_PREFIX` + base64), or `text` itself when encryption is off (or it is None)."""
        if self._first is None or text is None:
            return text
        return SEALED_PREFIX + base64.urlsafe_b64encode(self.encrypt(text.encode("utf-8"))).rstrip(b"=").decode("ascii")

    def open_text(self, value: Any, *, what: str = "Stored text") -> Any:
        """The plaintext of a sealed text; any other value (plaintext written before encryption, None, a
        number) as it is.

        Raises:
            EncryptionKeyError: see `decrypt`.
        """
        if not is_sealed(value):
            return value
        body = value[len(SEALED_PREFIX) :]
        try:
            sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise EncryptionKeyError(f"{what} looks encrypted but is not valid base64: it was altered.") from None
        return self.decrypt(sealed, what=what).decode("utf-8")

    def seal_json(self, value: Any) -> Any:
        """A JSON value to store: `value` itself when encryption is off, else its JSON text sealed (a string)."""
        return value if self._first is None else self.seal_text(json.dumps(value, ensure_ascii=False))

    def open_json(self, value: Any, *, what: str = "Stored data") -> Any:
        """The value `seal_json` was given.

        Raises:
            EncryptionKeyError: see `decrypt`.
        """
        return json.loads(self.open_text(value, what=what)) if is_sealed(value) else value


def _deflate(data: bytes) -> bytes:
    # Raw deflate (no zlib header and checksum: 6 bytes less; the tag already authenticates the value).
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


def is_sealed(value: Any) -> bool:
    """Whether `value` is a sealed text (`Keyring.seal_text`)."""
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


#: Encryption off: the keyring of an agent with no key configured.
NO_KEYS = Keyring()
