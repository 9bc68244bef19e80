"""Encryption at rest for values the registry must not store in plain text (Secret data).

AES-256-GCM, as the Kubernetes apiserver's `aesgcm` EncryptionConfiguration provider: a random
96-bit nonce per value, the key's name stored beside the ciphertext, so keys rotate (the first
key of `TESSERA_SECRET_KEYS` seals, every listed key opens). Without configured keys, one key is
generated into the data dir (`secret.key`, mode 0600) the first time it is needed.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.errors import TesseraError
from app.registry.strategy import Keyring
from app.settings import Settings

PREFIX = "aesgcm:v1:"
KEY_BYTES = 32
NONCE_BYTES = 12
KEY_FILE = "secret.key"
AAD = b"tessera.io/registry"


class KeyProblem(TesseraError):
    """A key is missing or malformed (a 500 whose message says how the operator fixes it)."""


class AesGcmKeyring(Keyring):
    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyProblem("no encryption key: set TESSERA_SECRET_KEYS=name:base64key")
        self._seal_name = keys[0][0]
        self._keys = {name: AESGCM(key) for name, key in keys}

    def encrypt(self, plain: bytes) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[self._seal_name].encrypt(nonce, plain, AAD)
        return f"{PREFIX}{self._seal_name}:{base64.b64encode(nonce + sealed).decode()}"

    def decrypt(self, sealed: str) -> bytes:
        if not sealed.startswith(PREFIX):
            raise KeyProblem("the stored value is not sealed by this server")
        name, _, text = sealed[len(PREFIX) :].partition(":")
        key = self._keys.get(name)
        if key is None:
            raise KeyProblem(
                f'the stored value was sealed with the key "{name}", which TESSERA_SECRET_KEYS no '
                "longer lists: add it back (after the key that seals) to read it"
            )
        raw = base64.b64decode(text)
        try:
            return key.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], AAD)
        except InvalidTag as exc:
            raise KeyProblem(f'the stored value does not open with the key "{name}"') from exc


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """`name:base64key,...` -> [(name, key)]; each key 32 bytes."""
    keys: list[tuple[str, bytes]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, encoded = item.partition(":")
        if not sep or not name or ":" in name or len(name) > 32:
            raise KeyProblem(
                f"TESSERA_SECRET_KEYS: {name[:32]!r} is not name:base64key (a short name, a colon, "
                "then 32 bytes in base64, e.g. from `head -c 32 /dev/urandom | base64`)"
            )
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error as exc:
            raise KeyProblem(f'TESSERA_SECRET_KEYS: the key "{name}" is not base64') from exc
        if len(key) != KEY_BYTES:
            raise KeyProblem(
                f'TESSERA_SECRET_KEYS: the key "{name}" is {len(key)} bytes; AES-256 takes '
                f"{KEY_BYTES} (head -c 32 /dev/urandom | base64)"
            )
        keys.append((name, key))
    return keys


def _file_key(data_dir: Path) -> list[tuple[str, bytes]]:
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        key = base64.b64encode(os.urandom(KEY_BYTES)).decode()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use that one
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(f"local:{key}\n")
    return parse_keys(path.read_text().strip())


_cache: dict[tuple[str, str], AesGcmKeyring] = {}
_lock = threading.Lock()


def keyring_for(settings: Settings) -> AesGcmKeyring:
    """The keyring `settings` name (made once per process)."""
    cache_key = (settings.secret_keys, str(settings.data_dir.resolve()))
    with _lock:
        keyring = _cache.get(cache_key)
        if keyring is None:
            keys = (
                parse_keys(settings.secret_keys)
                if settings.secret_keys
                else _file_key(settings.data_dir)
            )
            keyring = _cache[cache_key] = AesGcmKeyring(keys)
        return keyring


class LazyKeyring(Keyring):
    """The keyring `settings` name (`keyring_for`), looked up when something is first sealed or
    opened: the stores of most requests open nothing, and the lookup resolves the data
    directory's path (system calls) each time."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._keyring: AesGcmKeyring | None = None

    def _opened(self) -> AesGcmKeyring:
        if self._keyring is None:
            self._keyring = keyring_for(self._settings)
        return self._keyring

    def encrypt(self, plain: bytes) -> str:
        return self._opened().encrypt(plain)

    def decrypt(self, sealed: str) -> bytes:
        return self._opened().decrypt(sealed)
