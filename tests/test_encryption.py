"""The keyring (`agent.encryption`): keys as the setting takes them, sealing and opening, rotation, tampering,
and the errors, which name the setting and never show a key."""

from __future__ import annotations

import base64
import os

import pytest
from pydantic import SecretStr

from agent import ConfigurationError, EncryptionKeyError
from agent.config import load_settings
from agent.encryption import NO_KEYS, OVERHEAD_BYTES, SEALED_PREFIX, Keyring, generate_key, is_sealed, parse_keys

A, B = generate_key(), generate_key()


def keyring(*keys: str) -> Keyring:
    return Keyring(parse_keys(",".join(keys)))


def test_a_sealed_text_opens_to_itself_and_holds_none_of_it():
    ring = keyring(A)
    sealed = ring.seal_text("I'm headed to SF!")
    # A word of the text, not "SF": two letters turn up in random base64 about once in 60 seals.
    assert sealed.startswith(SEALED_PREFIX) and "headed" not in sealed
    assert ring.open_text(sealed) == "I'm headed to SF!"
    assert ring.seal_text("I'm headed to SF!") != sealed  # a new nonce each time


def test_a_sealed_value_costs_at_most_33_bytes_more_than_its_plaintext_and_compressible_values_less():
    ring = keyring(A)
    noise = os.urandom(1000)
    assert len(ring.encrypt(noise)) == 1000 + OVERHEAD_BYTES == 1033
    words = b"the trip to Lisbon in May " * 40
    assert len(ring.encrypt(words)) < len(words) / 4
    assert ring.decrypt(ring.encrypt(words)) == words and ring.decrypt(ring.encrypt(noise)) == noise


def test_rotation_writes_with_the_first_key_and_reads_with_any():
    old = keyring(A).seal_text("written under A")
    rotated = keyring(B, A)
    assert rotated.open_text(old) == "written under A"
    new = rotated.seal_text("written under B")
    assert keyring(B).open_text(new) == "written under B"
    with pytest.raises(EncryptionKeyError, match="not among the keys of encryption_key"):
        keyring(A).open_text(new)


def test_a_missing_key_names_the_setting_and_the_key_id():
    sealed = keyring(A).seal_text("secret")
    with pytest.raises(EncryptionKeyError) as missing:
        NO_KEYS.open_text(sealed)
    assert "AGENT_ENCRYPTION_KEY" in missing.value.message and "no key is configured" in missing.value.message
    with pytest.raises(EncryptionKeyError) as wrong:
        keyring(B).open_text(sealed)
    assert keyring(A).key_ids[0] in wrong.value.message and A not in wrong.value.message


def test_an_altered_value_fails_its_tag_instead_of_reading_as_garbage():
    ring = keyring(A)
    sealed = bytearray(ring.encrypt(b"pay 10 EUR"))
    sealed[-20] ^= 1
    with pytest.raises(EncryptionKeyError, match="altered"):
        ring.decrypt(bytes(sealed))


def test_plaintext_passes_through_so_data_written_before_encryption_reads():
    ring = keyring(A)
    assert ring.open_text("plain old title") == "plain old title"
    assert ring.open_text(None) is None
    assert ring.open_json({"output": []}) == {"output": []}
    assert ring.open_json(ring.seal_json({"output": [1]})) == {"output": [1]}


def test_without_keys_nothing_is_sealed():
    assert not NO_KEYS.enabled
    assert NO_KEYS.seal_text("hello") == "hello" and NO_KEYS.seal_json({"a": 1}) == {"a": 1}
    assert not is_sealed("hello")


def test_keys_are_base64_of_32_bytes_with_or_without_padding_in_either_alphabet():
    raw = os.urandom(32)
    forms = [base64.urlsafe_b64encode(raw).decode(), base64.standard_b64encode(raw).decode().rstrip("=")]
    assert parse_keys(" , ".join(forms)) == [raw]  # the same key twice is one key
    assert parse_keys([A, B]) == parse_keys(f"{A}\n{B}")


MALFORMED = {
    "empty": "",
    "separators only": " , ",
    "not base64": "not-a-key",
    "too short": base64.b64encode(b"short").decode(),
    "second key cut": f"{A},{A[:-4]}",
}


@pytest.mark.parametrize("value", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_key_is_a_configuration_error_naming_the_setting_and_not_the_key(value):
    with pytest.raises(ConfigurationError) as err:
        parse_keys(value)
    assert "encryption_key (AGENT_ENCRYPTION_KEY)" in err.value.message
    assert A not in err.value.message


def test_the_setting_comes_from_the_environment_and_never_shows_in_the_settings_repr(monkeypatch):
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", f"{B},{A}")
    settings = load_settings(database_url="memory://")
    assert isinstance(settings.encryption_key, SecretStr) and A not in repr(settings)
    assert Keyring.from_settings(settings).key_ids == keyring(B, A).key_ids


def test_a_key_provider_is_called_once_and_cannot_be_combined_with_a_key():
    calls = []

    def provider():
        calls.append(1)
        return [B, A]

    assert Keyring.from_settings(load_settings(database_url="memory://", encryption_key_provider=provider)).enabled
    assert calls == [1]
    with pytest.raises(ConfigurationError, match="not both"):
        Keyring.from_settings(load_settings(database_url="memory://", encryption_key=A, encryption_key_provider=provider))

    def failing():
        raise OSError("the vault is sealed")

    with pytest.raises(ConfigurationError, match="encryption_key_provider failed: OSError: the vault is sealed"):
        Keyring.from_settings(load_settings(database_url="memory://", encryption_key_provider=failing))
