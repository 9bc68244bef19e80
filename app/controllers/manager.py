"""The controller manager: as Kubernetes' kube-controller-manager, a process that speaks only
the public API.

It runs one shared informer per resource its controllers watch, and each controller's workers
over that controller's work queue. Only the leader acts: leadership is a
coordination.k8s.io/v1 Lease (`kube-system/tessera-controllers`), taken when it is free or its
holder stopped renewing it for its whole duration (as observed on this manager's own clock,
so clocks need not agree), and renewed every `retry` seconds. A leader that could not renew
for `renew_deadline` seconds (less than the lease's duration) stops its controllers before any
other manager may take the lease, so two managers never both act. On SIGTERM the leader stops
its controllers and then gives the lease up, so that another takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from app.controllers.base import Controller
from app.controllers.client import LEASES, ApiError, Client, Obj
from app.controllers.informer import Informers

log = logging.getLogger("tessera.controllers")

LEASE_NAMESPACE = "kube-system"
LEASE_NAME = "tessera-controllers"
RESYNC_SECONDS = 300.0


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Election:
    """The leader lease's timing (Kubernetes' defaults: 15 s, 10 s, 2 s)."""

    lease_seconds: int = 15
    renew_deadline: float = 10.0
    retry: float = 2.0
    namespace: str = LEASE_NAMESPACE
    name: str = LEASE_NAME

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.lease_seconds:
            raise ValueError("need 0 < retry < renew deadline < lease duration")


class LeaderElector:
    """Takes and keeps the Lease through the API (one PUT per renewal, conditional on the
    version read: of two managers writing at once one gets 409)."""

    def __init__(self, client: Client, identity: str, election: Election) -> None:
        self.client = client
        self.identity = identity
        self.election = election
        self._observed: tuple[Any, float] | None = None  # (holder, renewTime) and when seen
        self._lease: Obj | None = None
        self.transitions = 0

    async def try_acquire_or_renew(self) -> bool:
        e = self.election
        try:
            lease = await self.client.get(LEASES, e.namespace, e.name)
        except ApiError as exc:
            if not exc.not_found:
                raise
            return await self._create()
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        mono = time.monotonic()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, mono)
        holder = spec.get("holderIdentity")
        duration = int(spec.get("leaseDurationSeconds") or e.lease_seconds)
        if holder and holder != self.identity and mono - self._observed[1] < duration:
            return False  # held, and renewed within its duration as seen from here
        stamp = micro_now()
        new_spec = dict(spec)
        if holder != self.identity:
            new_spec["acquireTime"] = stamp
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        new_spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=e.lease_seconds, renewTime=stamp
        )
        body = {**lease, "spec": new_spec}  # metadata.resourceVersion: conditional
        try:
            self._lease = await self.client.update(LEASES, e.namespace, e.name, body)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                return False
            raise
        if holder != self.identity:
            self.transitions += 1
            log.info("%s leads the controllers (lease %s/%s)", self.identity, e.namespace, e.name)
        return True

    async def _create(self) -> bool:
        e = self.election
        stamp = micro_now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": e.name, "namespace": e.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": e.lease_seconds,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        try:
            self._lease = await self.client.create(LEASES, e.namespace, body)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self.transitions += 1
        log.info("%s leads the controllers (lease %s/%s)", self.identity, e.namespace, e.name)
        return True

    async def release(self) -> None:
        """Give the lease up (only if still ours): another manager takes it at once. The lease
        is read again first: a renewal cut short may have written it unseen."""
        if self._lease is None:
            return
        self._lease = None
        e = self.election
        with contextlib.suppress(ApiError, httpx.HTTPError):
            lease = await self.client.get(LEASES, e.namespace, e.name)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_now())
            await self.client.update(LEASES, e.namespace, e.name, {**lease, "spec": spec})
            log.info("%s gave the lease up", self.identity)


class Manager:
    def __init__(
        self,
        client: Client,
        controllers: Sequence[Controller],
        *,
        identity: str | None = None,
        election: Election | None = None,
        resync_seconds: float = RESYNC_SECONDS,
        election_client: Client | None = None,
    ) -> None:
        """`election_client`: the lease's own (as kube-controller-manager's leader election
        client): a renewal must not wait behind the controllers' requests in a burst."""
        self.client = client
        self.controllers = list(controllers)
        self.identity = identity or default_identity()
        self.election = election or Election()
        self.elector = LeaderElector(election_client or client, self.identity, self.election)
        self.resync_seconds = resync_seconds
        self.leading = asyncio.Event()

    async def run(self) -> None:
        """Wait to lead, run the controllers while leading; until cancelled (which stops the
        controllers first, then releases the lease)."""
        try:
            while True:
                await self._acquire()
                self.leading.set()
                try:
                    await self._lead()
                finally:
                    self.leading.clear()
                log.warning("%s lost the lease: controllers stopped", self.identity)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.elector.release())

    async def _acquire(self) -> None:
        while True:
            try:
                if await self.elector.try_acquire_or_renew():
                    return
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("leader election: %s", exc)
            await asyncio.sleep(self.election.retry)

    async def _lead(self) -> None:
        """Run informers and workers until the lease cannot be renewed in time."""
        informers = Informers(self.client)
        for controller in self.controllers:
            controller.queue = type(controller.queue)()
            controller.bind(self.client, informers)
            for resource in controller.resources:
                informers.get(resource).add_handler(_enqueuer(controller, resource))
        async with asyncio.TaskGroup() as group:
            renewing = group.create_task(self._renew())
            tasks = [group.create_task(i.run()) for i in informers.values()]
            tasks.append(group.create_task(self._workers(informers)))
            tasks.append(group.create_task(self._resync(informers)))
            try:
                await renewing
            finally:
                for task in tasks:
                    task.cancel()
                for controller in self.controllers:
                    controller.queue.close()

    async def _renew(self) -> None:
        """Renew every `retry` seconds; return when it failed for `renew_deadline` seconds."""
        e = self.election
        last = time.monotonic()
        while True:
            await asyncio.sleep(e.retry)
            try:
                async with asyncio.timeout(max(0.1, e.renew_deadline - (time.monotonic() - last))):
                    ok = await self.elector.try_acquire_or_renew()
            except (ApiError, httpx.HTTPError, TimeoutError) as exc:
                log.warning("renewing the leader lease: %s", exc)
                ok = False
            if ok:
                last = time.monotonic()
            elif time.monotonic() - last >= e.renew_deadline:
                return

    async def _workers(self, informers: Informers) -> None:
        await informers.wait_synced()
        log.info("informers synced: %d controllers start", len(self.controllers))
        async with asyncio.TaskGroup() as group:
            for controller in self.controllers:
                for _ in range(controller.workers):
                    group.create_task(_work(controller))

    async def _resync(self, informers: Informers) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            informers.resync()


def _enqueuer(controller: Controller, resource: Any) -> Any:
    def handle(event: str, old: Obj | None, new: Obj) -> None:
        keys = set(controller.key_of(resource, new))
        if old is not None and old is not new:
            keys.update(controller.key_of(resource, old))
        for key in keys:
            controller.queue.add(key)

    return handle


async def _work(controller: Controller) -> None:
    queue = controller.queue
    while True:
        key = await queue.get()
        if key is None:
            return
        try:
            again = await controller.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            delay = queue.add_rate_limited(key)
            level = logging.INFO if isinstance(exc, ApiError) and exc.conflict else logging.WARNING
            log.log(
                level,
                "%s %s: %s (again in %.2fs)",
                controller.name,
                key,
                exc,
                delay,
                exc_info=not isinstance(exc, ApiError | httpx.HTTPError),
            )
        else:
            queue.forget(key)
            if again is not None:
                queue.add_after(key, again)
        finally:
            queue.done(key)
