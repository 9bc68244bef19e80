"""The controller manager (`tessera controllers`): Tessera's kube-controller-manager.

A separate process (or a task of `tessera dev`) that speaks only the public API, with a token
of the `controller` role, and runs the controllers of the workload kinds. Only one manager
acts at a time: the holder of the Lease `kube-system/tessera-controllers`.

    client.py    list / watch / get / create / update / patch / delete of any resource
    informer.py  a shared informer per resource: list, watch, a cache, handlers
    queue.py     a work queue: one entry per key, delayed requeue with backoff, bounded
    base.py      `Controller`: the resources it watches, `key_of`, `reconcile`
    gc.py        the garbage collector: what deleting an owner does to its dependents
    endpoints.py each Service's EndpointSlice, from the pods it selects
    manager.py   the informers and the workers of each controller, under leader election
    apps.py      the ReplicaSet and Deployment controllers
    job.py, cronjob.py              the Job and CronJob controllers, applying the pure
    job_sync.py, cronjob_sync.py    decisions of these (no I/O, no clock)
    jobset.py, jobset_sync.py       the JobSet controller (one gang per JobSet) and its decisions
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.controllers.base import Controller
from app.controllers.client import PODS, Client, Resource
from app.controllers.cronjob import CronJobController
from app.controllers.endpoints import EndpointController
from app.controllers.gc import GarbageCollector
from app.controllers.job import JobController
from app.controllers.jobset import PODGROUPS, JobSetController
from app.controllers.manager import Election, Manager


def controllers() -> list[Controller]:
    """A fresh instance of every controller the manager runs."""
    from app.controllers.apps import DeploymentController, ReplicaSetController

    return [
        garbage_collector(),
        EndpointController(),
        ReplicaSetController(),
        DeploymentController(),
        JobController(),
        CronJobController(),
        JobSetController(),
    ]


def garbage_collector() -> GarbageCollector:
    """The collector of every registry kind whose objects own others, and of what controllers
    make: pods, the workload kinds and PodGroups (a JobSet's gang)."""
    from app.registry.kinds import KINDS

    def resource(k: Any) -> Resource:
        return Resource(k.group, k.version, k.resource, k.namespaced)

    owners = {resource(k): k.kind for k in KINDS if k.has_dependents}
    return GarbageCollector(owners, [PODS, PODGROUPS, *(resource(k) for k in KINDS if k.workload)])


def election_for(lease_seconds: int) -> Election:
    """Kubernetes' proportions (15 s lease, 10 s renew deadline, 2 s retry)."""
    return Election(
        lease_seconds=lease_seconds,
        renew_deadline=lease_seconds * 2 / 3,
        retry=lease_seconds * 2 / 15,
    )


async def run(kubeconfig: Path, *, lease_seconds: int = 15, identity: str | None = None) -> None:
    """Run the manager with the credentials of `kubeconfig` until cancelled."""
    client = Client.from_kubeconfig(kubeconfig)
    election_client = Client.from_kubeconfig(kubeconfig)
    manager = Manager(
        client,
        controllers(),
        identity=identity,
        election=election_for(lease_seconds),
        election_client=election_client,
    )
    try:
        await _server_answers(client)
        await manager.run()
    finally:
        await client.close()
        await election_client.close()


async def _server_answers(client: Client, pause: float = 0.1) -> None:
    """Wait until the API answers (started beside it, as in `tessera dev`, the manager would
    otherwise fail its first elections while the server is not yet listening)."""
    import asyncio

    import httpx

    while True:
        try:
            await client.get_raw("/readyz")
            return
        except httpx.HTTPError:
            await asyncio.sleep(pause)
