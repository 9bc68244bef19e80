"""Weighted dominant-resource fair share (scheduler/fairshare.py), as the pure functions it is:
the order tenants' pods are taken in, the cut of a batch at what is free, and a batch solved
in that order."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.fairshare import (
    Resources,
    Unit,
    contended,
    demand_of,
    eligible_free,
    fair_order,
    fair_split,
    pool_capacity,
    pool_free,
    solve_in_turn,
)
from scheduler.requests import GangRequest, GpuSlice, PodRequest
from scheduler.snapshot import Gpu, Node, Snapshot
from scheduler.solver import solve

GPU = Resources(4000, 16384, 81920, 100)  # one pod of a whole GPU
POOL = Resources(96000 * 4, 1024 * 1024 * 4, 81920 * 32, 100 * 32)  # four nodes of 8 GPUs


def units(tenant: str, n: int, *, demand: Resources = GPU, start: int = 0, **kw: int) -> list[Unit]:
    return [
        Unit(f"{tenant}-{i}", tenant, kw.get("priority", 0), start + i, demand) for i in range(n)
    ]


def test_a_flooding_tenant_does_not_delay_another_tenants_single_pod() -> None:
    flood = units("a", 10_000)
    single = units("b", 1, start=20_000)  # created after the whole flood
    order = fair_order(flood + single, capacity=POOL)
    # both hold nothing: the older head goes first, then b, whose share is still 0
    assert [u.key for u in order[:2]] == ["a-0", "b-0"]
    # a already holds part of the pool: b's pod is the very first
    held = fair_order(flood + single, capacity=POOL, usage={"a": GPU}, limit=1)
    assert [u.key for u in held] == ["b-0"]


def test_tenants_take_turns_in_proportion_to_their_weights() -> None:
    order = fair_order(
        units("a", 300) + units("b", 300) + units("c", 300),
        capacity=POOL,
        weights={"a": 2, "c": 3},
    )
    first = Counter(u.tenant for u in order[:60])
    assert first == {"a": 20, "b": 10, "c": 30}


def test_the_dominant_resource_is_what_is_shared_fairly() -> None:
    """The example of the DRF paper (Ghodsi et al., NSDI 2011): 9 CPUs and 18 GB; user A's
    tasks need <1 CPU, 4 GB>, user B's <3 CPUs, 1 GB>. DRF gives A three tasks and B two,
    equalising A's memory share and B's CPU share at 2/3."""
    capacity = Resources(cpu_milli=9000, memory_mib=18 * 1024)
    a = units("a", 10, demand=Resources(1000, 4 * 1024))
    b = units("b", 10, demand=Resources(3000, 1024))
    order = fair_order(a + b, capacity=capacity)
    head, _ = fair_split(order, lambda u: u.demand, capacity)
    # A's fourth task does not fit the 2 GB left, nor B's third the 0 CPUs left
    assert Counter(u.tenant for u in head) == {"a": 3, "b": 2}


def test_inside_a_tenant_priority_then_age() -> None:
    mixed = [
        Unit("old-low", "a", 0, 1, GPU),
        Unit("new-high", "a", 10, 5, GPU),
        Unit("old-high", "a", 10, 2, GPU),
        Unit("b", "b", 0, 0, GPU),
    ]
    order = [u.key for u in fair_order(mixed, capacity=POOL)]
    assert [k for k in order if k != "b"] == ["old-high", "new-high", "old-low"]


def test_a_gang_counts_as_its_whole_size() -> None:
    """A gang of 8 GPUs taken for tenant a puts it 8 GPUs ahead: b's next 8 pods come first."""
    gang = Unit("gang", "a", 0, 0, Resources(8 * 4000, 8 * 16384, 8 * 81920, 800), pods=8)
    order = fair_order([gang, *units("a", 20, start=1), *units("b", 20, start=1)], capacity=POOL)
    assert order[0].key == "gang"
    assert [u.tenant for u in order[1:9]] == ["b"] * 8
    # and `limit` counts pods: the gang alone is 8 of them
    assert [u.key for u in fair_order([gang, *units("b", 20, start=1)], capacity=POOL, limit=9)][
        :2
    ] == ["gang", "b-0"]
    assert len(fair_order([gang, *units("b", 20, start=1)], capacity=POOL, limit=9)) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.integers(0, 3),
            st.integers(1, 8),
            st.integers(1, 64),
        ),
        max_size=60,
    ),
    st.dictionaries(st.sampled_from("abcd"), st.integers(1, 5)),
)
def test_the_order_is_every_unit_once_each_tenants_in_its_own_order(
    specs: list[tuple[str, int, int, int]], weights: dict[str, int]
) -> None:
    all_units = [
        Unit(f"u{i}", tenant, priority, i, Resources(cpu * 1000, memory * 1024))
        for i, (tenant, priority, cpu, memory) in enumerate(specs)
    ]
    order = fair_order(all_units, capacity=Resources(64000, 256 * 1024), weights=weights)
    assert sorted(u.key for u in order) == sorted(u.key for u in all_units)
    for tenant in set(u.tenant for u in all_units):
        mine = [u for u in order if u.tenant == tenant]
        assert mine == sorted(mine, key=lambda u: (-u.priority, u.created))


