"""`pods.bind_many`, the scheduler's set-based bind, against `pods.bind` one pod at a time.

For random placements on a small pool (some over capacity, on the wrong node's GPUs, with the
wrong fragment, or of pods that are gone or already bound), binding them all at once must bind
exactly the groups that binding them one group after the other (each group in a savepoint,
undone whole when a member fails) binds, and leave the same nodes, GPUs, fragments and pods.
Both run in a transaction that is rolled back, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.engine import Database, flush_deferred
from app.db.models import GPUAllocation, GPUDevice, Node, table
from app.errors import TesseraError
from app.inventory import service as inventory
from app.inventory.service import GPUShare, NodeSpec, default_gpu_layout
from app.kube.meta import now
from app.pods import repository
from app.pods import service as pods
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create, in_pool, new_tenant

H100_MIB = 80 * 1024
SLICE = (20 * 1024, 25)

Group = list[tuple[str, str, list[GPUShare]]]


def small_node(db: Database, pool: str) -> str:
    """8 vCPU, 32 GiB and two GPUs: a few pods fill it, so plans go stale."""
    name = unique("bm-")
    spec = NodeSpec(
        name=name,
        cpu_milli=8000,
        memory_mib=32 * 1024,
        zone=unique("z"),
        compute_classes=("gpu", "general-purpose"),
        labels={"tessera.io/test-pool": pool},
        gpus=default_gpu_layout(name, 2, "H100"),
    )
    db.write(lambda s: inventory.create_node(s, spec))
    return name


def setup(db: Database) -> tuple[list[str], list[tuple[str, str, str]], str]:
    """Two small nodes and eight pending pods: (nodes, [(uid, name, kind)], namespace)."""
    pool = unique("bm-pool-")
    ns = new_tenant(db)
    nodes = [small_node(db, pool), small_node(db, pool)]
    docs = [
        ("cpu", manifest(unique("c-"), cpu="2", memory="4Gi")),
        ("cpu", manifest(unique("c-"), cpu="4", memory="8Gi")),
        ("cpu", manifest(unique("c-"), cpu="2", memory="16Gi")),
        ("slice", manifest(unique("s-"), cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)),
        ("slice", manifest(unique("s-"), cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)),
        ("slice", manifest(unique("s-"), cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)),
        ("whole", manifest(unique("w-"), cpu="2", memory="8Gi", gpus=1)),
        ("whole2", manifest(unique("w-"), cpu="2", memory="8Gi", gpus=2)),
    ]
    made = []
    for kind, doc in docs:
        obj = create(db, ns, in_pool(pool, doc))
        made.append((obj["metadata"]["uid"], obj["metadata"]["name"], kind))
    return nodes, made, ns.name


def state(session: Session, nodes: list[str], uids: list[str]) -> dict[str, Any]:
    flush_deferred(session)  # as the transaction will commit it
    nodes_t, gpus_t, allocations_t = table(Node), table(GPUDevice), table(GPUAllocation)
    free = session.execute(
        select(nodes_t.c.name, nodes_t.c.cpu_free_milli, nodes_t.c.memory_free_mib)
        .where(nodes_t.c.name.in_(nodes))
        .order_by(nodes_t.c.name)
    ).all()
    gpus = session.execute(
        select(gpus_t.c.name, gpus_t.c.vram_free_mib, gpus_t.c.core_free_pct)
        .where(gpus_t.c.node_name.in_(nodes))
        .order_by(gpus_t.c.name)
    ).all()
    fragments = session.execute(
        select(
            allocations_t.c.pod_uid,
            allocations_t.c.gpu_name,
            allocations_t.c.vram_mib,
            allocations_t.c.core_pct,
        )
        .where(allocations_t.c.pod_uid.in_(uids))
        .order_by(allocations_t.c.pod_uid, allocations_t.c.gpu_name)
    ).all()
    placed = session.execute(
        select(repository.pods.c.uid, repository.pods.c.node_name)
        .where(repository.pods.c.uid.in_(uids))
        .order_by(repository.pods.c.uid)
    ).all()
    return {
        "nodes": [tuple(r) for r in free],
        "gpus": [tuple(r) for r in gpus],
        "fragments": [tuple(r) for r in fragments],
        "pods": [tuple(r) for r in placed],
    }


@st.composite
def plans(draw: st.DrawFn, pool: tuple[list[str], list[tuple[str, str, str]]]) -> list[Group]:
    """Some of the pods (each at most once, plus sometimes one that does not exist), each on a
    random node with GPU fragments that are usually, not always, right, in groups of 1-3."""
    nodes, made = pool
    chosen = draw(st.permutations(made))[: draw(st.integers(1, len(made)))]
    members: list[tuple[str, str, list[GPUShare]]] = []
    for uid, _, kind in chosen:
        node = draw(st.sampled_from(nodes))
        home = draw(st.sampled_from(nodes)) if draw(st.integers(0, 9)) == 0 else node
        gpus = [f"{home}-gpu{i}" for i in range(2)]
        if kind == "slice":
            vram, core = SLICE if draw(st.integers(0, 9)) else (H100_MIB, 100)
            shares = [GPUShare(draw(st.sampled_from(gpus)), vram, core)]
        elif kind in ("whole", "whole2"):
            count = 1 if kind == "whole" else 2
            shares = [GPUShare(g, H100_MIB, 100) for g in gpus[:count]]
        else:
            shares = []
        members.append((uid, node, shares))
    if draw(st.booleans()):
        members.insert(draw(st.integers(0, len(members))), ("no-such-pod-uid", nodes[0], []))
    groups: list[Group] = []
    while members:
        size = draw(st.integers(1, 3))
        groups.append(members[:size])
        members = members[size:]
    return groups


def known_rows(db: Database, nodes: list[str], uids: list[str]) -> inventory.Known:
    """The rows of the pods, nodes and GPUs as a scheduler reads them before it binds."""
    pods_t, nodes_t, gpus_t = repository.pods, table(Node), table(GPUDevice)

    def read(session: Session) -> inventory.Known:
        gpus = list(session.execute(select(gpus_t).where(gpus_t.c.node_name.in_(nodes))).mappings())
        node_gpus: dict[str, set[str]] = {}
        for gpu in gpus:
            node_gpus.setdefault(gpu["node_name"], set()).add(gpu["name"])
        return inventory.Known(
            pods={
                r["uid"]: r
                for r in session.execute(select(pods_t).where(pods_t.c.uid.in_(uids))).mappings()
            },
            nodes={
                r["name"]: r
                for r in session.execute(
                    select(nodes_t).where(nodes_t.c.name.in_(nodes))
                ).mappings()
            },
            gpus={r["name"]: r for r in gpus},
            node_gpus=node_gpus,
        )

    return db.read(read)


def test_bind_many_binds_what_one_group_at_a_time_binds(db: Database) -> None:
    nodes, made, namespace = setup(db)
    names = {uid: name for uid, name, _ in made}
    uids = [uid for uid, _, _ in made]
    # Rows as a scheduler read them before one pod was bound: that pod's row and its node's
    # are stale (a bind given them must read them again); the others are current.
    stale = known_rows(db, nodes, uids)
    # One pod is bound before the plans are made: every plan that names it is stale.
    bound_uid = next(uid for uid, _, kind in made if kind == "cpu")
    db.write(
        lambda s: pods.bind(
            s, namespace=namespace, name=names[bound_uid], node_name=nodes[1], gpus=[]
        )
    )

    def one_by_one(groups: list[Group]) -> Any:
        def work(session: Session) -> tuple[list[bool], dict[str, Any]]:
            outcomes = []
            for group in groups:
                savepoint = session.begin_nested()
                try:
                    for uid, node, shares in group:
                        if uid not in names:
                            raise TesseraError("gone")
                        pods.bind(
                            session,
                            namespace=namespace,
                            name=names[uid],
                            node_name=node,
                            gpus=list(shares),
                        )
                except TesseraError:
                    savepoint.rollback()
                    outcomes.append(False)
                else:
                    savepoint.commit()
                    outcomes.append(True)
            return outcomes, state(session, nodes, uids)

        return db.dry_run(work)

    def at_once(groups: list[Group], known: inventory.Known | None = None) -> Any:
        def work(session: Session) -> tuple[list[bool], dict[str, Any]]:
            outcomes = pods.bind_many(session, groups, known=known)
            return [o is None for o in outcomes], state(session, nodes, uids)

        return db.dry_run(work)

    def planned(groups: list[Group], known: inventory.Known) -> Any:
        """Worked out from `known` before the transaction, as the scheduler does."""
        names = sorted({node for group in groups for _, node, _ in group})
        binds = pods.plan_binds(groups, known.pods, *known.targets(names), at=now())

        def work(session: Session) -> tuple[list[bool], dict[str, Any]]:
            outcomes = pods.bind_planned(session, groups, binds, known=known).outcomes
            return [o is None for o in outcomes], state(session, nodes, uids)

        return db.dry_run(work)

    before = db.read(lambda s: state(s, nodes, uids))
    current = known_rows(db, nodes, uids)

    @settings(
        max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(plans((nodes, made)))
    def check(groups: list[Group]) -> None:
        expected_outcomes, expected = one_by_one(groups)
        outcomes, got = at_once(groups)
        assert outcomes == expected_outcomes
        assert got == expected
        # with rows read before: the same, whether they are current or stale
        assert at_once(groups, known=current) == (expected_outcomes, expected)
        assert at_once(groups, known=stale) == (expected_outcomes, expected)
        # planned before the transaction: used when still current, planned again if not
        assert planned(groups, current) == (expected_outcomes, expected)
        assert planned(groups, stale) == (expected_outcomes, expected)
        # and the arithmetic holds: what a node has free is its capacity minus its pods
        for name, cpu_free, _ in got["nodes"]:
            held = sum(cpu_of[uid] for uid, node in got["pods"] if node == name)
            assert cpu_free == 8000 - held

    cpu_of = db.read(
        lambda s: {
            r.uid: r.cpu_milli
            for r in s.execute(
                select(repository.pods.c.uid, repository.pods.c.cpu_milli).where(
                    repository.pods.c.uid.in_(uids)
                )
            )
        }
    )
    check()
    assert db.read(lambda s: state(s, nodes, uids)) == before  # every run was rolled back
    # and a bind of every still-pending pod, where it fits, binds some of them for real
    pending = [(uid, nodes[0], []) for uid, _, kind in made if kind == "cpu" and uid != bound_uid]
    outcomes = db.write(lambda s: pods.bind_many(s, [[m] for m in pending]))
    assert outcomes == [None] * len(pending)
    after = db.read(lambda s: state(s, nodes, uids))
    assert {uid for uid, node in after["pods"] if node == nodes[0]} == {u for u, _, _ in pending}
