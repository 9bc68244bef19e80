"""The ReplicaSet and Deployment controllers (apps/v1), as Kubernetes' own.

ReplicaSet: keeps `spec.replicas` active pods of its template (created with generateName
`<rs>-`, the template's labels and an ownerReference with controller=true; the surplus deleted,
not-yet-running and not-ready pods first), and reports how many exist, are ready and are
available (ready for minReadySeconds).

Deployment: one ReplicaSet per pod template (`<deployment>-<pod-template-hash>`, the hash also a
label of it and its pods); a new template rolls out by RollingUpdate (at most maxSurge pods over
the desired count, at most maxUnavailable under it) or by Recreate (the old pods all gone
before a new one starts); revisions in `deployment.kubernetes.io/revision`; old ReplicaSets
kept to revisionHistoryLimit; the conditions Available and Progressing (with the progress
deadline); a paused Deployment is scaled but not rolled out.

A ReplicaSet's missing pods are made by Kubernetes' slow start (1, 2, 4, ... at once, up to
STEP), one step per reconcile, the ReplicaSet then queued again behind the other objects
(base.py SlowStart): a burst of ReplicaSets gets every one's first pod before any one's next
batch.

Both are level-triggered: each reconcile reads the informers' caches (which hold the
controllers' own writes at once), computes what should be and writes the difference. An
owner that is gone takes its dependents with it (the pods of a deleted ReplicaSet, the
ReplicaSets of a deleted Deployment), as the garbage collector's Background propagation does.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, ClassVar

from app.controllers.base import BURST_WORKERS, Controller, SlowStart, names_message
from app.controllers.client import DEPLOYMENTS, PODS, REPLICASETS, ApiError, Obj, Resource
from app.controllers.informer import Informer, controller_of, text_key

log = logging.getLogger("tessera.controllers")

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
NOT_COPIED = (REVISION, DESIRED, MAX_REPLICAS, "kubectl.kubernetes.io/last-applied-configuration")
BURST = 100  # pods deleted at once by one reconcile
STEP = 16  # the largest slow-start batch of pods a ReplicaSet's reconcile creates
SAFE = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' SafeEncodeString alphabet


def now() -> datetime:
    return datetime.now(UTC)


def stamp(at: datetime | None = None) -> str:
    return (at or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def split_key(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def meta(obj: Obj) -> Obj:
    return obj.setdefault("metadata", {})


def owner_ref(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_by_kind(obj: Obj, kind: str) -> Obj | None:
    ref = controller_of(obj)
    return ref if ref is not None and ref.get("kind") == kind else None


# --- pods ------------------------------------------------------------------------------------


def is_terminating(pod: Obj) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def is_active(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return not is_terminating(pod) and phase not in ("Succeeded", "Failed")


def ready_since(pod: Obj) -> datetime | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return parse(condition.get("lastTransitionTime")) or datetime.min.replace(tzinfo=UTC)
    return None


def available_in(pod: Obj, min_ready: int, at: datetime) -> float | None:
    """0 when the pod is available; else the seconds until it is (None: not even ready)."""
    since = ready_since(pod)
    if since is None:
        return None
    if min_ready <= 0:
        return 0.0
    return max(0.0, min_ready - (at - since).total_seconds())


def deletion_rank(pod: Obj) -> tuple[Any, ...]:
    """Pods to delete first sort first (Kubernetes' ActivePods order): not yet on a node, then
    pending, then not ready, then the most recently ready, then the newest."""
    status = pod.get("status") or {}
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(status.get("phase") or "", 0)
    since = ready_since(pod)
    created = meta(pod).get("creationTimestamp") or ""
    return (
        1 if (pod.get("spec") or {}).get("nodeName") else 0,
        phase_rank,
        1 if since is not None else 0,
        -(since.timestamp() if since else 0),
        _inverted(created),
    )


def _inverted(text: str) -> str:
    """Sorts the newest first."""
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


# --- ReplicaSet ------------------------------------------------------------------------------


class ReplicaSetController(Controller):
    name = "replicaset"
    resources: ClassVar[tuple[Resource, ...]] = (REPLICASETS, PODS)
    workers = BURST_WORKERS

    def __init__(self) -> None:
        super().__init__()
        self.slow_start = SlowStart(STEP)

    @property
    def sets(self) -> Informer:
        return self.informers[REPLICASETS]

    @property
    def pods(self) -> Informer:
        return self.informers[PODS]

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        if resource == REPLICASETS:
            return (text_key(obj),)
        ref = owned_by_kind(obj, "ReplicaSet")
        if ref is None:
            return ()
        return (f"{meta(obj).get('namespace', '')}/{ref['name']}",)

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        rs = self.sets.get(namespace, name)
        if rs is None:
            self.slow_start.done(key)
            await delete_orphans(
                self.client, self.pods, PODS, REPLICASETS, "ReplicaSet", namespace, name
            )
            return None
        uid = meta(rs)["uid"]
        owned = [p for p in self.pods.owned_by(uid)]
        active = [p for p in owned if is_active(p)]
        if meta(rs).get("deletionTimestamp"):
            self.slow_start.done(key)
            return None
        spec = rs.get("spec") or {}
        want = int(spec.get("replicas", 1))
        diff = len(active) - want
        if diff < 0 and await self._create(rs, key, -diff):
            # the next step after the other objects' (the status once the steps are made)
            self.queue.add_behind(key)
            return None
        self.slow_start.done(key)
        if diff > 0:
            doomed = sorted(active, key=deletion_rank)[:diff]
            await self._delete(rs, doomed)
        return await self._status(rs)

    async def _create(self, rs: Obj, key: str, count: int) -> bool:
        """One slow-start step of the `count` pods missing; whether more are left to make."""
        template = (rs.get("spec") or {}).get("template") or {}
        tmeta = template.get("metadata") or {}
        namespace = meta(rs)["namespace"]
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta(rs)['name']}-",
                "namespace": namespace,
                "labels": dict(tmeta.get("labels") or {}),
                "ownerReferences": [owner_ref(rs)],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        if tmeta.get("annotations"):
            body["metadata"]["annotations"] = dict(tmeta["annotations"])
        # one request (a PodBatch: the API creates each pod as a create of its own)
        size = self.slow_start.batch(key, count)
        results = await self.client.create_pods(namespace, [body] * size)
        failures = [r for r in results if isinstance(r, BaseException)]
        made = [r for r in results if not isinstance(r, BaseException)]
        for pod in made:
            self.pods.wrote(pod)
        if made:  # one event for the step, naming its pods
            names = [meta(pod)["name"] for pod in made]
            self._event(rs, "Normal", "SuccessfulCreate", names_message("Created", "pod", names))
        if failures:
            self.slow_start.done(key)
            self._event(rs, "Warning", "FailedCreate", f"Error creating: {failures[0]}")
            raise failures[0]
        if size < count:
            self.slow_start.made(key, size)
            return True
        return False

    def _event(self, rs: Obj, event_type: str, reason: str, message: str) -> None:
        self.event(rs, event_type, reason, message, kind="ReplicaSet", api_version="apps/v1")

    async def _delete(self, rs: Obj, pods: list[Obj]) -> None:
        deleted: list[str] = []

        async def one(pod: Obj) -> None:
            gone = await self.client.delete(
                PODS, meta(pod)["namespace"], meta(pod)["name"], uid=meta(pod)["uid"]
            )
            deleted.append(meta(pod)["name"])
            if gone is None:
                self.pods.apply("DELETED", pod)
            else:
                self.pods.removed(gone)

        results = await asyncio.gather(*(one(p) for p in pods[:BURST]), return_exceptions=True)
        if deleted:  # one event for the pods deleted together
            self._event(rs, "Normal", "SuccessfulDelete", names_message("Deleted", "pod", deleted))
        failures = [
            r
            for r in results
            if isinstance(r, BaseException) and not (isinstance(r, ApiError) and r.conflict)
        ]
        if failures:
            raise failures[0]

    async def _status(self, rs: Obj) -> float | None:
        spec = rs.get("spec") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        owned = self.pods.owned_by(meta(rs)["uid"])
        active = [p for p in owned if is_active(p)]
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        at = now()
        ready = available = 0
        again: float | None = None
        for pod in active:
            wait = available_in(pod, min_ready, at)
            if wait is None:
                continue
            ready += 1
            if wait == 0:
                available += 1
            else:
                again = wait if again is None else min(again, wait)
        status: Obj = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(
                1
                for p in active
                if all(meta(p).get("labels", {}).get(k) == v for k, v in labels.items())
            ),
            "readyReplicas": ready,
            "availableReplicas": available,
            "terminatingReplicas": sum(1 for p in owned if is_terminating(p)),
            "observedGeneration": meta(rs).get("generation", 1),
        }
        old = rs.get("status") or {}
        if any(old.get(k, 0) != v for k, v in status.items()):
            updated = await self.client.patch(
                REPLICASETS,
                meta(rs)["namespace"],
                meta(rs)["name"],
                {"status": status},
                sub="status",
            )
            self.sets.wrote(updated)
        return None if again is None else again + 0.05


async def delete_orphans(
    client: Any,
    dependents: Informer,
    dependent: Resource,
    owner: Resource,
    kind: str,
    namespace: str,
    name: str,
) -> None:
    """The owner `namespace/name` is not in the cache: if the API says it is gone (or is
    another object now), delete the dependents whose controller was it (Background
    propagation, as the garbage collector).

    Only the version of a dependent seen owned is deleted (its resourceVersion is a
    precondition): the caches of owners and dependents are fed by separate watches, so an owner
    deleted with `--cascade=orphan` may be gone here while its dependent's cached copy still
    names it, though the API took that reference off before the owner went. The newer version
    brings the key back if it is still owned."""
    orphans = [
        obj
        for obj in dependents.objects(namespace)
        if (ref := owned_by_kind(obj, kind)) is not None
        and ref.get("name") == name
        and not meta(obj).get("deletionTimestamp")
    ]
    if not orphans:
        return
    try:
        current = await client.get(owner, namespace, name)
        alive = meta(current).get("uid")
    except ApiError as exc:
        if not exc.not_found:
            raise
        alive = None
    for obj in orphans:
        ref = owned_by_kind(obj, kind) or {}
        if ref.get("uid") == alive:
            continue
        log.info(
            "deleting %s %s/%s: its %s %s is gone",
            dependent.plural,
            namespace,
            meta(obj)["name"],
            kind,
            name,
        )
        try:
            gone = await client.delete(
                dependent,
                namespace,
                meta(obj)["name"],
                uid=meta(obj)["uid"],
                resource_version=meta(obj).get("resourceVersion"),
            )
        except ApiError as exc:
            if not exc.conflict:
                raise
            continue
        if gone is None or not meta(gone).get("deletionTimestamp"):
            dependents.apply("DELETED", gone or obj)
        else:
            dependents.wrote(gone)


# --- Deployment ------------------------------------------------------------------------------


def template_hash(template: Obj, collisions: int = 0) -> str:
    """A pod template's hash (the `pod-template-hash` label): 10 characters of Kubernetes'
    safe alphabet from a SHA-256 of the template without that label."""
    text = json.dumps(_without_hash(template), sort_keys=True, separators=(",", ":"))
    if collisions:
        text += f"#{collisions}"
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    out = []
    for _ in range(10):
        digest, rest = divmod(digest, len(SAFE))
        out.append(SAFE[rest])
    return "".join(out)


def _without_hash(template: Obj) -> Obj:
    template = copy.deepcopy(template or {})
    labels = (template.get("metadata") or {}).get("labels")
    if labels:
        labels.pop(HASH_LABEL, None)
    return _pruned(template)


def _pruned(value: Any) -> Any:
    """Without empty maps and lists and nulls: a template read back compares equal."""
    if isinstance(value, dict):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def same_template(a: Obj, b: Obj) -> bool:
    return _without_hash(a) == _without_hash(b)


def resolve(value: Any, total: int, *, round_up: bool) -> int:
    """An int-or-percent (maxSurge, maxUnavailable) of `total`."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%"):
        fraction = int(text[:-1]) * total / 100
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(text)


