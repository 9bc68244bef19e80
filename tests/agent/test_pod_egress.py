"""TESSERA_AGENT_POD_EGRESS: whether the docker runtime's pods route out of the host. Off (the
default), a namespace's network is internal, with no address of the host's and no way out;
on, it is a bridge whose gateway is the host, which the engine NATs out through. A real
engine, the agent's own code making the networks, a container on each trying its gateway."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from agent.docker import DockerRuntime
from tests.conftest import unique
from tests.engine import BUSYBOX, docker


async def _network_of(host: str, namespace: str, *, egress: bool) -> str:
    runtime = DockerRuntime(SimpleNamespace(node="egress-test"), url=host, egress=egress)  # type: ignore[arg-type]
    try:
        return await runtime.network(namespace)
    finally:
        await runtime.close()


def test_pods_route_out_only_when_the_operator_allows_it(docker_host: str) -> None:
    shut, open_ = unique("noegress"), unique("egress")
    made: list[str] = []
    try:
        for namespace, egress in ((shut, False), (open_, True)):
            made.append(asyncio.run(_network_of(docker_host, namespace, egress=egress)))
        info: list[dict[str, Any]] = [
            json.loads(docker(docker_host, "network", "inspect", name))[0] for name in made
        ]
        assert [i["Internal"] for i in info] == [True, False]
        # The host answers at the bridge's gateway only when the bridge has its address: the
        # one way out of a namespace's network (the engine NATs beyond it).
        gateways = [i["IPAM"]["Config"][0]["Gateway"] for i in info]
        reached = [
            docker(
                docker_host,
                *("run", "--rm", "--network", name, BUSYBOX),
                *("sh", "-c", f"ping -c 1 -W 2 {gateway} >/dev/null && echo reached || true"),
            ).strip()
            for name, gateway in zip(made, gateways, strict=True)
        ]
        assert reached == ["", "reached"]
        # The same agent's other runs keep a network as it was made: no silent switch.
        again = asyncio.run(_network_of(docker_host, shut, egress=True))
        assert again == made[0]
        assert json.loads(docker(docker_host, "network", "inspect", again))[0]["Internal"]
    finally:
        for name in made:
            docker(docker_host, "network", "rm", name, check=False)
