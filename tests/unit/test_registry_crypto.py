"""Secrets at rest (app/registry/crypto.py): AES-256-GCM with named keys, rotation, and the
key generated into the data dir when none is configured."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from app.registry.crypto import AesGcmKeyring, KeyProblem, keyring_for, parse_keys
from app.settings import Settings


def key(name: str) -> str:
    return f"{name}:{base64.b64encode(os.urandom(32)).decode()}"


def test_sealed_values_open_only_with_their_key_and_are_never_the_same_twice() -> None:
    ring = AesGcmKeyring(parse_keys(key("a")))
    sealed = ring.encrypt(b"hunter2")
    assert b"hunter2" not in sealed.encode() and sealed.startswith("aesgcm:v1:a:")
    assert ring.encrypt(b"hunter2") != sealed  # a fresh nonce each time
    assert ring.decrypt(sealed) == b"hunter2"
    other = AesGcmKeyring(parse_keys(key("a")))  # same name, another key
    with pytest.raises(KeyProblem, match='does not open with the key "a"'):
        other.decrypt(sealed)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(KeyProblem):
        ring.decrypt(tampered)


def test_rotation_the_first_key_seals_every_key_opens() -> None:
    old, new = key("old"), key("new")
    sealed_before = AesGcmKeyring(parse_keys(old)).encrypt(b"v1")
    rotated = AesGcmKeyring(parse_keys(f"{new},{old}"))
    assert rotated.decrypt(sealed_before) == b"v1"
    assert rotated.encrypt(b"v2").startswith("aesgcm:v1:new:")
    dropped = AesGcmKeyring(parse_keys(new))
    with pytest.raises(KeyProblem, match='"old", which TESSERA_SECRET_KEYS no longer lists'):
        dropped.decrypt(sealed_before)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nocolon", "is not name:base64key"),
        ("a:***", "is not base64"),
        (f"a:{base64.b64encode(b'short').decode()}", "is 5 bytes; AES-256 takes 32"),
    ],
)
def test_malformed_keys_say_how_to_fix_them(text: str, says: str) -> None:
    with pytest.raises(KeyProblem, match=says):
        parse_keys(text)


def test_without_keys_one_is_generated_into_the_data_dir_and_kept(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", secret_keys="")  # none set
    sealed = keyring_for(settings).encrypt(b"x")
    path = tmp_path / "data" / "secret.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = AesGcmKeyring(parse_keys(path.read_text().strip()))  # as a restarted process reads it
    assert again.decrypt(sealed) == b"x"