def test_a_cut_skips_what_does_not_fit_and_keeps_going() -> None:
    big, small = Resources(cpu_milli=8000), Resources(cpu_milli=1000)
    items = [("s1", small), ("big", big), ("s2", small)]
    head, tail = fair_split(items, lambda item: item[1], Resources(cpu_milli=4000))
    assert [k for k, _ in head] == ["s1", "s2"] and [k for k, _ in tail] == ["big"]


def node(name: str, gpus: int, *, pool: str = "p", cordoned: bool = False) -> Node:
    return Node(
        name=name,
        region="r",
        zone="z",
        rack="k",
        cpu_milli_allocatable=96000,
        cpu_milli_free=96000,
        memory_mib_allocatable=1 << 20,
        memory_mib_free=1 << 20,
        labels={"pool": pool},
        cordoned=cordoned,
    )


def gpus_of(node_name: str, n: int) -> list[Gpu]:
    return [
        Gpu(
            id=f"{node_name}-g{i}",
            node=node_name,
            index=i,
            model="H100",
            vram_mib=81920,
            sm_count=132,
            free_vram_mib=81920,
            free_sm_pct=100,
        )
        for i in range(n)
    ]


def pool(*nodes: tuple[str, int, str]) -> Snapshot:
    return Snapshot(
        nodes=tuple(node(name, n, pool=p) for name, n, p in nodes),
        gpus=tuple(g for name, n, _ in nodes for g in gpus_of(name, n)),
    )


def test_the_pool_and_what_is_free_to_a_batch_are_measured_in_the_four_resources() -> None:
    snapshot = pool(("n1", 4, "p"), ("n2", 8, "q"))
    assert pool_capacity(snapshot) == Resources(2 * 96000, 2 << 20, 12 * 81920, 1200)
    confined = PodRequest("x", cpu_milli=1000, memory_mib=1024, gpus=1, node_selector={"pool": "p"})
    assert eligible_free(snapshot, [confined]) == Resources(96000, 1 << 20, 4 * 81920, 400)
    sliced = PodRequest("s", cpu_milli=500, memory_mib=512, gpu_slice=GpuSlice(20480, 25))
    gang = GangRequest("g", (confined, sliced))
    assert demand_of(gang, 81920) == Resources(1500, 1536, 81920 + 20480, 125)


def test_a_batch_solved_in_turn_gives_what_is_free_to_its_head() -> None:
    """Four GPUs are free. The plain solve places the most demand (tenant a's 4-GPU pod); in
    fair-share order, b's 1-GPU pod at the head goes first, and a's, which no longer fits
    beside it, waits (its tenant is further above its fair share)."""
    snapshot = pool(("n1", 4, "p"))
    fair_first = PodRequest("b-one", cpu_milli=1000, memory_mib=1024, gpus=1)
    greedy_first = PodRequest("a-four", cpu_milli=4000, memory_mib=4096, gpus=4)
    plain = solve(snapshot, [fair_first, greedy_first])
    assert [p.key for p in plain.placements] == ["a-four"]
    plan, tail = solve_in_turn(snapshot, [fair_first, greedy_first])
    assert [p.key for p in plan.placements] == ["b-one"]
    assert [r.key for r in tail] == ["a-four"]
    assert [u.request.key for u in plan.unschedulable] == ["a-four"]


def test_the_tail_still_gets_what_the_head_cannot_use() -> None:
    """Work-conserving: a head pod that fits nowhere (its selector) leaves the pool to the
    tail, which is solved on what the head left."""
    snapshot = pool(("n1", 2, "p"), ("n2", 2, "q"))
    head = [
        PodRequest(f"b{i}", cpu_milli=1000, memory_mib=1024, gpus=1, node_selector={"pool": "p"})
        for i in range(2)
    ]
    tail = [PodRequest(f"a{i}", cpu_milli=1000, memory_mib=1024, gpus=1) for i in range(3)]
    plan, second = solve_in_turn(snapshot, head + tail)
    placed = {p.key for p in plan.placements}
    assert {"b0", "b1"} <= placed and len(placed) == 4
    assert second  # the batch was contended: 5 GPUs asked, 4 free


