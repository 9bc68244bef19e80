"""Fixtures of the billing tests: the pod service's clock, moved by the test, and pods bound
on a node of the test's own."""

from __future__ import annotations

import pytest

from app.db.engine import Database
from app.inventory import service as inventory
from app.pods import service as pods
from tests.billing.helpers import Clock
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import POOL_LABEL, create, in_pool, new_tenant


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(pods, "now", moved)
    return moved


@pytest.fixture
def place(db: Database):
    pool = unique("obs-")
    ns = new_tenant(db)
    node = unique("obsn-")
    spec = inventory.NodeSpec(
        name=node,
        cpu_milli=1_000_000,
        memory_mib=4 * 1024 * 1024,
        compute_classes=("general-purpose",),
        labels={POOL_LABEL: pool},
    )
    db.write(lambda s: inventory.create_node(s, spec))

    def make() -> tuple[str, str]:
        name = unique("p-")
        create(db, ns, in_pool(pool, manifest(name, cpu="1", memory="1Gi")))
        db.write(lambda s: pods.bind(s, namespace=ns.name, name=name, node_name=node, gpus=[]))
        return ns.name, name

    return make
