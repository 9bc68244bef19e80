"""The controllers' HTTP client: only public API paths, with the manager's token.

As client-go's dynamic client: any resource by its `Resource` (group, version, plural, scope);
list, watch (a 410 raises `Gone`: list again), get, create, update, patch and delete.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import collections
import contextlib
import heapq
import itertools
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

log = logging.getLogger("tessera.controllers")
Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
REQUESTS_AT_ONCE = 32  # a client's requests in flight (watches apart), each on its connection
EVENTS_AT_ONCE = 4  # and its events'
# and its status writes': they make no pod, so few at once, and a burst's creates (objects,
# PodBatches) do not wait behind them at the API (the lag to an object's first pod halved)
STATUSES_AT_ONCE = 4
# an event waits while pod creates are waiting or in flight (PodCreates), at most this long
EVENTS_BEHIND_PODS_SECONDS = 2.0
# pods in the PodBatches in flight: a batch waits at the API behind the pods sent before it,
# so these are few (a fraction of a second of the API's creates), the smallest batch first
PODS_AT_ONCE = 64
CONNECTIONS_PER_POOL = 6  # httpx walks a pool's connections at every request


@dataclass(frozen=True)
class Resource:
    """A resource as its URL names it."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if sub:
                base += f"/{sub}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods")
