"""Pod admission: demand, rounding, GPU asks and the fields a serverless pool refuses."""

from __future__ import annotations

from typing import Any

import pytest

from app.pods.admission import AdmissionError, GPUModelInfo, PoolCatalog, admit
from app.pods.schemas import Pod
from billing.specs import ComputeSpec, load_catalog
from tests.factories import pod

POOL = PoolCatalog(
    {"H200": GPUModelInfo("H200", 144384, 132, 8), "T4": GPUModelInfo("T4", 16384, 40, 4)}
)


def run(manifest: dict[str, Any]):
    return admit(
        Pod.model_validate(manifest),
        specs=load_catalog(),
        pool=POOL,
        default_spec=ComputeSpec.parse("2-4Gi"),
    )


def fields_of(manifest: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(AdmissionError) as info:
        run(manifest)
    return {c.field: c.message for c in info.value.causes}


def test_demand_is_the_larger_of_summed_requests_and_limits() -> None:
    manifest = pod("p")
    manifest["spec"]["containers"] = [
        {
            "name": "a",
            "image": "x",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1.5"}},
        },
        {"name": "b", "image": "x", "resources": {"limits": {"cpu": "1", "memory": "3Gi"}}},
    ]
    manifest["spec"]["initContainers"] = [
        {"name": "init", "image": "x", "resources": {"requests": {"cpu": "3"}}}
    ]
    demand = run(manifest).demand
    # requests: cpu 1 + 1 (defaulted from the limit) = 2; limits: 1.5 + 1 = 2.5; init needs 3.
    assert (demand.requested_cpu_milli, demand.requested_memory_mib) == (3000, 4096)
    assert demand.spec.name == "3-4Gi"


def test_slice_is_class_gpu_and_a_missing_dimension_follows_the_model() -> None:
    admitted = run(pod("s", gpu_memory="36Gi", labels={"tessera.io/gpu-model": "H200"}))
    assert (
        admitted.demand.compute_class == "gpu"
        and admitted.annotations["tessera.io/compute-class"] == "gpu"
        and "tessera.io/compute-class" not in admitted.labels
    )
    assert (admitted.demand.gpu_memory_mib, admitted.demand.gpu_core_pct) == (36864, 26)
    assert (
        run(pod("c", gpu_core=50, labels={"tessera.io/gpu-model": "T4"})).demand.gpu_memory_mib
        == 8192
    )
    causes = fields_of(pod("s", gpu_memory="20Gi"))
    assert "tessera.io/gpu-core" in next(iter(causes)) and "tessera.io/gpu-model" in next(
        iter(causes.values())
    )


def test_gpu_asks_that_cannot_fit() -> None:
    big = fields_of(pod("s", gpu_memory="18Gi", gpu_core=10, labels={"tessera.io/gpu-model": "T4"}))
    assert "spec.containers[*].resources.limits[tessera.io/gpu-memory]" in big
    assert "a T4 has 16Gi" in next(iter(big.values()))
    too_many = fields_of(pod("w", gpus=16))
    assert "at most 8" in next(iter(too_many.values()))
    core = fields_of(pod("c", gpu_memory="1Gi", gpu_core=101))
    assert "1 to 100" in next(iter(core.values()))
    both = fields_of(pod("b", gpus=1, gpu_memory="1Gi", gpu_core=5))
    assert "not both" in next(iter(both.values()))
    unknown = fields_of(pod("u", gpus=1, labels={"tessera.io/gpu-model": "B300"}))
    assert '"H200", "T4"' in unknown["metadata.labels.tessera.io/gpu-model"]


def test_class_labels() -> None:
    conflicting = fields_of(pod("g", gpus=1, labels={"tessera.io/compute-class": "performance"}))
    assert 'class "gpu"' in conflicting["metadata.labels.tessera.io/compute-class"]
    assert (
        'class "gpu" is for pods'
        in fields_of(pod("g", labels={"tessera.io/compute-class": "gpu"}))[
            "metadata.labels.tessera.io/compute-class"
        ]
    )
    assert (
        run(pod("p", labels={"tessera.io/compute-class": "performance"})).demand.compute_class
        == "performance"
    )
    assert (
        run(pod("b", labels={"tessera.io/compute-qos": "best-effort"})).demand.qos == "best-effort"
    )


def test_serverless_refuses_host_level_fields() -> None:
    manifest = pod("h", nodeName="n1", hostNetwork=True, hostPID=True)
    manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    manifest["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 80}]
    causes = fields_of(manifest)
    assert {
        "spec.nodeName",
        "spec.hostNetwork",
        "spec.hostPID",
        "spec.containers[0].securityContext.privileged",
        "spec.containers[0].ports[0].hostPort",
    } <= causes.keys()


def test_a_security_context_may_not_loosen_the_containers_isolation() -> None:
    manifest = pod("s")
    manifest["spec"]["securityContext"] = {
        "sysctls": [{"name": "net.core.somaxconn", "value": "1"}]
    }
    manifest["spec"]["containers"][0]["securityContext"] = {
        "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN", "CAP_NET_RAW"], "drop": ["ALL"]},
        "allowPrivilegeEscalation": True,
        "seccompProfile": {"type": "Unconfined"},
        "procMount": "Unmasked",
        "runAsUser": -1,
    }
    causes = fields_of(manifest)
    context = "spec.containers[0].securityContext"
    assert 'capability "SYS_ADMIN" is not offered' in causes[f"{context}.capabilities.add[1]"]
    assert "NET_BIND_SERVICE" in causes[f"{context}.capabilities.add[1]"]  # the safe set named
    assert 'capability "CAP_NET_RAW"' in causes[f"{context}.capabilities.add[2]"]
    assert f"{context}.capabilities.add[0]" not in causes
    assert "no-new-privileges" in causes[f"{context}.allowPrivilegeEscalation"]
    assert "RuntimeDefault" in causes[f"{context}.seccompProfile.type"]
    assert f"{context}.procMount" in causes and f"{context}.runAsUser" in causes
    assert "spec.securityContext.sysctls" in causes
    fine = pod("f")
    fine["spec"]["containers"][0]["securityContext"] = {
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert run(fine).demand.requested_cpu_milli > 0  # admitted


def test_requests_above_limits_and_unknown_resources() -> None:
    manifest = pod("r")
    manifest["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "amd.com/gpu": 1},
        "limits": {"cpu": "1"},
    }
    causes = fields_of(manifest)
    assert (
        "must be less than or equal to cpu limit of 1"
        in causes["spec.containers[0].resources.requests"]
    )
    assert "Tessera sells" in causes["spec.containers[0].resources.requests[amd.com/gpu]"]


def test_memory_no_spec_can_hold() -> None:
    causes = fields_of(pod("m", cpu="1", memory="600Gi"))
    assert (
        "no sold spec has that much memory"
        in causes["spec.containers[*].resources.requests.memory"]
    )


def test_a_pool_without_gpus_says_so_rather_than_suggest_whole_gpus() -> None:
    """A fresh stack whose nodes have no GPU: a slice is refused for what the pool lacks, not
    sent to ask for whole GPUs (which the pool lacks as well)."""

    def causes(manifest: dict[str, Any]) -> dict[str, str]:
        with pytest.raises(AdmissionError) as info:
            admit(
                Pod.model_validate(manifest),
                specs=load_catalog(),
                pool=PoolCatalog({}),
                default_spec=ComputeSpec.parse("2-4Gi"),
            )
        return {c.field: c.message for c in info.value.causes}

    for manifest in (pod("s", gpu_memory="20Gi", gpu_core=25), pod("w", gpus=1)):
        (message,) = causes(manifest).values()
        assert "the pool holds no GPU yet" in message and "add GPU nodes" in message
        assert "ask for whole GPUs" not in message and "split the work" not in message
