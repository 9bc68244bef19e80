"""The Job controller: applies `sync_job`'s decisions (app/controllers/job_sync.py) through the API.

It watches Jobs and pods; a pod's event concerns the Job that is its controller owner. Each
reconcile reads the Job and its pods from the informers' caches, and writes what `sync_job`
decides: pods created (owned by the Job: controller and blockOwnerDeletion), pods deleted (only
if still the same pod), the Job's status (conditional on the version read: a stale read is a
409, and the key is tried again), the Job deleted when its ttlSecondsAfterFinished has passed.

The caches lag the writes: a pod just deleted is still in the pod cache until the watch says
otherwise, so the next reconcile would replace it at once. As Kubernetes' controller
expectations, the Job waits until the cache shows the pods it created and no longer shows those
it deleted (or 30 s have passed). The pods it creates go into the cache at once (the API's
answer), as the ReplicaSet controller's do.

The pods are made by Kubernetes' slow start (1, 2, 4, ... at once, up to STEP), one step per
reconcile, the Job then queued again behind the other objects (base.py SlowStart): a burst of
Jobs gets every one's first pod before any one's next batch. The status's counts are written
once the steps are made; any other change of it (startTime, a condition) at once.

A Job being deleted (deletionTimestamp set) is left alone: its pods are the garbage collector's
(app/controllers/gc.py), which deletes them (Background, Foreground) or takes the Job's
ownerReference off them (Orphan); the Job controller neither deletes nor replaces them, and never
adopts a pod it does not own. A Job past its ttlSecondsAfterFinished is deleted with Foreground
propagation (as Kubernetes' TTL controller): it goes once its pods have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import ClassVar

from app.controllers.base import BURST_WORKERS, Controller, SlowStart, names_message
from app.controllers.client import PODS, Obj, Resource
from app.controllers.informer import controller_of, text_key
from app.controllers.job_sync import sync_job
from app.registry.kinds.jobs import selector_of

log = logging.getLogger("tessera.controllers")

JOBS = Resource("batch", "v1", "jobs")
EXPECTATION_SECONDS = 30.0
STEP = 16  # the largest slow-start batch of pods a Job's reconcile creates
COUNTS = ("active", "ready", "terminating")  # the status counts that move at each step


def _same_but_counts(a: Obj, b: Obj) -> bool:
    return {k: v for k, v in a.items() if k not in COUNTS} == {
        k: v for k, v in b.items() if k not in COUNTS
    }


def now() -> datetime:
    return datetime.now(UTC)


class Expectations:
    """What a controller wrote and its caches do not show yet, per owner uid."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[set[str], set[str], float]] = {}

    def expect(self, uid: str, *, created: Iterable[str] = (), deleted: Iterable[str] = ()) -> None:
        adds, dels, _ = self._pending.get(uid, (set(), set(), 0.0))
        self._pending[uid] = (
            adds | set(created),
            dels | set(deleted),
            time.monotonic() + EXPECTATION_SECONDS,
        )

    def satisfied(self, uid: str, names: set[str], gone: set[str]) -> bool:
        """Whether the cache (`names`: the pods it has; `gone`: those being deleted or
        finished) shows every write expected for `uid`."""
        entry = self._pending.get(uid)
        if entry is None:
            return True
        adds, dels, deadline = entry
        if (adds <= names and not (dels & (names - gone))) or time.monotonic() > deadline:
            del self._pending[uid]
            return True
        return False

    def forget(self, uid: str) -> None:
        self._pending.pop(uid, None)


class JobController(Controller):
    name = "job"
    resources: ClassVar[tuple[Resource, ...]] = (JOBS, PODS)
    workers = BURST_WORKERS

    def __init__(self) -> None:
        super().__init__()
        self.expectations = Expectations()
        self.slow_start = SlowStart(STEP)

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        if resource == JOBS:
            return (text_key(obj),)
        ref = controller_of(obj)
        if (
            ref is None
            or ref.get("kind") != "Job"
            or not str(ref.get("apiVersion", "")).startswith("batch/")
        ):
            return ()
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        return (f"{namespace}/{ref['name']}",)

    def _event(self, job: Obj, event_type: str, reason: str, message: str) -> None:
        self.event(job, event_type, reason, message, kind="Job", api_version="batch/v1")

    def _pods(self, job: Obj) -> list[Obj]:
        selector = selector_of((job.get("spec") or {}).get("selector"))
        owned = self.informers[PODS].owned_by(job["metadata"]["uid"])
        if selector is None:
            return []
        return [p for p in owned if selector.matches(p["metadata"].get("labels") or {})]

    async def reconcile(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        job = self.informers[JOBS].get(namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self.slow_start.done(key)
            return None  # its pods are the garbage collector's
        uid = job["metadata"]["uid"]
        pods = self._pods(job)
        names = {p["metadata"]["name"] for p in pods}
        gone = {
            p["metadata"]["name"]
            for p in pods
            if p["metadata"].get("deletionTimestamp")
            or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        }
        if not self.expectations.satisfied(uid, names, gone):
            return 1.0  # the pods' events will come; look again in any case
        decisions = sync_job(job, pods, now())
        deleted: list[str] = []
        try:
            for pod_name in decisions.delete:
                pod = next(p for p in pods if p["metadata"]["name"] == pod_name)
                await self.client.delete(PODS, namespace, pod_name, uid=pod["metadata"]["uid"])
                deleted.append(pod_name)
        finally:  # one event for the pods deleted, even when a delete failed after them
            if deleted:
                message = names_message("Deleted", "pod", deleted)
                self._event(job, "Normal", "SuccessfulDelete", message)
        # one slow-start step of the pods to make (at most `parallelism`), in one request
        size = self.slow_start.batch(key, len(decisions.create))
        results = await self.client.create_pods(namespace, decisions.create[:size]) if size else []
        made = [r for r in results if isinstance(r, dict)]
        for pod in made:
            self.informers[PODS].wrote(pod)  # the next step sees them at once
        created = [r["metadata"]["name"] for r in made]
        if created or deleted:
            self.expectations.expect(uid, created=created, deleted=deleted)
        if created:  # one event for the step, naming its pods
            message = names_message("Created", "pod", created)
            self._event(job, "Normal", "SuccessfulCreate", message)
        for result in results:
            if isinstance(result, BaseException):
                self.slow_start.done(key)
                raise result  # the key is tried again with backoff
        left = len(decisions.create) - size
        status = decisions.status
        if left:
            self.slow_start.made(key, size)
            self.queue.add_behind(key)  # the next step after the other objects'
            # the pods not made yet are not active; the counts are written once the steps
            # are made, anything else at once
            status = {**status, "active": int(status.get("active") or 0) - left}
        else:
            self.slow_start.done(key)
        current = job.get("status") or {}
        if status != current and not (left and _same_but_counts(status, current)):
            body = {**job, "status": status}
            updated = await self.client.update(JOBS, namespace, name, body, sub="status")
            self.informers[JOBS].wrote(updated)  # the next step's status is on this version
        for event_type, reason, message in decisions.events:
            self._event(job, event_type, reason, message)
        if decisions.delete_job:
            await self.client.delete(JOBS, namespace, name, uid=uid, propagation="Foreground")
            self.expectations.forget(uid)
            return None
        return decisions.requeue_after