EVENTS = Resource("", "v1", "events")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
REPLICASETS = Resource("apps", "v1", "replicasets")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
PODBATCHES = Resource("tessera.io", "v1", "podbatches")  # create only: many pods at once
MAX_BATCH = 500  # pods in one PodBatch (the API's limit)
MAX_BATCH_BYTES = 2 * 1024 * 1024  # and of JSON (the API takes 3 MiB)


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class ApiError(Exception):
    """The API answered with an error Status."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.message = message
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class PodCreates:
    """The pods a client is asked to create, sent as PodBatches packed across its callers.

    Every sync that makes pods (a slow-start step of a ReplicaSet or Job) hands its pods here
    and waits for their results. At most `batches` PodBatches are in flight (group commit:
    the creates handed in meanwhile wait for the next); when one is free, it takes the waiting
    creates of a namespace (the namespaces in turn), the smallest first, up to the room. So
    under a burst of objects the first pods of many objects go in one request instead of one
    request each (the API's cost of a request, not of a pod, was the first pods' wait), and a
    new object's one-pod step passes the larger steps of objects that already have pods.

    Bounded: at most `most` pods in flight (a batch waits at the API behind the pods sent
    before it, so these are few: a fraction of a second of the API's creates), and no batch
    over MAX_BATCH pods or MAX_BATCH_BYTES of JSON (each pod is encoded once, when handed
    here). A step larger than the room goes alone once nothing else is in flight.

    The client's events wait (`idle`, bounded) until no pods are waiting here nor in flight,
    so that they do not take the API's time from the pods."""

    def __init__(self, send: Any, most: int, batches: int = 4) -> None:
        self._send = send  # async (namespace, bodies) -> list of results, in order
        self.most = most
        self.batches = batches
        self.in_flight = 0  # pods
        self.batches_in_flight = 0
        self.requests = 0  # PodBatches sent
        self._pumping = False
        self._lines: dict[str, list[tuple[int, int, list[bytes], int, asyncio.Future[Any]]]] = {}
        self._turns: collections.deque[str] = collections.deque()
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()  # no pods waiting nor in flight
        self._idle.set()

    async def idle(self, most: float) -> None:
        """Once no pods are waiting here nor in flight, or after `most` seconds."""
        if not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(most):
                    await self._idle.wait()

    async def create(self, namespace: str, bodies: list[Obj]) -> list[Any]:
        """Each body's result (the pod made or its refusal), in order, once its batch is
        answered; the batch's failure (none of its pods known made) raises here."""
        if not bodies:
            return []
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        encoded = [orjson.dumps(body) for body in bodies]
        line = self._lines.get(namespace)
        if line is None:
            line = self._lines[namespace] = []
            self._turns.append(namespace)
        size = sum(map(len, encoded))
        heapq.heappush(line, (len(bodies), next(self._seq), encoded, size, done))
        self._idle.clear()
        self._soon()
        return list(await done)

    def _soon(self) -> None:
        """Pump once the callers ready to run now have handed in their creates too."""
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pumping = False
        stuck = 0  # namespaces in a row whose smallest create does not fit the room
        while (
            self._turns
            and stuck < len(self._turns)
            and self.in_flight < self.most
            and self.batches_in_flight < self.batches
        ):
            namespace = self._turns.popleft()
            line = self._lines[namespace]
            room = min(MAX_BATCH, self.most - self.in_flight)
            taken: list[tuple[list[bytes], asyncio.Future[Any]]] = []
            count = length = 0
            while line:
                size, _, bodies, nbytes, done = line[0]
                if done.done():  # its caller was cancelled
                    heapq.heappop(line)
                    continue
                fits = count + size <= room and length + nbytes <= MAX_BATCH_BYTES
                alone = not taken and self.in_flight == 0  # larger than the room: by itself
                if not (fits or alone):
                    break
                heapq.heappop(line)
                taken.append((bodies, done))
                count, length = count + size, length + nbytes
            if line:
                self._turns.append(namespace)
            else:
                del self._lines[namespace]
            if not taken:
                stuck += 1
                continue
            stuck = 0
            self.in_flight += count
            self.batches_in_flight += 1
            self.requests += 1
            task = asyncio.create_task(self._batch(namespace, taken, count))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not self._lines and not self.batches_in_flight:
            self._idle.set()

    async def _batch(
        self, namespace: str, taken: list[tuple[list[bytes], asyncio.Future[Any]]], count: int
    ) -> None:
        try:
            results = await self._send(namespace, [body for bodies, _ in taken for body in bodies])
        except asyncio.CancelledError:
            for _, done in taken:
                done.cancel()
            raise
        except Exception as exc:
            for _, done in taken:
                if not done.done():
                    done.set_exception(exc)
        else:
            at = 0
            for bodies, done in taken:
                if not done.done():
                    done.set_result(results[at : at + len(bodies)])
                at += len(bodies)
        finally:
            self.in_flight -= count
            self.batches_in_flight -= 1
            self._soon()


def verify_for(ca_cert: Path | None = None, ca_data: str | None = None) -> Any:
    """What httpx verifies the server with: the CA given (a file or PEM text), or the
    system's."""
    if ca_data:
        return ssl.create_default_context(cadata=ca_data)
    return ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else True


class Client:
    def __init__(
        self,
        server: str,
        token: str,
        *,
        ca_cert: Path | None = None,
        ca_data: str | None = None,
        timeout: float = 30.0,
        user_agent: str = "tessera-controllers",
    ) -> None:
        verify = verify_for(ca_cert, ca_data)

        def pool(connections: int | None) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=server.rstrip("/"),
                headers={"Authorization": f"Bearer {token}", "User-Agent": user_agent},
                timeout=httpx.Timeout(timeout, read=None),
                verify=verify,
                limits=httpx.Limits(
                    max_connections=connections, max_keepalive_connections=connections
                ),
            )

        # Requests wait here, not in httpx's pool: its queue costs each request a pass over
        # every waiting request and connection, and past its keep-alive count it closes and
        # opens connections (a TLS handshake each). So the pool is never asked for more
        # connections than it keeps, and events have slots of their own: a burst of pod
        # creates neither waits behind its own events nor starves them (an event waits for the
        # pod creates, but not long: `record_event`); so have status writes (a PUT or PATCH
        # of a `status` subresource), fewer. Even with nothing waiting, a request
        # costs httpx a pass over its pool's connections (a poll of each idle one's socket):
        # the connections are kept in small pools, a request taking the least busy one, so
        # that pass is over CONNECTIONS_PER_POOL, not all of them.
        connections = REQUESTS_AT_ONCE + EVENTS_AT_ONCE + STATUSES_AT_ONCE
        self._pools = [
            pool(CONNECTIONS_PER_POOL) for _ in range(-(-connections // CONNECTIONS_PER_POOL))
        ]
        self._busy = [0] * len(self._pools)
        self._requests = asyncio.Semaphore(REQUESTS_AT_ONCE)
        self._events = asyncio.Semaphore(EVENTS_AT_ONCE)
        self._statuses = asyncio.Semaphore(STATUSES_AT_ONCE)
        self._pods = PodCreates(self._pod_batch, PODS_AT_ONCE)
        self._watches = pool(None)  # each watch holds its connection while it lasts

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Client:
        """A client for the current context of a kubeconfig (server, CA, bearer token)."""
        config = yaml.safe_load(path.read_text())
        current = config.get("current-context")
        context = next(
            (c["context"] for c in config.get("contexts") or [] if c.get("name") == current),
            (config.get("contexts") or [{}])[0].get("context") or {},
        )
        cluster = next(
            c["cluster"] for c in config["clusters"] if c["name"] == context.get("cluster")
        )
        user = next(u["user"] for u in config["users"] if u["name"] == context.get("user"))
        ca_data = None
        if cluster.get("certificate-authority-data"):
            ca_data = base64.b64decode(cluster["certificate-authority-data"]).decode()
        ca_file = cluster.get("certificate-authority")
        return cls(
            cluster["server"],
            user["token"],
            ca_cert=Path(ca_file) if ca_file else None,
            ca_data=ca_data,
        )

    async def close(self) -> None:
        for one in self._pools:
            await one.aclose()
        await self._watches.aclose()

    async def _send(
        self,
        method: str,
        url: str,
        *,
        slots: asyncio.Semaphore | None = None,
        json: Obj | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """A request once a slot is free; `json`: its body (orjson: the manager encodes and
        decodes every object it writes and watches)."""
        if json is not None:
            kwargs["content"] = orjson.dumps(json)
            kwargs["headers"] = {"Content-Type": "application/json", **kwargs.get("headers", {})}
        async with slots or self._requests:
            # a free connection is in one of them: the slots are no more than the connections
            at = min(range(len(self._pools)), key=self._busy.__getitem__)
            self._busy[at] += 1
            try:
                return await self._pools[at].request(method, url, **kwargs)
            finally:
                self._busy[at] -= 1

    def _slots(self, sub: str) -> asyncio.Semaphore | None:
        """A write's slots: a status write's own few, else the common ones (None)."""
        return self._statuses if sub == "status" else None

    async def get_raw(self, url: str) -> httpx.Response:
        """A GET of `url` as it answers (no status checked)."""
        return await self._send("GET", url)

    @staticmethod
    def _check(response: httpx.Response) -> Obj:
        if response.status_code >= 400:
            try:
                body = orjson.loads(response.content)
            except ValueError:
                body = {}
            message = body.get("message") if isinstance(body, dict) else None
            reason = body.get("reason", "") if isinstance(body, dict) else ""
            raise ApiError(response.status_code, message or response.text[:200], reason)
        return dict(orjson.loads(response.content))

    async def list(
        self, resource: Resource, *, namespace: str | None = None, **params: str
    ) -> tuple[list[Obj], str]:
        """Every object (paged by the server's continue tokens) and the list's version."""
        items: list[Obj] = []
        query = {"limit": "500", **params}
        while True:
            body = self._check(await self._send("GET", resource.path(namespace), params=query))
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion") or "0")
            query["continue"] = meta["continue"]

    async def watch(
        self,
        resource: Resource,
        resource_version: str,
        *,
        namespace: str | None = None,
        timeout_seconds: int = 300,
        **params: str,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """The events after `resource_version`, with bookmarks, until the server ends the
        watch; raises Gone when the version is too old."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        stream = self._watches.stream("GET", resource.path(namespace), params=query)
        async with stream as response:
            if response.status_code == 410:
                raise Gone()
            if response.status_code >= 400:
                await response.aread()
                self._check(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                yield str(event["type"]), dict(event["object"])

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return self._check(await self._send("GET", resource.path(namespace, name)))

    async def create(
        self, resource: Resource, namespace: str | None, body: Obj, *, event: bool = False
    ) -> Obj:
        slots = self._events if event else None
        return self._check(
            await self._send("POST", resource.path(namespace), json=body, slots=slots)
        )

    async def create_pods(
        self, namespace: str, bodies: builtins.list[Obj]
    ) -> builtins.list[Obj | ApiError]:
        """Many pods (Tessera's PodBatch, each pod created as `create` would create it), in
        PodBatches packed with other callers' pods (`PodCreates`), MAX_BATCH at a time: each
        the pod created or its refusal, in order. Raises only when a request itself fails
        (then none of that request's pods is known made)."""
        results: builtins.list[Obj | ApiError] = []
        for start in range(0, len(bodies), MAX_BATCH):
            results.extend(await self._pods.create(namespace, bodies[start : start + MAX_BATCH]))
        return results

    async def _pod_batch(
        self, namespace: str, bodies: builtins.list[bytes]
    ) -> builtins.list[Obj | ApiError]:
        """One PodBatch of pods encoded already."""
        head = b'{"apiVersion":"%s","kind":"PodBatch","items":[' % PODBATCHES.api_version.encode()
        response = await self._send(
            "POST",
            PODBATCHES.path(namespace),
            content=head + b",".join(bodies) + b"]}",
            headers={"Content-Type": "application/json"},
        )
        answer = self._check(response)
        results: builtins.list[Obj | ApiError] = []
        for item in answer.get("items") or []:
            if item.get("kind") == "Status":
                results.append(
                    ApiError(
                        int(item.get("code") or 500),
                        str(item.get("message") or ""),
                        str(item.get("reason") or ""),
                    )
                )
            else:
                results.append(dict(item))
        if len(results) != len(bodies):
            raise ApiError(500, f"a PodBatch of {len(bodies)} answered {len(results)} items")
        return results

    async def update(
        self, resource: Resource, namespace: str | None, name: str, body: Obj, *, sub: str = ""
    ) -> Obj:
        return self._check(
            await self._send(
                "PUT", resource.path(namespace, name, sub), json=body, slots=self._slots(sub)
            )
        )

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        sub: str = "",
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        response = await self._send(
            "PATCH",
            resource.path(namespace, name, sub),
            slots=self._slots(sub),
            content=orjson.dumps(body),
            headers={"Content-Type": content_type},
        )
        return self._check(response)

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> Obj | None:
        """Delete an object (only if it is still `uid`, and unchanged since `resource_version`,
        when given: 409 otherwise); None when it is gone."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        if any(preconditions.values()):
            options["preconditions"] = {k: v for k, v in preconditions.items() if v}
        if propagation:
            options["propagationPolicy"] = propagation
        response = await self._send("DELETE", resource.path(namespace, name), json=options)
        if response.status_code == 404:
            return None
        return self._check(response)

    async def record_event(
        self,
        obj: Obj,
        *,
        kind: str,
        api_version: str,
        event_type: str,
        reason: str,
        message: str,
        component: str,
    ) -> None:
        """An Event about `obj`, as kube-controller-manager's recorder writes it (the API counts
        a repeat on the event it repeats). Best effort: a lost event loses nothing else.

        Sent behind the pods: it waits while pod creates are waiting or in flight (the API's
        time is theirs first), at most EVENTS_BEHIND_PODS_SECONDS from now."""
        await self._pods.idle(EVENTS_BEHIND_PODS_SECONDS)
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": api_version,
                "kind": kind,
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": component},
            "reportingComponent": component,
        }
        try:
            await self.create(EVENTS, namespace, body, event=True)
        except (ApiError, httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: closed
            log.debug("event %s on %s %s: %s", reason, kind, meta.get("name"), exc)
