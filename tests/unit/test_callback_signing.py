"""The signature receivers check (app/callbacks/signing.py): what is signed verifies, and any
change of body, secret or time, or a replay past the tolerance, does not."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.callbacks.signing import SignatureError, compute, sign, verify

SECRET = "whsec_test"


@given(body=st.binary(max_size=2048), secret=st.text(min_size=1, max_size=64))
def test_what_is_signed_verifies_and_any_changed_byte_does_not(body: bytes, secret: str) -> None:
    header = sign(secret, body, timestamp=1_700_000_000)
    assert verify(secret, body, header, 300, now=1_700_000_100) == 1_700_000_000
    for i in range(min(len(body), 8)):
        changed = body[:i] + bytes([body[i] ^ 1]) + body[i + 1 :]
        with pytest.raises(SignatureError, match="does not match"):
            verify(secret, changed, header, 300, now=1_700_000_100)
    with pytest.raises(SignatureError, match="does not match"):
        verify(secret + "x", body, header, 300, now=1_700_000_100)


def test_the_header_is_t_and_v1_over_timestamp_dot_body() -> None:
    body = b'{"a":1}'
    t, v1 = sign(SECRET, body, timestamp=42).split(",")
    assert t == "t=42" and v1 == "v1=" + compute(SECRET, 42, body)
    assert v1[3:] == hmac.new(SECRET.encode(), b'42.{"a":1}', hashlib.sha256).hexdigest()


def test_old_and_future_timestamps_are_replays() -> None:
    header = sign(SECRET, b"x", timestamp=1000)
    assert verify(SECRET, b"x", header, 300, now=1300) == 1000
    with pytest.raises(SignatureError, match="beyond the tolerance of 300s"):
        verify(SECRET, b"x", header, 300, now=1301)
    with pytest.raises(SignatureError, match="tolerance"):
        verify(SECRET, b"x", header, 300, now=699)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "t=abc,v1=00",
        "v1=00",
        "t=1000",
        "t=1000,v0=00",
        "t=" + "9" * 13 + ",v1=0",
    ],
)
def test_malformed_headers_are_rejected(header: str | None) -> None:
    with pytest.raises(SignatureError):
        verify(SECRET, b"x", header, 300, now=1000)


def test_any_of_several_signatures_may_match() -> None:
    good = sign(SECRET, b"x", timestamp=1000).split(",")[1]
    assert verify(SECRET, b"x", f"t=1000,v1=deadbeef,{good}", 300, now=1000) == 1000


def test_the_readmes_few_lines_verify_what_tessera_signs() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Callbacks") :]
    code = section[section.index("```python\n") + 10 :]
    code = code[: code.index("```")]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    verified = namespace["verified"]
    body = b'{"specversion":"1.0","id":"x"}'
    assert verified(SECRET, body, sign(SECRET, body)) is True
    assert verified(SECRET, body + b" ", sign(SECRET, body)) is False
    assert verified("whsec_other", body, sign(SECRET, body)) is False
    assert verified(SECRET, body, sign(SECRET, body, timestamp=1_000)) is False
    assert verified(SECRET, body, "garbage") is False
