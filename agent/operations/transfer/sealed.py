"""Sealed documents: an export encrypted whole with the agent's keys, for deployments with encryption at rest.

With a key configured (`agent.encryption`), `export_thread` gives this
envelope unless asked for plaintext (`plaintext=True`, `tt-agent export
--plaintext`), so a thread leaves the database as encrypted as it was in it::

    {"format": "timetravel-agent.sealed-thread", "version": 1, "thread_id": "<id>",
     "sealed": "<base64url: key id | nonce | AES-GCM of the document's JSON | tag>"}

`import_thread` opens it with the importing agent's keys (any of them: a
document sealed before a rotation still imports) and then reads the document
inside as any other. Without a key configured, exports are plain documents as
before.

Why one envelope around the whole document rather than sealed fields inside
it: the document's format is the transfer's own, versioned on its own
(`document`); an envelope seals any version of it unchanged, and opening one
needs nothing of the format inside. `thread_id` stays readable (a tool can
tell which thread a file holds without the key; ids are not encrypted at rest
either) and is authenticated with the ciphertext as associated data, so it
cannot be changed without the document failing to open.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from agent.encryption import SETTING, Keyring
from agent.errors import EncryptionKeyError, InvalidRequest

#: The `format` of a sealed document.
SEALED_FORMAT = "timetravel-agent.sealed-thread"
#: The envelope version this code writes and reads.
SEALED_VERSION = 1


def _associated_data(thread_id: str) -> bytes:
    return f"{SEALED_FORMAT}\n{SEALED_VERSION}\n{thread_id}".encode()


def seal_document(document: dict[str, Any], keyring: Keyring) -> dict[str, Any]:
    """`document` (from `export_thread`) sealed with the newest key of `keyring` (which has one)."""
    thread_id = document["thread"]["thread_id"]
    text = json.dumps(document, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    sealed = keyring.encrypt(text, associated_data=_associated_data(thread_id))
    return {
        "format": SEALED_FORMAT,
        "version": SEALED_VERSION,
        "thread_id": thread_id,
        "sealed": base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii"),
    }


def is_sealed_document(value: Any) -> bool:
    """Whether `value` is a sealed document's envelope (by its `format`)."""
    return isinstance(value, dict) and value.get("format") == SEALED_FORMAT


def open_document(envelope: dict[str, Any], keyring: Keyring, *, name: str = "document") -> Any:
    """The document inside a sealed envelope (checked afterwards as any imported document).

    Raises:
        InvalidRequest: a malformed envelope, or one `keyring` cannot open (the message names the setting
            and the key id: import it where that key is configured, or export it in plaintext).
    """
    thread_id, body = envelope.get("thread_id"), envelope.get("sealed")
    if envelope.get("version") != SEALED_VERSION or set(envelope) != {"format", "version", "thread_id", "sealed"}:
        raise InvalidRequest(
            f"{name} is a sealed document of another version or shape; this agent reads version {SEALED_VERSION} "
            "with exactly format, version, thread_id and sealed. Nothing was written."
        )
    if not isinstance(thread_id, str) or not isinstance(body, str):
        raise InvalidRequest(f"{name}.thread_id and {name}.sealed must be strings. Nothing was written.")
    try:
        sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{name}.sealed is not base64. Nothing was written.") from None
    try:
        text = keyring.decrypt(sealed, associated_data=_associated_data(thread_id), what=f"{name} (thread {thread_id!r})")
    except EncryptionKeyError:
        raise InvalidRequest(
            f"{name} (thread {thread_id!r}) is sealed with key id {sealed[:4].hex()}, which {SETTING} of this "
            "agent does not hold (or it was altered): import it where that key is configured, or export it with "
            "plaintext=True. Nothing was written."
        ) from None
    try:
        return json.loads(text.decode("utf-8", "surrogatepass"))
    except ValueError:  # pragma: no cover - only a document this code sealed opens
        raise InvalidRequest(f"{name} opens to something that is not JSON. Nothing was written.") from None
