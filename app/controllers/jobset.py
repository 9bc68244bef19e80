"""The JobSet controller: applies `sync_jobset`'s decisions (app/controllers/jobset_sync.py)
through the API.

It watches JobSets, Jobs, pods, tessera.io PodGroups and Services; a Job's or a Service's event
concerns the JobSet that is its controller owner, a pod's or a PodGroup's the JobSet its
`jobset.sigs.k8s.io/jobset-name` label names. Each reconcile reads from the informers' caches
and writes, in this order: the JobSet's status (conditional on the version read, so a decision
taken on a stale read, such as a restart, is a 409 and taken again on fresh data), the pods and
Jobs of an earlier attempt deleted, the headless Service of the pods' subdomain made, the
PodGroup made or changed (before any Job whose pods it must count), the Jobs created (a name
taken is a 409: the Job is already there), suspended or resumed.

A JobSet being deleted is left alone: its Jobs (and through them their pods), its PodGroup and
its Service are the garbage collector's, deleted with it or orphaned as the deletion's
propagationPolicy says. A JobSet past its ttlSecondsAfterFinished is deleted with Foreground
propagation: it goes once its Jobs and their pods have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import ClassVar

from app.controllers.base import Controller, names_message
from app.controllers.client import PODS, ApiError, Obj, Resource
from app.controllers.endpoints import SERVICES
from app.controllers.informer import controller_of, text_key
from app.controllers.job import JOBS, now
from app.controllers.jobset_sync import sync_jobset
from app.registry.kinds.jobsets import (
    API_VERSION,
    GROUP,
    JOBSET_NAME,
    JOBSET_UID,
    VERSION,
    subdomain,
)

log = logging.getLogger("tessera.controllers")

JOBSETS = Resource(GROUP, VERSION, "jobsets")
PODGROUPS = Resource("tessera.io", "v1", "podgroups")


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


class JobSetController(Controller):
    name = "jobset"
    resources: ClassVar[tuple[Resource, ...]] = (JOBSETS, JOBS, PODS, PODGROUPS, SERVICES)
    workers = 2

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        if resource == JOBSETS:
            return (text_key(obj),)
        if resource in (JOBS, SERVICES):
            ref = controller_of(obj)
            if ref is None or ref.get("kind") != "JobSet":
                return ()
            return (f"{namespace}/{ref['name']}",)
        owner = _labels(obj).get(JOBSET_NAME)
        return (f"{namespace}/{owner}",) if owner else ()

    def _event(self, jobset: Obj, event_type: str, reason: str, message: str) -> None:
        self.event(jobset, event_type, reason, message, kind="JobSet", api_version=API_VERSION)

    async def reconcile(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        jobset = self.informers[JOBSETS].get(namespace, name)
        if jobset is None or jobset["metadata"].get("deletionTimestamp"):
            return None  # its Jobs, PodGroup and Service are the garbage collector's
        uid = jobset["metadata"]["uid"]
        jobs = self.informers[JOBS].owned_by(uid)
        pods = [
            p for p in self.informers[PODS].objects(namespace) if _labels(p).get(JOBSET_UID) == uid
        ]
        pod_group = self.informers[PODGROUPS].get(namespace, name)
        sub = subdomain(jobset)
        service = self.informers[SERVICES].get(namespace, sub) if sub else None
        decisions = sync_jobset(jobset, jobs, pods, pod_group, now(), service=service)

        if decisions.status != (jobset.get("status") or {}):
            body = {**jobset, "status": decisions.status}
            await self.client.update(JOBSETS, namespace, name, body, sub="status")
        for pod in decisions.delete_pods:
            await self._delete(PODS, pod)
        for job in decisions.delete:
            await self._delete(JOBS, job, propagation="Background")
        if decisions.service is not None:
            try:
                made = await self.client.create(SERVICES, namespace, decisions.service)
                self.informers[SERVICES].wrote(made)  # the cache has what it made at once
            except ApiError as exc:
                if exc.status != 409:
                    raise  # 409: made already (the cache lags), or another's: left as it is
        if decisions.pod_group_conflict:
            self._event(jobset, "Warning", "PodGroupConflict", decisions.pod_group_conflict)
            return 10.0
        if decisions.pod_group is not None:
            if decisions.create_pod_group:
                try:
                    made = await self.client.create(PODGROUPS, namespace, decisions.pod_group)
                    self.informers[PODGROUPS].wrote(made)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    return 0.5  # made already (the cache lags), or not ours: look again
            else:
                self.informers[PODGROUPS].wrote(
                    await self.client.update(PODGROUPS, namespace, name, decisions.pod_group)
                )
        created: list[str] = []
        try:
            for body in decisions.create:
                try:
                    self.informers[JOBS].wrote(await self.client.create(JOBS, namespace, body))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    continue  # already made (the cache lags)
                created.append(body["metadata"]["name"])
        finally:  # one event for the Jobs made, even when a create failed after them
            if created:
                message = names_message("Created", "job", created)
                self._event(jobset, "Normal", "SuccessfulCreate", message)
        for job, suspend in [(j, True) for j in decisions.suspend] + [
            (j, False) for j in decisions.resume
        ]:
            await self.client.patch(
                JOBS, namespace, job["metadata"]["name"], {"spec": {"suspend": suspend}}
            )
        for event_type, reason, message in decisions.events:
            self._event(jobset, event_type, reason, message)
        if decisions.delete_jobset:
            await self.client.delete(JOBSETS, namespace, name, uid=uid, propagation="Foreground")
            return None
        return decisions.requeue_after

    async def _delete(
        self, resource: Resource, obj: Obj, *, propagation: str | None = None
    ) -> None:
        meta = obj["metadata"]
        try:
            await self.client.delete(
                resource,
                meta.get("namespace"),
                meta["name"],
                uid=meta.get("uid"),
                propagation=propagation,
            )
        except ApiError as exc:
            if not exc.conflict:  # 409: another object of that name now
                raise
