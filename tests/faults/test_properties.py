"""Random sequences of GPU faults, repairs, binds, scheduling cycles and the ends of grace
periods on a small pool, on a real database (SQLite and PostgreSQL): a pod never holds a
fragment of an Unhealthy GPU unless it already held it when the GPU failed (and then it has
been told), and every GPU's free capacity stays within [0, capacity] and equals its capacity
less what its pods hold."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.db.engine import Database
from app.db.models import GPUAllocation, GPUDevice, Pod
from app.errors import TesseraError
from app.faults import service as faults
from app.inventory.service import GPUShare
from app.pods import service as pods
from scheduler.loop import LoopConfig, SchedulingLoop
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create, gpu_node, in_pool, new_tenant

GPUS = 3
MODEL = {"tessera.io/gpu-model": "H100"}

gpu_index = st.integers(0, GPUS - 1)
operation = st.one_of(
    st.tuples(st.just("fault"), gpu_index, st.sampled_from([0, 30])),
    st.tuples(st.just("repair"), gpu_index),
    st.tuples(st.just("bind"), st.sampled_from(["slice", "whole"]), gpu_index, st.booleans()),
    st.tuples(st.just("create"), st.sampled_from(["slice", "whole"]), st.booleans()),
    st.just(("schedule",)),
    st.just(("end",)),
)


def document(pool: str, name: str, shape: str, reschedule: bool) -> dict[str, Any]:
    if shape == "slice":
        body = manifest(name, cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25, labels=MODEL)
    else:
        body = manifest(name, cpu="8", memory="64Gi", gpus=1, labels=dict(MODEL))
    if reschedule:
        body["metadata"]["annotations"] = {"tessera.io/reschedule-on-fault": "true"}
    return in_pool(pool, body)


def check(db: Database, node: str, told: dict[str, set[str]]) -> None:
    def read(session: Any) -> tuple[list[Any], list[Any], dict[str, Any]]:
        gpus = list(session.execute(select(GPUDevice).where(GPUDevice.node_name == node)).scalars())
        allocations = list(
            session.execute(
                select(GPUAllocation).where(GPUAllocation.gpu_name.in_([g.name for g in gpus]))
            ).scalars()
        )
        holders = {
            p.uid: p
            for p in session.scalars(
                select(Pod).where(Pod.uid.in_([a.pod_uid for a in allocations]))
            )
        }
        return gpus, allocations, holders

    gpus, allocations, holders = db.read(read)
    for gpu in gpus:
        mine = [a for a in allocations if a.gpu_name == gpu.name]
        assert 0 <= gpu.vram_free_mib <= gpu.vram_mib
        assert 0 <= gpu.core_free_pct <= 100
        assert gpu.vram_free_mib == gpu.vram_mib - sum(a.vram_mib for a in mine)
        assert gpu.core_free_pct == 100 - sum(a.core_pct for a in mine)
        if gpu.health == "Unhealthy":
            for allocation in mine:
                holder = holders[allocation.pod_uid]
                # It held the GPU when it failed, and it was told so.
                assert allocation.pod_uid in told[gpu.name], (gpu.name, holder.name)
                assert pods.fault_disrupted({"conditions": holder.conditions})
                assert holder.disruption_deadline is not None


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(operation, min_size=1, max_size=12))
def test_no_pod_is_placed_on_a_failed_gpu_and_capacity_stays_in_bounds(db, steps) -> None:
    pool = unique("flp-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=GPUS)
    names = [f"{node}-gpu{i}" for i in range(GPUS)]
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=pool))
    told: dict[str, set[str]] = {name: set() for name in names}
    counter = itertools.count()
    for step in steps:
        kind = step[0]
        if kind == "fault":
            _, index, grace = step
            gpu = names[index]

            def fault(session: Any, gpu: str = gpu, grace: int = grace) -> set[str]:
                holders = set(
                    session.scalars(
                        select(GPUAllocation.pod_uid).where(GPUAllocation.gpu_name == gpu)
                    )
                )
                faults.report_fault(session, name=gpu, kind="ecc", grace_seconds=grace)
                return holders

            told[gpu] |= db.write(fault)
        elif kind == "repair":
            db.write(lambda s, gpu=names[step[1]]: faults.repair(s, name=gpu))
            told[names[step[1]]] = set()
        elif kind == "create":
            _, shape, reschedule = step
            create(db, ns, document(pool, f"p{next(counter)}", shape, reschedule))
        elif kind == "bind":
            _, shape, index, reschedule = step
            name = f"p{next(counter)}"
            create(db, ns, document(pool, name, shape, reschedule))
            share = (
                GPUShare(names[index], 20480, 25)
                if shape == "slice"
                else GPUShare(names[index], 81920, 100)
            )
            with contextlib.suppress(TesseraError):  # unhealthy or full: refused
                db.write(
                    lambda s, name=name, share=share: pods.bind(
                        s, namespace=ns.name, name=name, node_name=node, gpus=[share]
                    )
                )
        elif kind == "schedule":
            scheduler.run_once(now=10**9 * next(counter))
        else:
            disrupted = db.read(
                lambda s: list(
                    s.scalars(
                        select(Pod.uid).where(
                            Pod.namespace == ns.name, Pod.disruption_deadline.is_not(None)
                        )
                    )
                )
            )
            for uid in disrupted:
                db.write(lambda s, uid=uid: pods.end_preempted(s, uid=uid))
        check(db, node, told)
