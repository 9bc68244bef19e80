"""Capacity is guarded by the database: CHECK constraints, and concurrent binds that race."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from app.auth import service as auth
from app.db.engine import Database
from app.errors import Conflict
from app.inventory import service as inventory
from app.inventory.service import GPUShare, NodeSpec, default_gpu_layout
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.pods.admission import admit
from app.pods.schemas import Pod
from tests.conftest import unique
from tests.factories import pod as pod_manifest


def make_node(db: Database, *, gpus: int = 1, cpu: int = 64000, memory: int = 262144) -> str:
    name = unique("cap-")
    db.write(
        lambda s: inventory.create_node(
            s,
            NodeSpec(
                name=name,
                cpu_milli=cpu,
                memory_mib=memory,
                gpus=default_gpu_layout(name, gpus, "H100"),
            ),
        )
    )
    return name


def make_pods(db: Database, count: int, **resources: object) -> tuple[str, list[str]]:
    tenant = unique("cap")
    db.write(lambda s: auth.create_tenant(s, name=tenant))
    tenant_id = db.read(lambda s: auth.get_tenant(s, tenant).id)
    names = []
    for i in range(count):
        manifest = Pod.model_validate(pod_manifest(f"p{i}", **resources))  # type: ignore[arg-type]

        def work(s, manifest=manifest):
            from app.deps import Services
            from app.settings import Settings

            context = Services.build(Settings(), db=db).admission(s)
            admitted = admit(
                manifest, specs=context.specs, pool=context.pool, default_spec=context.default_spec
            )
            return pods.create(
                s,
                namespace=NamespaceInfo(tenant, tenant_id, False),
                pod=manifest,
                admitted=admitted,
            )

        names.append(db.write(work)["metadata"]["name"])
    return tenant, names


def test_check_constraints_refuse_negative_free_capacity(db: Database) -> None:
    node = make_node(db)
    statements = [
        "UPDATE nodes SET cpu_free_milli = -1 WHERE name = :n",
        "UPDATE nodes SET memory_free_mib = memory_allocatable_mib + 1 WHERE name = :n",
        "UPDATE gpu_devices SET vram_free_mib = -1 WHERE node_name = :n",
        "UPDATE gpu_devices SET core_free_pct = 101 WHERE node_name = :n",
    ]
    for statement in statements:
        with pytest.raises(IntegrityError):
            db.write(lambda s, statement=statement: s.execute(text(statement), {"n": node}))
    assert (
        db.read(
            lambda s: s.execute(
                text("SELECT cpu_free_milli FROM nodes WHERE name = :n"), {"n": node}
            ).scalar_one()
        )
        == 64000
    )


def test_concurrent_binds_never_over_allocate_a_gpu(db: Database) -> None:
    """Eight pods each want 30 % of the same GPU's SMs; at most three can have it."""
    node = make_node(db)
    gpu = f"{node}-gpu0"
    namespace, names = make_pods(db, 8, cpu="1", memory="2Gi", gpu_memory="10Gi", gpu_core=30)
    results: Counter[str] = Counter()
    barrier = threading.Barrier(len(names))

    def bind(name: str) -> None:
        barrier.wait()
        try:
            db.write(
                lambda s: pods.bind(
                    s,
                    namespace=namespace,
                    name=name,
                    node_name=node,
                    gpus=[GPUShare(gpu, 10240, 30)],
                )
            )
            results["bound"] += 1
        except Conflict:
            results["conflict"] += 1

    threads = [threading.Thread(target=bind, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"bound": 3, "conflict": 5}
    free = db.read(
        lambda s: s.execute(
            text("SELECT core_free_pct, vram_free_mib FROM gpu_devices WHERE name = :g"), {"g": gpu}
        ).one()
    )
    assert tuple(free) == (10, 81920 - 3 * 10240)
    held = db.read(
        lambda s: s.execute(
            text("SELECT count(*) FROM gpu_allocations WHERE gpu_name = :g"), {"g": gpu}
        ).scalar_one()
    )
    assert held == 3


def test_concurrent_binds_never_over_allocate_a_node_cpu(db: Database) -> None:
    node = make_node(db, gpus=0, cpu=8000, memory=65536)
    namespace, names = make_pods(db, 6, cpu="3", memory="6Gi")
    outcomes: list[str] = []
    barrier = threading.Barrier(len(names))

    def bind(name: str) -> None:
        barrier.wait()
        try:
            db.write(
                lambda s: pods.bind(s, namespace=namespace, name=name, node_name=node, gpus=[])
            )
            outcomes.append("bound")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=bind, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("bound") == 2
    assert (
        db.read(
            lambda s: s.execute(
                text("SELECT cpu_free_milli FROM nodes WHERE name = :n"), {"n": node}
            ).scalar_one()
        )
        == 2000
    )


def test_a_failed_bind_leaves_nothing_behind(db: Database) -> None:
    node = make_node(db, gpus=2)
    namespace, (name,) = make_pods(db, 1, gpus=2)
    before = db.read(
        lambda s: s.execute(
            text(
                "SELECT resource_version, vram_free_mib FROM gpu_devices WHERE node_name = :n ORDER BY name"
            ),
            {"n": node},
        ).all()
    )
    # The second GPU is already taken behind the scheduler's back: the bind must fail whole.
    db.write(
        lambda s: s.execute(
            text("UPDATE gpu_devices SET core_free_pct = 50 WHERE name = :g"), {"g": f"{node}-gpu1"}
        )
    )
    with pytest.raises(Conflict):
        db.write(
            lambda s: pods.bind(
                s,
                namespace=namespace,
                name=name,
                node_name=node,
                gpus=[GPUShare(f"{node}-gpu0", 81920, 100), GPUShare(f"{node}-gpu1", 81920, 100)],
            )
        )
    after = db.read(
        lambda s: s.execute(
            text(
                "SELECT resource_version, vram_free_mib FROM gpu_devices WHERE node_name = :n ORDER BY name"
            ),
            {"n": node},
        ).all()
    )
    assert after == before
    row = db.read(
        lambda s: s.execute(
            text("SELECT node_name FROM pods WHERE namespace = :ns AND name = :n"),
            {"ns": namespace, "n": name},
        ).scalar_one()
    )
    assert row is None
