"""The vendored front-end files are the ones the registry published (checksums in the vendor
README), and the console's own pages load nothing from elsewhere."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[2] / "app" / "ui" / "static" / "vendor"
STATIC = VENDOR.parent


def test_vendored_files_match_their_recorded_checksums() -> None:
    lines = re.findall(r"^([0-9a-f]{64})  (\S+)$", (VENDOR / "README.md").read_text(), re.M)
    assert len(lines) >= 5
    for digest, name in lines:
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    recorded = {name for _, name in lines}
    present = {str(p.relative_to(VENDOR)) for p in VENDOR.glob("*/*")}
    assert present == recorded  # nothing vendored without a checksum


def test_the_console_names_no_other_origin() -> None:
    for path in [*STATIC.glob("*.js"), *STATIC.glob("*.css"), *STATIC.parent.glob("templates/*")]:
        text = path.read_text()
        assert not re.search(r"https?://", text), path
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, path
