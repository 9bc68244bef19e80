"""Which pods the docker runtime gives a sandbox container (the holder of their network
namespace and volumes), and which hold their network in their one container (no engine
needed: tests/agent/test_docker_runtime.py sees both on a real engine)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.docker import needs_sandbox


def _pod(**spec: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "busybox", **spec.pop("main", {})}
    return {"spec": {"containers": [main], "restartPolicy": "Never", **spec}}


def test_one_container_never_restarted_holds_its_network_itself() -> None:
    assert not needs_sandbox(_pod())
    plain_env = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ]
    }
    assert not needs_sandbox(_pod(main=plain_env))


@pytest.mark.parametrize(
    ("why", "spec"),
    [
        ("restarted: its address kept", {"restartPolicy": "Always"}),
        ("restarted on failure", {"restartPolicy": "OnFailure"}),
        ("Always by default", {"restartPolicy": None}),
        ("two containers share localhost", {"containers": [{"name": "a"}, {"name": "b"}]}),
        ("init containers share it", {"initContainers": [{"name": "setup"}]}),
        ("volumes live in the sandbox", {"volumes": [{"name": "v", "emptyDir": {}}]}),
        (
            "its address known before it is made",
            {
                "main": {
                    "env": [
                        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ]
                }
            },
        ),
    ],
)
def test_a_pod_that_shares_or_keeps_its_network_gets_a_sandbox(
    why: str, spec: dict[str, Any]
) -> None:
    pod = _pod(**spec)
    if pod["spec"]["restartPolicy"] is None:
        del pod["spec"]["restartPolicy"]
    assert needs_sandbox(pod), why
