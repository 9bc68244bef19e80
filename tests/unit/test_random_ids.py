"""Uids and random names drawn a block of OS randomness at a time (app.kube.meta)."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

from app.kube.meta import new_uid, random_hex


def test_uids_are_version_4_and_never_repeat_across_threads() -> None:
    def many(_: int) -> list[str]:
        return [new_uid() for _ in range(5000)]

    with ThreadPoolExecutor(4) as pool:
        uids = [u for chunk in pool.map(many, range(4)) for u in chunk]
    assert len(set(uids)) == len(uids) == 20_000
    parsed = [uuid.UUID(u) for u in uids[:100]]
    assert all(p.version == 4 and p.variant == uuid.RFC_4122 for p in parsed)
    hexes = {random_hex(8) for _ in range(1000)}
    assert len(hexes) == 1000 and all(len(h) == 16 for h in hexes)


def test_a_forked_child_does_not_hand_out_its_parents_bytes() -> None:
    new_uid()  # the parent holds a block it has not used up
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its next uid, then out
        os.write(write, new_uid().encode())
        os._exit(0)
    os.waitpid(child, 0)
    from_child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert from_child != new_uid()