def test_a_flood_costs_the_order_only_its_first_batch() -> None:
    """`scheduler.loop.heads`: no cycle takes more than a batch of one tenant's pods, so only
    each tenant's first `limit` pending pods are ordered, with the rest of a gang among them."""
    from scheduler.loop import heads

    def row(uid: str, tenant: int, group: str | None = None) -> dict[str, object]:
        return {"uid": uid, "tenant_id": tenant, "namespace": f"ns{tenant}", "pod_group": group}

    rows = [row(f"a{i}", 1) for i in range(3)] + [row("g0", 1, "g"), row("b0", 2)]
    rows += [row(f"a{i}", 1) for i in range(3, 1000)] + [row("g1", 1, "g"), row("b1", 2)]
    assert [r["uid"] for r in heads(rows, 4)] == ["a0", "a1", "a2", "g0", "b0", "g1", "b1"]


def test_a_contended_batch_keeps_what_fits_and_a_bounded_tail() -> None:
    """A flood of ten thousand on a pool with room for three: the batch is the three that fit
    and `tail` pods more (a gang whole), with a nominated preemptor kept wherever it is; the
    rest waits untried. When everything fits, nothing is cut."""
    room = Resources(GPU.cpu_milli * 3, GPU.memory_mib * 3, GPU.vram_mib * 3, GPU.sm_pct * 3)
    flood = units("a", 10_000)
    gang = Unit("gang", "a", 0, -1, Resources(1, 1, GPU.vram_mib * 4, 400), pods=4)
    order = [flood[0], gang, *flood[1:]]
    kept = contended(order, room, 5, keep={"a-9000"})
    assert [u.key for u in kept] == ["a-0", "gang", "a-1", "a-2", "a-3", "a-9000"]
    # gang (4 pods, does not fit) + a-3 reach the tail of 5; a-9000 is kept as nominated
    small = units("b", 2)
    assert contended(small, room, 0) == small
    assert contended(order, Resources(), 0) == []


def test_what_is_free_in_the_pool_bounds_what_any_batch_is_given() -> None:
    snapshot = pool(("n1", 8, "x"), ("n2", 4, "y"))
    free = pool_free(snapshot)
    assert free == Resources(96000 * 2, 2 << 20, 81920 * 12, 100 * 12)
    request = PodRequest(key="p", gpus=1, node_selector={"pool": "y"})
    assert eligible_free(snapshot, [request]).fits_in(free)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["arrive", "gone", "update"]),
            st.integers(0, 30),  # which pod
            st.integers(0, 2),  # its priority
            st.integers(0, 5),  # its creation time
        ),
        max_size=60,
    ),
    st.integers(1, 6),
)
def test_the_mirror_keeps_the_waiting_order_as_pods_come_and_go(
    steps: list[tuple[str, int, int, int]], every: int
) -> None:
    """`Mirror.waiting` keeps its order from one cycle to the next and merges the pods that
    came since: whatever comes, goes and changes, it is the pending pods by priority (highest
    first), then age, then uid, as a sort of all of them gives."""
    from scheduler.loop import DEFAULT_SCHEDULER, Changes, Mirror

    def row(i: int, priority: int, created: int) -> dict[str, object]:
        return {
            "uid": f"u{i:02d}",
            "priority": priority,
            "created_at": created,
            "spec": {},
            "labels": {},
            "gpu_count": 0,
            "gpu_memory_mib": 0,
            "gpu_core_pct": 0,
            "cpu_milli": 1000,
            "memory_mib": 1024,
            "gpu_model": None,
        }

    mirror = Mirror()
    mirror.apply(Changes(0, True, [], [], [], [], [], []))
    for n, (kind, i, priority, created) in enumerate(steps):
        uid = f"u{i:02d}"
        if kind == "gone":
            mirror.apply(Changes(n + 1, False, [], [], [], [uid], [], []))
        else:
            old = mirror.pending.get(uid)
            if kind == "update" and old is not None:
                priority, created = int(old["priority"]), int(old["created_at"])
            mirror.apply(Changes(n + 1, False, [], [], [row(i, priority, created)], [], [], []))
        if n % every == 0:
            expected = sorted(
                mirror.pending.values(), key=lambda r: (-r["priority"], r["created_at"], r["uid"])
            )
            assert mirror.waiting(DEFAULT_SCHEDULER) == expected
    expected = sorted(
        mirror.pending.values(), key=lambda r: (-r["priority"], r["created_at"], r["uid"])
    )
    assert mirror.waiting(DEFAULT_SCHEDULER) == expected
