"""The session cookie's seal: a cookie opens only with its key, unchanged and in time."""

from __future__ import annotations

from pathlib import Path

from app.ui.session import Sealer


def test_a_sealed_cookie_opens_with_its_key_only(tmp_path: Path) -> None:
    sealer = Sealer.from_data_dir(tmp_path / "data")
    cookie, session = sealer.seal("tsr_0123456789abcdef_secret")
    assert "secret" not in cookie
    assert sealer.open(cookie) == session
    # Another process on the same data directory opens it; the key file is the owner's alone.
    assert Sealer.from_data_dir(tmp_path / "data").open(cookie) == session
    assert (tmp_path / "data" / "ui-session.key").stat().st_mode & 0o777 == 0o600
    assert Sealer.from_data_dir(tmp_path / "other").open(cookie) is None
    flipped = cookie[:20] + ("A" if cookie[20] != "A" else "B") + cookie[21:]
    assert sealer.open(flipped) is None
    assert sealer.open("") is None and sealer.open("x" * 5000) is None
    assert sealer.open("é") is None


def test_an_unwritable_data_directory_still_serves_sessions(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sealer = Sealer.from_data_dir(blocker / "data")
    cookie, session = sealer.seal("tsr_0123456789abcdef_secret")
    assert sealer.open(cookie) == session
