"""A pod's generateName over real HTTP, on both databases: the name is made before the write
without a look at the store, so a name already taken (by a pod made earlier, or by another
create of the same transaction) is made again, up to Kubernetes' eight tries, and only then
refused, with nothing written. The names made are forced here to collide."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.pods import service
from tests.api.test_pod_batches import BATCHES, batch
from tests.conftest import Api, unique
from tests.factories import pod


def generated(prefix: str) -> dict[str, Any]:
    manifest = pod("ignored")
    manifest["metadata"] = {"generateName": prefix}
    return manifest


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], list[str]]:
    """Make the server's generated names these suffixes, in turn, then fresh ones; the names
    it made are returned as they are asked for."""
    made: list[str] = []

    def use(suffixes: list[str]) -> list[str]:
        fresh: Iterator[str] = (f"n{i:04d}" for i in itertools.count())
        queued = itertools.chain(suffixes, fresh)

        def name(prefix: str) -> str:
            made.append(prefix + next(queued))
            return made[-1]

        monkeypatch.setattr(service, "_generated_name", name)
        return made

    return use


def pods_of(api: Api, ns: str) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in api.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    )


def test_a_generated_name_already_taken_is_made_again(tenant: Api, names) -> None:
    ns = tenant.tenant
    made = names(["same", "same", "same"])
    first = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=generated("web-"))
    assert first.status_code == 201, first.text
    assert first.json()["metadata"]["name"] == "web-same"
    # taken twice, then free: the create succeeds with the third name made for it
    second = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=generated("web-"))
    assert second.status_code == 201, second.text
    assert second.json()["metadata"]["name"] == "web-n0000"
    assert made == ["web-same", "web-same", "web-same", "web-n0000"]
    assert pods_of(tenant, ns) == ["web-n0000", "web-same"]


def test_two_creates_of_one_batch_given_one_name_both_succeed(tenant: Api, names) -> None:
    ns = tenant.tenant
    names(["twin", "twin"])
    answer = tenant.post(BATCHES.format(ns=ns), json=batch(generated("job-"), generated("job-")))
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert [i["kind"] for i in items] == ["Pod", "Pod"], items
    assert sorted(i["metadata"]["name"] for i in items) == ["job-n0000", "job-twin"]
    assert pods_of(tenant, ns) == ["job-n0000", "job-twin"]


def test_a_generate_name_with_every_try_taken_is_refused_and_writes_nothing(
    tenant: Api, names
) -> None:
    ns = tenant.tenant
    names(["only"] * 9)
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=generated("x-")).status_code == 201
    refused = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=generated("x-"))
    assert refused.status_code == 409, refused.text
    assert refused.json()["message"] == (
        'could not find a free name for generateName "x-" in 8 tries: try again'
    )
    assert pods_of(tenant, ns) == ["x-only"]
    # a dry run tries its names the same way and writes nothing
    names(["only", unique("free")])
    dry = tenant.post(f"/api/v1/namespaces/{ns}/pods?dryRun=All", json=generated("x-"))
    assert dry.status_code == 201, dry.text
    assert dry.json()["metadata"]["name"].startswith("x-free")
    assert pods_of(tenant, ns) == ["x-only"]
