"""A pod's workload (app/workloads.py) on both databases: the top of its chain of controllers,
found through the objects the registry keeps in the pod's namespace; kept on the pod when it
is created and again when its ownerReferences change (adopted, orphaned)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from app.db.engine import Database
from app.db.models import Pod, StoredObject, table
from app.deps import Services
from app.kube.meta import now
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.settings import Settings
from app.workloads import MAX_DEPTH, top
from tests.factories import pod as pod_manifest
from tests.scheduler.test_loop import create, new_tenant

objects_t = table(StoredObject)

GROUPS = {"Deployment": "apps", "ReplicaSet": "apps", "Job": "batch", "CronJob": "batch"}
RESOURCES = {
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "Job": "jobs",
    "CronJob": "cronjobs",
    "JobSet": "jobsets",
}


def ref(obj: dict[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["name"],
        "uid": obj["uid"],
        "controller": controller,
    }


def stored(
    db: Database, ns: str, kind: str, name: str, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An object as the registry keeps it (a row of `objects`), owned by `owner`'s controller."""
    group = GROUPS.get(kind, "jobset.x-k8s.io")
    obj = {
        "apiVersion": f"{group}/v1" if kind != "JobSet" else f"{group}/v1alpha2",
        "kind": kind,
        "name": name,
        "uid": str(uuid.uuid4()),
    }
    body: dict[str, Any] = {"spec": {}}
    if owner is not None:
        body["metadata"] = {"ownerReferences": [ref(owner)]}
    row = {
        "uid": obj["uid"],
        "api_group": group,
        "resource": RESOURCES[kind],
        "namespace": ns,
        "name": name,
        "tenant_id": None,
        "resource_version": 1,
        "created_at": now(),
        "labels": {},
        "body": body,
    }
    db.write(lambda s: s.execute(objects_t.insert().values(**row)))
    return obj


def workload(db: Database, ns: str, refs: list[dict[str, Any]] | None) -> str | None:
    return db.read(lambda s: top(s, ns, refs))


def test_the_top_of_each_chain(db: Database) -> None:
    ns = new_tenant(db).name
    web = stored(db, ns, "Deployment", "web")
    web_rs = stored(db, ns, "ReplicaSet", "web-5d9f", web)
    nightly = stored(db, ns, "CronJob", "nightly")
    nightly_job = stored(db, ns, "Job", "nightly-2915", nightly)
    train = stored(db, ns, "JobSet", "train")
    train_job = stored(db, ns, "Job", "train-workers-0", train)
    plain = stored(db, ns, "Job", "etl")

    assert workload(db, ns, [ref(web_rs)]) == "Deployment/web"
    assert workload(db, ns, [ref(nightly_job)]) == "CronJob/nightly"
    assert workload(db, ns, [ref(train_job)]) == "JobSet/train"
    assert workload(db, ns, [ref(plain)]) == "Job/etl"
    # the controller among other owners; owners that are not its controller do not count
    assert workload(db, ns, [ref(web, controller=False), ref(plain)]) == "Job/etl"
    assert workload(db, ns, [ref(web, controller=False)]) is None
    assert workload(db, ns, None) is None and workload(db, ns, []) is None


def test_owners_gone_or_not_kept_end_the_chain_at_the_reference(db: Database) -> None:
    ns = new_tenant(db).name
    # the Job's CronJob was deleted: the Job still names it
    gone = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "old", "uid": "gone"}
    orphan_job = stored(db, ns, "Job", "old-1", gone)
    assert workload(db, ns, [ref(orphan_job)]) == "CronJob/old"
    # an owner of the same name but another uid (deleted and made again) is not followed
    web = stored(db, ns, "Deployment", "web")
    rs = stored(db, ns, "ReplicaSet", "web-1", web)
    again = {**rs, "uid": str(uuid.uuid4())}
    assert workload(db, ns, [ref(again)]) == "ReplicaSet/web-1"
    # a kind Tessera does not keep is the top itself
    notebook = {"apiVersion": "example.com/v1", "kind": "Notebook", "name": "nb", "uid": "n"}
    assert workload(db, ns, [ref(notebook)]) == "Notebook/nb"


def test_another_namespaces_objects_are_never_read(db: Database) -> None:
    """A pod naming an owner of another namespace (its uid and name) learns nothing of it."""
    mine, theirs = new_tenant(db).name, new_tenant(db).name
    secret_parent = stored(db, theirs, "CronJob", "their-secret-name")
    their_job = stored(db, theirs, "Job", "batch", secret_parent)
    assert workload(db, theirs, [ref(their_job)]) == "CronJob/their-secret-name"
    assert workload(db, mine, [ref(their_job)]) == "Job/batch"


def test_a_cycle_of_owners_ends(db: Database) -> None:
    ns = new_tenant(db).name
    a = {"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": str(uuid.uuid4())}
    b = stored(db, ns, "Job", "b", a)
    stored_a = {
        "uid": a["uid"],
        "api_group": "batch",
        "resource": "jobs",
        "namespace": ns,
        "name": "a",
        "tenant_id": None,
        "resource_version": 1,
        "created_at": now(),
        "labels": {},
        "body": {"metadata": {"ownerReferences": [ref(b)]}},
    }
    db.write(lambda s: s.execute(objects_t.insert().values(**stored_a)))
    assert workload(db, ns, [ref(b)]) in ("Job/a", "Job/b")  # after MAX_DEPTH reads
    assert MAX_DEPTH >= 3  # Pod -> Job -> CronJob, and an operator's kind above it


def pod_workload(db: Database, ns: NamespaceInfo, name: str) -> str | None:
    return db.read(
        lambda s: s.scalar(select(Pod.workload).where(Pod.namespace == ns.name, Pod.name == name))
    )


def test_a_pod_keeps_its_workload_and_follows_adoption(db: Database) -> None:
    ns = new_tenant(db)
    web = stored(db, ns.name, "Deployment", "web")
    rs = stored(db, ns.name, "ReplicaSet", "web-7c", web)
    owned = pod_manifest("owned")
    owned["metadata"]["ownerReferences"] = [ref(rs)]
    create(db, ns, owned)
    create(db, ns, pod_manifest("bare"))
    assert pod_workload(db, ns, "owned") == "Deployment/web"
    assert pod_workload(db, ns, "bare") is None

    def patch(name: str, refs: list[dict[str, Any]] | None) -> None:
        def work(s: Any) -> None:
            context = Services.build(Settings(), db=db).admission(s)
            body = {"metadata": {"ownerReferences": refs}}
            pods.patch(
                s,
                namespace=ns.name,
                name=name,
                body=body,
                patch_type="application/merge-patch+json",
                context=context,
            )

        db.write(work)

    patch("bare", [ref(rs)])  # adopted by the ReplicaSet
    assert pod_workload(db, ns, "bare") == "Deployment/web"
    patch("owned", None)  # orphaned
    assert pod_workload(db, ns, "owned") is None
