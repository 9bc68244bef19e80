"""The notifier wakes a waiter for the kinds it waits for: a watch of pods is not woken by a
lease renewal (with a node agent per node, that was every watch woken by every heartbeat)."""

from __future__ import annotations

import asyncio

import pytest

from app.watch.notify import MAX_MESSAGE_BYTES, Notifier, parse


def test_a_waiter_wakes_for_its_kinds_only() -> None:
    async def scenario() -> list[str]:
        notifier = Notifier(None)
        await notifier.start()
        woken: list[str] = []

        async def waiter(name: str, kinds: tuple[str, ...] | None) -> None:
            await notifier.wait(100, 30, kinds)
            woken.append(name)

        tasks = [
            asyncio.create_task(waiter("pods", ("Pod",))),
            asyncio.create_task(waiter("scheduler", ("Pod", "Node"))),
            asyncio.create_task(waiter("anything", None)),
        ]
        await asyncio.sleep(0.05)
        notifier.publish(101, frozenset({"Lease"}))
        await asyncio.sleep(0.05)
        assert woken == ["anything"]  # a lease: neither the pods' watch nor the scheduler
        notifier.publish(102, frozenset({"Node", "Event"}))
        await asyncio.sleep(0.05)
        assert woken == ["anything", "scheduler"]
        notifier.publish(103, frozenset({"Pod"}))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        # what was announced is remembered: a wait from before it returns at once
        await asyncio.wait_for(notifier.wait(102, 30, ("Pod",)), 1)
        await asyncio.wait_for(notifier.wait(101, 30, ("Node",)), 1)
        # a commit that did not say its kinds wakes every waiter
        late = asyncio.create_task(notifier.wait(103, 30, ("Namespace",)))
        await asyncio.sleep(0.05)
        notifier.publish(104)
        await asyncio.wait_for(late, 5)
        return woken

    assert asyncio.run(scenario()) == ["anything", "scheduler", "pods"]


def test_a_stopping_server_wakes_every_waiter() -> None:
    async def scenario() -> None:
        notifier = Notifier(None)
        await notifier.start()
        waiting = [asyncio.create_task(notifier.wait(0, 30, (k,))) for k in ("Pod", "Lease")]
        await asyncio.sleep(0.05)
        notifier.end_streams()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        await asyncio.wait_for(notifier.wait(10**9, 30, ("Pod",)), 1)  # and waits no more

    asyncio.run(scenario())


def test_messages_say_the_version_and_the_kinds() -> None:
    assert parse(b"42") == (42, None)
    assert parse(b"42 Lease,Pod") == (42, frozenset({"Lease", "Pod"}))
    with pytest.raises(ValueError):
        parse(b"not a version")
    with pytest.raises(ValueError):
        parse(b"1 " + b"K" * MAX_MESSAGE_BYTES)


def test_the_log_follower_wakes_waiters_for_what_no_notification_said() -> None:
    """A commit made where no notification comes from (another process, no Redis) wakes the
    waiters of its kind through the one follower of the log, which reads from the oldest
    waiter's version, then on from where it stopped, and reads nothing once no one waits."""

    async def scenario() -> None:
        notifier = Notifier(None)
        await notifier.start()
        log: dict[str, int] = {}  # the newest change of each kind, as the store has it
        store = {"version": 100}
        reads: list[int] = []

        async def read(after: int) -> tuple[int, dict[str, int]]:
            reads.append(after)
            return store["version"], {k: v for k, v in log.items() if v > after}

        notifier.follow_log(read, every=0.02)
        assert notifier.follows_log
        pods = asyncio.create_task(notifier.wait(100, 30, ("Pod",)))
        nodes = asyncio.create_task(notifier.wait(90, 30, ("Node",)))
        await asyncio.sleep(0.1)
        assert reads and reads[0] == 90 and not pods.done() and not nodes.done()
        log["Pod"] = store["version"] = 105  # written elsewhere: nothing published
        await asyncio.wait_for(pods, 5)
        assert not nodes.done()
        assert notifier.newest(("Pod",)) == 105
        await asyncio.sleep(0.1)
        assert reads[-1] == 105  # on from where the last look ended, not from the start
        log["Node"] = store["version"] = 107
        await asyncio.wait_for(nodes, 5)
        await asyncio.sleep(0.1)
        count = len(reads)
        await asyncio.sleep(0.2)
        assert len(reads) <= count + 1  # no one waits: the follower has stopped

    asyncio.run(scenario())
