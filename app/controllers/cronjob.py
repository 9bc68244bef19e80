"""The CronJob controller: applies `sync_cronjob`'s decisions (app/controllers/cronjob_sync.py)
through the API.

It watches CronJobs and Jobs; a Job's event concerns the CronJob that is its controller owner.
Each reconcile creates the Job a schedule time calls for (named for that time, so a time runs
once even if a write was lost: the API answers 409 for a second create), deletes what
`concurrencyPolicy: Replace` and the history limits say (Background propagation: the Job
controller then deletes their pods), writes the status (conditional on the version read), and
looks again at the next schedule time. A CronJob being deleted is left alone: its Jobs are the
garbage collector's (deleted with it, or orphaned, as the deletion's propagationPolicy says).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from app.controllers.base import Controller
from app.controllers.client import ApiError, Obj, Resource
from app.controllers.cronjob_sync import sync_cronjob
from app.controllers.informer import controller_of, text_key
from app.controllers.job import JOBS, now

CRONJOBS = Resource("batch", "v1", "cronjobs")
LATE = 0.1  # seconds after a schedule time the controller looks: the time has passed


class CronJobController(Controller):
    name = "cronjob"
    resources: ClassVar[tuple[Resource, ...]] = (CRONJOBS, JOBS)
    workers = 1

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        if resource == CRONJOBS:
            return (text_key(obj),)
        ref = controller_of(obj)
        if ref is None or ref.get("kind") != "CronJob":
            return ()
        return (f"{(obj.get('metadata') or {}).get('namespace') or ''}/{ref['name']}",)

    async def reconcile(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        cronjob = self.informers[CRONJOBS].get(namespace, name)
        if cronjob is None or cronjob["metadata"].get("deletionTimestamp"):
            return None  # its Jobs are the garbage collector's
        jobs = self.informers[JOBS].owned_by(cronjob["metadata"]["uid"])
        decisions = sync_cronjob(cronjob, jobs, now())
        by_name = {j["metadata"]["name"]: j for j in jobs}
        for job_name in decisions.delete:
            await self._delete(namespace, by_name[job_name])
        status = decisions.status
        if decisions.create is not None:
            try:
                made = await self.client.create(JOBS, namespace, decisions.create)
                self.informers[JOBS].wrote(made)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                made = await self.client.get(JOBS, namespace, decisions.create["metadata"]["name"])
            for ref in status.get("active") or []:
                if ref.get("name") == made["metadata"]["name"]:
                    ref["uid"] = made["metadata"]["uid"]
                    ref["resourceVersion"] = made["metadata"]["resourceVersion"]
        if status != (cronjob.get("status") or {}):
            await self.client.update(
                CRONJOBS, namespace, name, {**cronjob, "status": status}, sub="status"
            )
        for event_type, reason, message in decisions.events:
            self.event(cronjob, event_type, reason, message, kind="CronJob", api_version="batch/v1")
        if decisions.requeue_after is None:
            return None
        return decisions.requeue_after + LATE

    async def _delete(self, namespace: str, job: Obj) -> None:
        try:
            await self.client.delete(
                JOBS,
                namespace,
                job["metadata"]["name"],
                uid=job["metadata"]["uid"],
                propagation="Background",
            )
        except ApiError as exc:
            if not exc.conflict:
                raise
