"""What the docker runtime asks the engine for a pod's GPUs (no GPU on these machines: the
README says how an operator checks it on a GPU host): whole GPUs as NVIDIA device requests,
a slice with NVIDIA MPS's limits from what it was sold."""

from __future__ import annotations

import json
from typing import Any

from agent.docker import gpu_config


def _pod(*shares: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "t",
            "uid": "u",
            "annotations": {"tessera.io/gpu-allocation": json.dumps(list(shares))},
        },
        "spec": {"containers": []},
        "status": {},
    }


def _device(index: int, memory: str = "80Gi", **spec: Any) -> dict[str, Any]:
    return {"spec": {"index": index, "memory": memory, **spec}}


def test_whole_gpus_are_device_requests_for_the_nvidia_driver() -> None:
    pod = _pod(
        {"gpu": "n1-gpu2", "memoryMiB": 81920, "corePercent": 100},
        {"gpu": "n1-gpu3", "memoryMiB": 81920, "corePercent": 100},
    )
    requests, env = gpu_config(pod, {"n1-gpu2": _device(2), "n1-gpu3": _device(3)})
    assert requests == [{"Driver": "nvidia", "DeviceIDs": ["2", "3"], "Capabilities": [["gpu"]]}]
    assert env == []  # whole GPUs: no MPS limit


def test_a_gpu_known_by_uuid_is_asked_for_by_uuid() -> None:
    uuid = "GPU-3b2f1c7e-0000-4000-8000-000000000001"
    requests, _ = gpu_config(
        _pod({"gpu": "n1-gpu0", "memoryMiB": 81920, "corePercent": 100}),
        {"n1-gpu0": _device(0, uuid=uuid)},
    )
    assert requests[0]["DeviceIDs"] == [uuid]


def test_a_slice_gets_its_gpu_and_the_mps_limits_it_was_sold() -> None:
    requests, env = gpu_config(
        _pod({"gpu": "n1-gpu1", "memoryMiB": 20480, "corePercent": 25}),
        {"n1-gpu1": _device(1)},
    )
    assert requests == [{"Driver": "nvidia", "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]
    assert env == [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",  # device 0: the one GPU it sees
    ]


def test_no_allocation_asks_for_nothing() -> None:
    pod = _pod()
    pod["metadata"]["annotations"] = {}
    assert gpu_config(pod, {}) == ([], [])
