"""The agent's HTTP client for one node: only public API paths, with the node's token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("tessera.agent")
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def verify_for(ca_cert: Path | None) -> Any:
    """What httpx verifies the server with: the CA given, or the system's."""
    return ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else True


class WaitOnTooMany(httpx.AsyncBaseTransport):
    """Sends a request again when the API answers `429 Too Many Requests` (a node's token has a
    rate of its own), after the answer's `Retry-After` (at most `MAX_WAIT` seconds, and a few
    times: then the 429 is the caller's)."""

    MAX_WAIT = 30.0

    def __init__(self, inner: httpx.AsyncBaseTransport, *, attempts: int = 5) -> None:
        self.inner = inner
        self.attempts = attempts
        self.waited = 0  # how many 429s were waited out, for the curious (and the tests)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for _ in range(self.attempts - 1):
            response = await self.inner.handle_async_request(request)
            if response.status_code != 429:
                return response
            await response.aclose()
            try:
                wait = float(response.headers.get("Retry-After", "1"))
            except ValueError:
                wait = 1.0
            self.waited += 1
            await asyncio.sleep(min(max(wait, 0.0), self.MAX_WAIT))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class NodeClient:
    def __init__(
        self, server: str, token: str, node: str, *, ca_cert: Path | None, timeout: float = 30.0
    ) -> None:
        self.node = node
        self.server = server.rstrip("/")
        self.token = token
        self.ca_cert = ca_cert
        self._lease: dict[str, Any] | None = None
        verify = verify_for(ca_cert)
        self.transport = WaitOnTooMany(httpx.AsyncHTTPTransport(verify=verify))
        self.http = httpx.AsyncClient(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, read=None),
            transport=self.transport,  # it verifies the server
        )

    async def close(self) -> None:
        await self.http.aclose()

    # --- the node and its lease ---------------------------------------------------------------

    async def register(self, manifest: dict[str, Any] | None) -> None:
        """Make sure the Node exists: create it from `manifest` when it does not."""
        response = await self.http.get(f"/api/v1/nodes/{self.node}")
        if response.status_code == 404 and manifest is not None:
            created = await self.http.post("/api/v1/nodes", json=manifest)
            if created.status_code not in (201, 409):
                created.raise_for_status()
            return
        response.raise_for_status()

    async def label(self, labels: dict[str, str]) -> httpx.Response:
        """Set labels of the Node (the runtime that runs its pods)."""
        return await self.http.patch(
            f"/api/v1/nodes/{self.node}",
            json={"metadata": {"labels": labels}},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def get_node(self) -> dict[str, Any]:
        response = await self.http.get(f"/api/v1/nodes/{self.node}")
        response.raise_for_status()
        return dict(response.json())

    async def report_fault(self, gpu: str, spec: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            f"/apis/tessera.io/v1/gpudevices/{gpu}/fault",
            json={"apiVersion": "tessera.io/v1", "kind": "GPUFault", "spec": spec},
        )

    async def unannotate(self, key: str, resource_version: str) -> httpx.Response:
        """Remove an annotation of the Node, as read at `resource_version` (409 otherwise)."""
        return await self.http.patch(
            f"/api/v1/nodes/{self.node}",
            json={"metadata": {"resourceVersion": resource_version, "annotations": {key: None}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def renew(self, duration: int) -> dict[str, Any]:
        """Renew the node's Lease (create it the first time); returns it. One PUT of the lease
        as last written (a conflict or a missing lease reads it again), as the kubelet does."""
        path = f"{LEASES}/{self.node}"
        lease = self._lease
        if lease is None:
            response = await self.http.get(path)
            if response.status_code == 404:
                return await self._create(duration)
            response.raise_for_status()
            lease = response.json()
        stamp = micro_now()
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != self.node:
            spec["holderIdentity"] = self.node
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["leaseDurationSeconds"] = duration
        spec["renewTime"] = stamp
        updated = await self.http.put(path, json=lease)
        if updated.status_code in (404, 409):
            self._lease = None  # someone else wrote it (or removed it): read it again next time
        updated.raise_for_status()
        self._lease = updated.json()
        return dict(self._lease)

    async def _create(self, duration: int) -> dict[str, Any]:
        stamp = micro_now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": duration,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        created = await self.http.post(LEASES, json=body)
        created.raise_for_status()
        self._lease = created.json()
        return dict(self._lease)

    # --- its pods -----------------------------------------------------------------------------

    @property
    def _selector(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node}"}

    async def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        response = await self.http.get("/api/v1/pods", params=self._selector)
        response.raise_for_status()
        body = response.json()
        return list(body["items"]), str(body["metadata"].get("resourceVersion", "0"))

    async def watch_pods(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        params = {
            **self._selector,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        async with self.http.stream("GET", "/api/v1/pods", params=params) as response:
            if response.status_code == 410:
                raise Gone()
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    if event["object"].get("code") == 410:
                        raise Gone()
                    raise httpx.HTTPError(event["object"].get("message", "watch error"))
                yield event["type"], event["object"]

    async def report(self, pod: dict[str, Any], status: dict[str, Any]) -> httpx.Response:
        meta = pod["metadata"]
        return await self.http.patch(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def send_log(
        self,
        pod: dict[str, Any],
        container: str,
        restart_count: int,
        lines: list[str] | list[tuple[str, str]],
    ) -> httpx.Response:
        """Lines of one run of a container (`POST .../log`, a Tessera extension): texts (written
        now) or (time, text) pairs, the time as the node observed it."""
        meta = pod["metadata"]
        stamp = micro_now()
        return await self.http.post(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log",
            params={"container": container},
            json={
                "restartCount": restart_count,
                "lines": [
                    {"time": line[0], "text": line[1]}
                    if isinstance(line, tuple)
                    else {"time": stamp, "text": line}
                    for line in lines
                ],
            },
        )

    async def get_gpu(self, name: str) -> dict[str, Any]:
        """A GPUDevice of the node."""
        response = await self.http.get(f"/apis/tessera.io/v1/gpudevices/{name}")
        response.raise_for_status()
        return dict(response.json())

    async def get_used(self, namespace: str, resource: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap or Secret (`resource`: configmaps or secrets) a pod of the node uses;
        None when it does not exist."""
        response = await self.http.get(f"/api/v1/namespaces/{namespace}/{resource}/{name}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    async def event(
        self, pod: dict[str, Any], reason: str, message: str, kind: str = "Normal"
    ) -> httpx.Response:
        """An event about a pod bound to the node, as the kubelet writes it."""
        meta = pod["metadata"]
        return await self.http.post(
            f"/api/v1/namespaces/{meta['namespace']}/events",
            json={
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}."},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message[:1024],
                "type": kind,
                "reportingComponent": "kubelet",
                "source": {"component": "kubelet", "host": self.node},
                "firstTimestamp": micro_now(),
            },
        )

    async def get_log_tail(self, pod: dict[str, Any], container: str) -> str | None:
        """The time of the last line the API holds of a container's current run, or None."""
        meta = pod["metadata"]
        response = await self.http.get(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log",
            params={"container": container, "timestamps": "true", "tailLines": 1},
        )
        if response.status_code >= 400 or not response.text.strip():
            return None
        return response.text.split(" ", 1)[0].strip() or None

    async def remove(self, pod: dict[str, Any]) -> httpx.Response:
        meta = pod["metadata"]
        return await self.http.request(
            "DELETE",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            params={"gracePeriodSeconds": 0},
            json={"preconditions": {"uid": meta["uid"]}},
        )


class Background:
    """Tasks started and not awaited, kept until they end (the event loop holds them weakly)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def __call__(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


RETRY_FIRST = 0.2  # seconds before a report the API did not acknowledge is sent again
RETRY_MAX = 5.0  # doubling up to this


class Outbox:
    """One pod's reports to the API (status, log lines, removal), sent in order, each sent again
    (with back-off) until the API acknowledges it: an answer below 500. Each report carries what
    the node observed (times, exit codes), so one that arrives late says what it would have said
    on time, and sending one twice changes nothing."""

    def __init__(self, client: NodeClient, what: str) -> None:
        self.client = client
        self.what = what
        self._queue: asyncio.Queue[tuple[str, Callable[[], Awaitable[httpx.Response]]]] = (
            asyncio.Queue()
        )
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def put(self, label: str, call: Callable[[], Awaitable[httpx.Response]]) -> None:
        self._queue.put_nowait((label, call))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send())

    async def drain(self) -> None:
        """Until every report put so far is acknowledged."""
        await self._queue.join()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _send(self) -> None:
        while True:
            label, call = await self._queue.get()
            try:
                await self._until_acknowledged(label, call)
            finally:
                self._queue.task_done()

    async def _until_acknowledged(
        self, label: str, call: Callable[[], Awaitable[httpx.Response]]
    ) -> None:
        delay = RETRY_FIRST
        while True:
            try:
                response = await call()
            except (httpx.HTTPError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    self.sent += 1
                    if response.status_code >= 400 and response.status_code != 404:
                        log.warning(
                            "node %s: %s of %s refused (%s): %s",
                            self.client.node,
                            label,
                            self.what,
                            response.status_code,
                            response.text[:300],
                        )
                    return
                problem = f"{response.status_code} {response.text[:200]}"
            log.warning(
                "node %s: %s of %s not acknowledged (%s); sending it again in %.1fs",
                self.client.node,
                label,
                self.what,
                problem,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
