"""A namespace's network on the engine, found or made once (agent/docker.py): the engine takes two
networks of one name (its API before 1.44 checks none unless asked, and not atomically), so two
pods of a new tenant starting at once, or two nodes' agents on one engine, could each make one.
Against the real engine at DOCKER_HOST."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import aiodocker
import pytest

from agent.client import NodeClient
from agent.docker import NETWORK_PREFIX, POD_NAMESPACE, DockerRuntime
from tests.engine import BUSYBOX, docker


@pytest.fixture
def namespace(docker_host: str) -> Iterator[str]:
    """A namespace of its own; its networks (and a container on one) removed afterwards."""
    name = f"nettest-{uuid.uuid4().hex[:8]}"
    yield name
    docker(docker_host, "rm", "-f", f"{name}-on", check=False)
    for network in networks(docker_host, name):
        docker(docker_host, "network", "rm", network["Id"], check=False)


def networks(docker_host: str, namespace: str) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        engine = aiodocker.Docker(url=docker_host)
        try:
            every = await engine.networks.list()
        finally:
            await engine.close()
        return [n for n in every if n["Name"] == f"{NETWORK_PREFIX}{namespace}"]

    return asyncio.run(listed())


def runtime(docker_host: str, node: str) -> DockerRuntime:
    """A node's docker runtime (its API client is never called for networks)."""
    client = NodeClient("https://127.0.0.1:9", "unused", node, ca_cert=None)
    return DockerRuntime(client, url=docker_host)


async def close(*runtimes: DockerRuntime) -> None:
    for each in runtimes:
        await each.close()
        await each.client.close()


def test_pods_of_a_new_tenant_starting_at_once_make_one_network(
    docker_host: str, namespace: str
) -> None:
    async def main() -> list[str]:
        # two nodes acted for by one agent process, ten pods of the tenant on each, at once
        a, b = runtime(docker_host, "node-a"), runtime(docker_host, "node-b")
        try:
            return await asyncio.gather(*(r.network(namespace) for r in (a, b) for _ in range(10)))
        finally:
            await close(a, b)

    used = asyncio.run(main())
    (made,) = networks(docker_host, namespace)
    assert set(used) == {f"{NETWORK_PREFIX}{namespace}"}
    assert made["Internal"] and made["Labels"] == {POD_NAMESPACE: namespace}


def test_a_restarted_agent_reuses_the_network_and_removes_duplicates(
    docker_host: str, namespace: str
) -> None:
    name = f"{NETWORK_PREFIX}{namespace}"

    async def make() -> str:
        """One of the name, as an agent made it without asking for a duplicate check."""
        engine = aiodocker.Docker(url=docker_host)
        config = {"Name": name, "Internal": True, "Labels": {POD_NAMESPACE: namespace}}
        try:
            return str((await engine.networks.create(config)).id)
        finally:
            await engine.close()

    used_one = asyncio.run(make())
    # a pod of the tenant runs on it (the engine attaches no container to an ambiguous name)
    on = ("--name", f"{namespace}-on", "--network", used_one, BUSYBOX, "sleep", "300")
    docker(docker_host, "run", "-d", *on)
    # then two more of the name, as agents that raced made them: the one in use is kept
    later = [asyncio.run(make()) for _ in range(2)]
    assert {n["Id"] for n in networks(docker_host, namespace)} == {used_one, *later}

    async def main() -> tuple[str, str]:
        first = runtime(docker_host, "node-a")
        try:
            used = await first.network(namespace)
        finally:
            await close(first)
        restarted = runtime(docker_host, "node-a")
        try:
            return used, await restarted.network(namespace)
        finally:
            await close(restarted)

    used, again = asyncio.run(main())
    assert used == again == name
    assert [n["Id"] for n in networks(docker_host, namespace)] == [used_one]