def revision_of(obj: Obj) -> int:
    try:
        return int((meta(obj).get("annotations") or {}).get(REVISION) or 0)
    except ValueError:
        return 0


def replicas(rs: Obj) -> int:
    return int((rs.get("spec") or {}).get("replicas") or 0)


def status_of(rs: Obj, field: str) -> int:
    return int((rs.get("status") or {}).get(field) or 0)


class DeploymentController(Controller):
    name = "deployment"
    resources: ClassVar[tuple[Resource, ...]] = (DEPLOYMENTS, REPLICASETS, PODS)
    workers = BURST_WORKERS

    @property
    def deployments(self) -> Informer:
        return self.informers[DEPLOYMENTS]

    @property
    def sets(self) -> Informer:
        return self.informers[REPLICASETS]

    @property
    def pods(self) -> Informer:
        return self.informers[PODS]

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        namespace = meta(obj).get("namespace", "")
        if resource == DEPLOYMENTS:
            return (text_key(obj),)
        if resource == PODS:  # a Recreate waits for the old pods to be gone
            ref = owned_by_kind(obj, "ReplicaSet")
            if ref is None:
                return ()
            obj = self.sets.get(namespace, ref["name"]) or {}
            if not obj:
                return ()
        ref = owned_by_kind(obj, "Deployment")
        return () if ref is None else (f"{namespace}/{ref['name']}",)

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        d = self.deployments.get(namespace, name)
        if d is None:
            await delete_orphans(
                self.client, self.sets, REPLICASETS, DEPLOYMENTS, "Deployment", namespace, name
            )
            return None
        if meta(d).get("deletionTimestamp"):
            return None
        spec = d.get("spec") or {}
        owned = [
            rs for rs in self.sets.owned_by(meta(d)["uid"]) if not meta(rs).get("deletionTimestamp")
        ]
        template = spec.get("template") or {}
        new = next(
            (rs for rs in owned if same_template(rs["spec"].get("template") or {}, template)), None
        )
        olds = sorted(
            (rs for rs in owned if rs is not new),
            key=lambda rs: meta(rs).get("creationTimestamp", ""),
        )
        created = False
        if spec.get("paused"):
            if new is not None and not any(replicas(rs) for rs in olds):
                new = await self._scale(d, new, int(spec.get("replicas", 1)))
        else:
            if new is None:
                new = await self._new_set(d, owned, olds)
                created = True
            else:
                new = await self._mark_new(d, new, olds)
            if (spec.get("strategy") or {}).get("type") == "Recreate":
                await self._recreate(d, new, olds)
            else:
                await self._rolling(d, new, olds)
            await self._clean_history(d, olds)
        return await self._status(d, new, olds, created)

    # --- the new ReplicaSet ------------------------------------------------------------------

    async def _new_set(self, d: Obj, owned: list[Obj], olds: list[Obj]) -> Obj:
        spec = d["spec"]
        namespace = meta(d)["namespace"]
        collisions = int((d.get("status") or {}).get("collisionCount") or 0)
        revision = max((revision_of(rs) for rs in owned), default=0) + 1
        for _ in range(5):
            h = template_hash(spec["template"], collisions)
            template = copy.deepcopy(spec["template"])
            tmeta = template.setdefault("metadata", {})
            tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: h}
            selector = copy.deepcopy(spec["selector"])
            selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: h}
            want = int(spec.get("replicas", 1))
            if (spec.get("strategy") or {}).get("type") == "Recreate":
                start = 0 if any(replicas(rs) for rs in olds) else want
            else:
                start = self._surge_to(d, 0, olds)
            body: Obj = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{meta(d)['name']}-{h}",
                    "namespace": namespace,
                    "labels": dict(tmeta["labels"]),
                    "annotations": {
                        **self._copied_annotations(d),
                        REVISION: str(revision),
                        DESIRED: str(want),
                        MAX_REPLICAS: str(want + self._max_surge(d)),
                    },
                    "ownerReferences": [owner_ref(d)],
                },
                "spec": {
                    "replicas": start,
                    "minReadySeconds": int(spec.get("minReadySeconds") or 0),
                    "selector": selector,
                    "template": template,
                },
            }
            try:
                made = await self.client.create(REPLICASETS, namespace, body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                existing = await self.client.get(REPLICASETS, namespace, body["metadata"]["name"])
                ref = controller_of(existing) or {}
                if ref.get("uid") == meta(d)["uid"] and same_template(
                    existing["spec"].get("template") or {}, spec["template"]
                ):
                    self.sets.wrote(existing)
                    return existing
                collisions += 1  # another template has this hash: Kubernetes' collisionCount
                patched = await self.client.patch(
                    DEPLOYMENTS,
                    namespace,
                    meta(d)["name"],
                    {"status": {"collisionCount": collisions}},
                    sub="status",
                )
                self.deployments.wrote(patched)
                continue
            self.sets.wrote(made)
            log.info(
                "deployment %s/%s: created replica set %s (revision %d)",
                namespace,
                meta(d)["name"],
                meta(made)["name"],
                revision,
            )
            if start > 0:  # as Kubernetes says of a new set made at its size
                self._scaled(d, made, 0, start)
            await self._annotate(d, revision)
            return made
        raise RuntimeError(f"deployment {namespace}/{meta(d)['name']}: hash collisions")

    def _copied_annotations(self, d: Obj) -> dict[str, str]:
        return {k: v for k, v in (meta(d).get("annotations") or {}).items() if k not in NOT_COPIED}

    async def _mark_new(self, d: Obj, new: Obj, olds: list[Obj]) -> Obj:
        """The new ReplicaSet carries the latest revision (an undo makes an old one new again)
        and the Deployment's annotations; the Deployment names that revision."""
        top = max((revision_of(rs) for rs in olds), default=0)
        revision = revision_of(new)
        annotations = meta(new).get("annotations") or {}
        wanted = dict(annotations)
        if revision <= top:
            revision = top + 1
            wanted[REVISION] = str(revision)
        wanted.update(self._copied_annotations(d))
        want = int(d["spec"].get("replicas", 1))
        wanted[DESIRED] = str(want)
        wanted[MAX_REPLICAS] = str(want + self._max_surge(d))
        if wanted != annotations:
            new = await self._patch_set(new, {"metadata": {"annotations": wanted}})
        if (meta(d).get("annotations") or {}).get(REVISION) != str(revision):
            await self._annotate(d, revision)
        return new

    async def _annotate(self, d: Obj, revision: int) -> None:
        patched = await self.client.patch(
            DEPLOYMENTS,
            meta(d)["namespace"],
            meta(d)["name"],
            {"metadata": {"annotations": {REVISION: str(revision)}}},
        )
        self.deployments.wrote(patched)

    async def _patch_set(self, rs: Obj, patch: Obj) -> Obj:
        patched = await self.client.patch(
            REPLICASETS, meta(rs)["namespace"], meta(rs)["name"], patch
        )
        self.sets.wrote(patched)
        return patched

    async def _scale(self, d: Obj, rs: Obj, count: int) -> Obj:
        if replicas(rs) == count:
            return rs
        log.info(
            "deployment %s/%s: scaled replica set %s from %d to %d",
            meta(d)["namespace"],
            meta(d)["name"],
            meta(rs)["name"],
            replicas(rs),
            count,
        )
        patched = await self._patch_set(rs, {"spec": {"replicas": count}})
        self._scaled(d, rs, replicas(rs), count)
        return patched

    def _scaled(self, d: Obj, rs: Obj, before: int, after: int) -> None:
        way = "up" if after > before else "down"
        self.event(
            d,
            "Normal",
            "ScalingReplicaSet",
            f"Scaled {way} replica set {meta(rs)['name']} from {before} to {after}",
            kind="Deployment",
            api_version="apps/v1",
        )

    # --- RollingUpdate --------------------------------------------------------------------

    def _max_surge(self, d: Obj) -> int:
        strategy = d["spec"].get("strategy") or {}
        if strategy.get("type") == "Recreate":
            return 0
        rolling = strategy.get("rollingUpdate") or {}
        return resolve(
            rolling.get("maxSurge", "25%"), int(d["spec"].get("replicas", 1)), round_up=True
        )

    def _max_unavailable(self, d: Obj) -> int:
        strategy = d["spec"].get("strategy") or {}
        if strategy.get("type") == "Recreate":
            return 0
        rolling = strategy.get("rollingUpdate") or {}
        want = int(d["spec"].get("replicas", 1))
        unavailable = resolve(rolling.get("maxUnavailable", "25%"), want, round_up=False)
        if unavailable == 0 and self._max_surge(d) == 0:
            unavailable = 1
        return min(unavailable, want)

    def _surge_to(self, d: Obj, current_new: int, olds: list[Obj]) -> int:
        """How many replicas the new ReplicaSet may have now (NewRSNewReplicas)."""
        want = int(d["spec"].get("replicas", 1))
        if current_new >= want:
            return want
        total = current_new + sum(replicas(rs) for rs in olds)
        most = want + self._max_surge(d)
        if total >= most:
            return current_new
        return current_new + min(most - total, want - current_new)

    async def _rolling(self, d: Obj, new: Obj, olds: list[Obj]) -> None:
        want = int(d["spec"].get("replicas", 1))
        # scale the new one up (or down to the desired count)
        target = want if replicas(new) > want else self._surge_to(d, replicas(new), olds)
        new = await self._scale(d, new, target)
        old_count = sum(replicas(rs) for rs in olds)
        if old_count == 0:
            return
        all_count = old_count + replicas(new)
        min_available = want - self._max_unavailable(d)
        new_unavailable = replicas(new) - status_of(new, "availableReplicas")
        most_down = all_count - min_available - new_unavailable
        if most_down <= 0:
            return
        # first the old pods that are not available anyway
        cleaned = 0
        for i, rs in enumerate(olds):
            if cleaned >= most_down:
                break
            unhealthy = replicas(rs) - status_of(rs, "availableReplicas")
            if replicas(rs) == 0 or unhealthy <= 0:
                continue
            down = min(most_down - cleaned, unhealthy)
            olds[i] = await self._scale(d, rs, replicas(rs) - down)
            cleaned += down
        # then available ones, as far as minAvailable allows
        available = sum(status_of(rs, "availableReplicas") for rs in [*olds, new])
        allowed = available - min_available
        for i, rs in enumerate(olds):
            if allowed <= 0:
                break
            if replicas(rs) == 0:
                continue
            down = min(replicas(rs), allowed)
            olds[i] = await self._scale(d, rs, replicas(rs) - down)
            allowed -= down

    # --- Recreate -------------------------------------------------------------------------

    async def _recreate(self, d: Obj, new: Obj, olds: list[Obj]) -> None:
        for i, rs in enumerate(olds):
            olds[i] = await self._scale(d, rs, 0)
        for rs in olds:
            if any(
                (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                for p in self.pods.owned_by(meta(rs)["uid"])
            ):
                return  # the old pods are not all gone yet
        await self._scale(d, new, int(d["spec"].get("replicas", 1)))

    # --- history and status ---------------------------------------------------------------

    async def _clean_history(self, d: Obj, olds: list[Obj]) -> None:
        limit = d["spec"].get("revisionHistoryLimit")
        if limit is None:
            return
        idle = [
            rs
            for rs in olds
            if replicas(rs) == 0
            and status_of(rs, "replicas") == 0
            and not self.pods.owned_by(meta(rs)["uid"])
        ]
        idle.sort(key=revision_of)
        for rs in idle[: max(0, len(idle) - int(limit))]:
            gone = await self.client.delete(
                REPLICASETS, meta(rs)["namespace"], meta(rs)["name"], uid=meta(rs)["uid"]
            )
            self.sets.apply("DELETED", gone or rs)

    async def _status(
        self, d: Obj, new: Obj | None, olds: list[Obj], created: bool
    ) -> float | None:
        spec = d["spec"]
        want = int(spec.get("replicas", 1))
        sets = [*([new] if new is not None else []), *olds]
        available = sum(status_of(rs, "availableReplicas") for rs in sets)
        total = sum(status_of(rs, "replicas") for rs in sets)
        updated = status_of(new, "replicas") if new is not None else 0
        status: Obj = {
            "observedGeneration": meta(d).get("generation", 1),
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": sum(status_of(rs, "readyReplicas") for rs in sets),
            "availableReplicas": available,
            "unavailableReplicas": max(0, total - available)
            if total > want
            else max(0, want - available),
            "terminatingReplicas": sum(status_of(rs, "terminatingReplicas") for rs in sets),
        }
        old = d.get("status") or {}
        if old.get("collisionCount"):
            status["collisionCount"] = old["collisionCount"]
        at = now()
        conditions = {c["type"]: c for c in old.get("conditions") or []}
        if available >= want - self._max_unavailable(d):
            avail = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
        else:
            avail = (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        rs_name = meta(new)["name"] if new is not None else ""
        complete = (
            new is not None
            and updated == want
            and replicas(new) == want
            and status_of(new, "availableReplicas") == want
            and total == updated
        )
        counts_changed = any(
            old.get(k, 0) != status[k] for k in ("replicas", "updatedReplicas", "availableReplicas")
        )
        previous = conditions.get("Progressing") or {}
        again: float | None = None
        if spec.get("paused"):
            progress = ("Unknown", "DeploymentPaused", "Deployment is paused")
        elif complete:
            progress = (
                "True",
                "NewReplicaSetAvailable",
                f'ReplicaSet "{rs_name}" has successfully progressed.',
            )
        elif created:
            progress = ("True", "NewReplicaSetCreated", f'Created new replica set "{rs_name}"')
        elif previous.get("reason") == "ProgressDeadlineExceeded" and not counts_changed:
            progress = (previous["status"], previous["reason"], previous.get("message", ""))
        else:
            progress = ("True", "ReplicaSetUpdated", f'ReplicaSet "{rs_name}" is progressing.')
            deadline = spec.get("progressDeadlineSeconds")
            last = parse(previous.get("lastUpdateTime"))
            if (
                deadline
                and last is not None
                and not counts_changed
                and previous.get("reason")
                in (
                    "ReplicaSetUpdated",
                    "NewReplicaSetCreated",
                )
            ):
                left = float(deadline) - (at - last).total_seconds()
                if left <= 0:
                    progress = (
                        "False",
                        "ProgressDeadlineExceeded",
                        f'ReplicaSet "{rs_name}" has timed out progressing.',
                    )
                else:
                    again = left + 0.05
        status["conditions"] = [
            _condition(conditions.get("Available"), "Available", avail, at, touch=False),
            _condition(previous, "Progressing", progress, at, touch=counts_changed),
        ]
        if status != {k: old.get(k) for k in status} or any(
            k not in status for k in old if k != "conditions"
        ):
            patched = await self.client.patch(
                DEPLOYMENTS,
                meta(d)["namespace"],
                meta(d)["name"],
                {"status": status},
                sub="status",
            )
            self.deployments.wrote(patched)
        if status["unavailableReplicas"] and again is None:
            again = 5.0  # available pods are counted by the ReplicaSets; look again
        return again


def _condition(
    old: Obj | None, kind: str, value: tuple[str, str, str], at: datetime, *, touch: bool
) -> Obj:
    status, reason, message = value
    old = old or {}
    same = (old.get("status"), old.get("reason"), old.get("message")) == value
    return {
        "type": kind,
        "status": status,
        "lastUpdateTime": old.get("lastUpdateTime", stamp(at)) if same and not touch else stamp(at),
        "lastTransitionTime": old.get("lastTransitionTime", stamp(at))
        if old.get("status") == status
        else stamp(at),
        "reason": reason,
        "message": message,
    }
