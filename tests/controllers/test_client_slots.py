"""The controllers' client gives status writes slots of their own, few (STATUSES_AT_ONCE): while
that many hang at the API, a further status write waits, and a create still goes at once (a
burst's objects and pods never wait behind the status writes). The API here is a stand-in that
holds every status write until told."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.controllers import client as client_module
from app.controllers.client import DEPLOYMENTS, Client


class HeldStatuses:
    """A connection pool whose status writes wait for `release`; it counts what reached it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.statuses = 0
        self.others = 0

    async def request(self, method: str, url: str, **_: Any) -> httpx.Response:
        if url.endswith("/status"):
            self.statuses += 1
            await self.release.wait()
        else:
            self.others += 1
        return httpx.Response(200, json={"metadata": {"name": "x"}})


def test_status_writes_have_few_slots_and_creates_pass_them() -> None:
    slots = client_module.STATUSES_AT_ONCE

    async def scenario() -> None:
        client = Client("https://127.0.0.1:1", "token")
        held = HeldStatuses()
        client._pools = [held]  # type: ignore[list-item]
        client._busy = [0]
        body = {"metadata": {"name": "d"}, "status": {}}
        writes = [
            asyncio.create_task(client.update(DEPLOYMENTS, "ns", "d", body, sub="status"))
            for _ in range(slots)
        ]
        writes.append(
            asyncio.create_task(client.patch(DEPLOYMENTS, "ns", "d", {"status": {}}, sub="status"))
        )
        await asyncio.sleep(0.05)
        assert held.statuses == slots  # the one more waits for a slot
        # the common slots are free: a create and a plain patch go at once
        async with asyncio.timeout(5):
            await client.create(DEPLOYMENTS, "ns", {"metadata": {"name": "e"}})
            await client.patch(DEPLOYMENTS, "ns", "d", {"metadata": {"labels": {"a": "b"}}})
        assert held.others == 2 and held.statuses == slots
        held.release.set()
        async with asyncio.timeout(5):
            await asyncio.gather(*writes)
        assert held.statuses == slots + 1

    asyncio.run(scenario())
