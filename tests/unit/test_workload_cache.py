"""The API's cache of pods' workloads (app/workloads.Cache): bounded per tenant, so that one
tenant's many owners never push out another's, and forgotten after its time to live."""

from __future__ import annotations

from app.workloads import Cache


def key(i: int) -> tuple[str, str, str, str, str]:
    return ("ns", "apps/v1", "ReplicaSet", f"rs-{i}", f"uid-{i}")


def test_a_tenant_fills_only_its_own_share() -> None:
    cache = Cache(per_tenant=3, ttl=60)
    cache.put(1, key(0), "Deployment/kept")
    for i in range(1, 100):  # tenant 2 makes many owners
        cache.put(2, key(i), f"Deployment/d{i}")
    assert cache.get(1, key(0)) == (True, "Deployment/kept")
    assert len(cache) == 1 + 3
    assert cache.get(2, key(99)) == (True, "Deployment/d99")
    assert cache.get(2, key(1)) == (False, None)  # its oldest went first
    assert cache.get(1, key(99)) == (False, None)  # another tenant's entry is not its own


def test_an_entry_is_forgotten_after_its_time_to_live() -> None:
    now = [0.0]
    cache = Cache(per_tenant=8, ttl=30, clock=lambda: now[0])
    cache.put(1, key(1), "Job/etl")
    assert cache.get(1, key(1)) == (True, "Job/etl")
    now[0] = 29.9
    assert cache.get(1, key(1)) == (True, "Job/etl")
    now[0] = 30.0
    assert cache.get(1, key(1)) == (False, None)
    assert len(cache) == 0  # the tenant's empty share is gone too
