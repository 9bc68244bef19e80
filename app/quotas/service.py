"""What a namespace's pods use against its `v1 ResourceQuota`s, and the admission check.

A quota counts what each live pod was *sold* (its spec after rounding, and its GPUs or GPU
slice), not what it asked: Tessera gives a pod its whole sold spec, so its requests and its
limits are the same amount. A pod that ended (Succeeded or Failed) counts for nothing; a pod
with a resize waiting for room counts the larger of what it holds and what it waits for.

The check runs in the write transaction of the create or resize it guards, and the checks of
one quota run one after the other: SQLite has one writer; on PostgreSQL a check first locks the
rows of the quotas it counts against (the namespace's ResourceQuotas, in name order, then the
tenant's row when the tenant has a quota of its own), so a concurrent create of the same
namespace or tenant, in any process, waits for this transaction to end and then counts what it
added. (Namespaces without a quota take no lock.) The API runs concurrent creates of one
process in one transaction whose new pods are inserted as it commits, so the count is the
committed pods plus the pods queued earlier in the same transaction (`insert_unique`'s queue,
which drops a failed write's rows): exact however many creates race.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from app.constants import GPU, GPU_CORE, GPU_MEMORY
from app.db.engine import kind_writes, locked_reads
from app.db.models import Pod as PodRow
from app.db.models import StoredObject, Tenant, table
from app.errors import Cause, Forbidden, ResourceRef
from app.kube.quantity import MIB, QuantityError, format_cpu, format_mib, parse_quantity

pods_t = table(PodRow)
objects_t = table(StoredObject)
tenants_t = table(Tenant)

TERMINAL_PHASES = ("Succeeded", "Failed")
QUOTA_KIND = "ResourceQuota"  # as the change log names it

# What each key of `spec.hard` limits: one of the amounts below.
CPU, MEMORY, GPUS, GPU_MIB, GPU_PCT, PODS = (
    "cpu",
    "memory",
    "gpus",
    "gpu_memory",
    "gpu_core",
    "pods",
)
KEYS: dict[str, str] = {
    "cpu": CPU,
    "requests.cpu": CPU,
    "limits.cpu": CPU,
    "memory": MEMORY,
    "requests.memory": MEMORY,
    "limits.memory": MEMORY,
    GPU: GPUS,
    f"requests.{GPU}": GPUS,
    GPU_MEMORY: GPU_MIB,
    f"requests.{GPU_MEMORY}": GPU_MIB,
    GPU_CORE: GPU_PCT,
    f"requests.{GPU_CORE}": GPU_PCT,
    "pods": PODS,
    "count/pods": PODS,
}
WHOLE = frozenset({GPUS, GPU_PCT, PODS})  # counted in whole units
# `count/<resource>` (`count/<resource>.<group>` outside the core group) for every namespaced
# kind the registry keeps: its objects in the namespace, as Kubernetes' object-count quota.
# Filled from the registry's KINDS (app/registry/kinds), so a new kind is counted for free.
COUNTS: dict[str, tuple[str, str]] = {}
MAX_HARD = Decimal(2**53)  # far above any pool, and exact in every client


@dataclass(frozen=True)
class Usage:
    """Amounts in the units pods are kept in: millicores, MiB, GPUs, MiB, percent, pods."""

    cpu: int = 0
    memory: int = 0
    gpus: int = 0
    gpu_memory: int = 0
    gpu_core: int = 0
    pods: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(self.amounts(), other.amounts(), strict=True)))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(*(a - b for a, b in zip(self.amounts(), other.amounts(), strict=True)))

    def amounts(self) -> tuple[int, ...]:
        return (self.cpu, self.memory, self.gpus, self.gpu_memory, self.gpu_core, self.pods)

    def of(self, amount: str) -> int:
        value: int = getattr(self, amount)
        return value


def of_pod(pod: Mapping[str, Any], *, count: int = 1) -> Usage:
    """What one pod row counts for (nothing once it has ended)."""
    if pod.get("phase") in TERMINAL_PHASES:
        return Usage()
    return Usage(
        cpu=max(pod["cpu_milli"], pod.get("resize_cpu_milli") or 0),
        memory=max(pod["memory_mib"], pod.get("resize_memory_mib") or 0),
        gpus=pod.get("gpu_count") or 0,
        gpu_memory=pod.get("gpu_memory_mib") or 0,
        gpu_core=pod.get("gpu_core_pct") or 0,
        pods=count,
    )


def shown(amount: str, value: int) -> str:
    """An amount as a quantity, as Kubernetes writes it: `1500m`, `4Gi`, `2`."""
    if amount == CPU:
        return format_cpu(value)
    if amount in (MEMORY, GPU_MIB):
        return format_mib(value)
    return str(value)


def plain(amount: str, value: int) -> Decimal:
    """An amount in the units of a quantity: cores, bytes, a count."""
    if amount == CPU:
        return Decimal(value) / 1000
    if amount in (MEMORY, GPU_MIB):
        return Decimal(value) * MIB
    return Decimal(value)


# --- the quota object ---------------------------------------------------------------------


def count_kinds(kinds: Iterable[Any]) -> None:
    """Make `count/<resource>` a quota key of each namespaced kind in `kinds` (strategies)."""
    for kind in kinds:
        if kind.namespaced:
            COUNTS[count_key(kind.group, kind.resource)] = (kind.group, kind.resource)


def count_key(group: str, resource: str) -> str:
    return f"count/{resource}" + (f".{group}" if group else "")


def known_keys() -> list[str]:
    return [*KEYS, *COUNTS]


def hard_causes(hard: Any) -> list[Cause]:
    """What is wrong with a `spec.hard`: unknown keys (the known ones listed), and quantities
    that do not parse, are negative, too large, or fractional where whole units are counted."""
    if hard is None:
        return []
    if not isinstance(hard, dict):
        return [Cause("spec.hard", "Invalid value: must be a map of resource names to quantities")]
    causes = []
    for key, value in hard.items():
        path = f"spec.hard[{str(key)[:64]}]"
        amount = KEYS.get(key) or (PODS if key in COUNTS else None)
        if amount is None:
            causes.append(
                Cause(
                    path,
                    f'Unsupported value: "{str(key)[:64]}": a quota limits '
                    f"{', '.join(known_keys())}",
                    "FieldValueNotSupported",
                )
            )
            continue
        try:
            number = parse_quantity(value)
        except QuantityError as exc:
            causes.append(Cause(path, f"Invalid value: {exc}"))
            continue
        if number < 0:
            causes.append(
                Cause(path, f'Invalid value: "{value}": must be greater than or equal to 0')
            )
        elif number > MAX_HARD:
            causes.append(Cause(path, f'Invalid value: "{value}": must be at most {MAX_HARD}'))
        elif amount in WHOLE and number != number.to_integral_value():
            causes.append(Cause(path, f'Invalid value: "{value}": must be a whole number'))
    return causes


def quotas_of(session: Session, namespace: str, *, lock: bool = False) -> list[dict[str, Any]]:
    """The namespace's quotas as stored: [{"name": ..., "hard": {...}}]. `lock`: their rows stay
    locked until the transaction ends (a check: see the module's note), and are read once per
    transaction (a batch of creates is one), again only after it wrote a ResourceQuota."""
    if lock:
        cache = locked_reads(session, "resourcequotas")
        writes = kind_writes(session, QUOTA_KIND)
        cached = cache.get(namespace)
        if cached is not None and cached[0] == writes:
            found: list[dict[str, Any]] = cached[1]
            return found
        cache[namespace] = (writes, quotas := _quotas_of(session, namespace, lock=True))
        return quotas
    return _quotas_of(session, namespace, lock=False)


def _quotas_of(session: Session, namespace: str, *, lock: bool) -> list[dict[str, Any]]:
    query = (
        select(objects_t.c.name, objects_t.c.body)
        .where(
            and_(
                objects_t.c.api_group == "",
                objects_t.c.resource == "resourcequotas",
                objects_t.c.namespace == namespace,
            )
        )
        .order_by(objects_t.c.name)
    )
    if lock:
        query = query.with_for_update()
    rows = session.execute(query).all()
    return [
        {"name": name, "hard": (body.get("spec") or {}).get("hard") or {}} for name, body in rows
    ]


def tenant_row(session: Session, tenant_id: int) -> tuple[str, dict[str, Any] | None] | None:
    """(name, spec) of a tenant, read once per transaction (a burst of creates is one)."""
    cache = session.info.setdefault("tenant_specs", {})
    if tenant_id not in cache:
        row = session.execute(
            select(tenants_t.c.name, tenants_t.c.spec).where(tenants_t.c.id == tenant_id)
        ).first()
        cache[tenant_id] = (row[0], row[1]) if row is not None else None
    found: tuple[str, dict[str, Any] | None] | None = cache[tenant_id]
    return found


def tenant_quota(session: Session, tenant_id: int | None) -> tuple[str, dict[str, Any]] | None:
    """The tenant's own quota (`spec.quota.hard` of its Tenant object): (tenant name, hard), or
    None when the admin set none."""
    row = tenant_row(session, tenant_id) if tenant_id is not None else None
    if row is None:
        return None
    hard = ((row[1] or {}).get("quota") or {}).get("hard")
    return (row[0], hard) if hard else None


def _lock_tenant(session: Session, tenant_id: int | None) -> None:
    """Hold the tenant's row until the transaction ends: its quota's checks, one at a time."""
    locked = locked_reads(session, "tenants")
    if tenant_id is not None and tenant_id not in locked:
        session.execute(select(tenants_t.c.id).where(tenants_t.c.id == tenant_id).with_for_update())
        locked[tenant_id] = True


def used(session: Session, namespace: str | None = None, *, tenant_id: int | None = None) -> Usage:
    """What the live pods of a namespace (or of all a tenant's namespaces) count for: the
    committed ones and those this transaction queued."""
    live = pods_t.c.phase.notin_(TERMINAL_PHASES)
    scope = (
        pods_t.c.namespace == namespace
        if namespace is not None
        else (pods_t.c.tenant_id == tenant_id)
    )
    row = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(_larger(pods_t.c.cpu_milli, pods_t.c.resize_cpu_milli)), 0),
            func.coalesce(func.sum(_larger(pods_t.c.memory_mib, pods_t.c.resize_memory_mib)), 0),
            func.coalesce(func.sum(pods_t.c.gpu_count), 0),
            func.coalesce(func.sum(pods_t.c.gpu_memory_mib), 0),
            func.coalesce(func.sum(pods_t.c.gpu_core_pct), 0),
        ).where(scope, live)
    ).one()
    count, cpu, memory, gpus, gpu_memory, gpu_core = (int(v) for v in row)
    total = Usage(cpu, memory, gpus, gpu_memory, gpu_core, count)
    queued = _queued(session, namespace=namespace, tenant_id=tenant_id)
    return total + sum((of_pod(p) for p in queued), Usage())


def counted(
    session: Session, key: str, namespace: str | None = None, *, tenant_id: int | None = None
) -> int:
    """How many objects of the kind of `count/<kind>` key `key` a namespace (or a tenant)
    holds; registry objects are inserted as they are created, so this transaction's count."""
    group, resource = COUNTS[key]
    scope = (
        objects_t.c.namespace == namespace
        if namespace is not None
        else (objects_t.c.tenant_id == tenant_id)
    )
    query = (
        select(func.count())
        .select_from(objects_t)
        .where(objects_t.c.api_group == group, objects_t.c.resource == resource, scope)
    )
    return int(session.scalar(query) or 0)


def _larger(held: Any, waiting: Any) -> Any:
    """What a pod holds, or the resize it waits for when that is larger (both dialects)."""
    return case((waiting > held, waiting), else_=held)


def _queued(
    session: Session, *, namespace: str | None, tenant_id: int | None
) -> Iterable[Mapping[str, Any]]:
    """The pods of `namespace` (or of the tenant) this transaction has queued and not
    inserted yet."""
    queued = session.info.get("unique_inserts") or []
    for target, row, _ in queued[session.info.get("unique_flushed", 0) :]:
        if target is pods_t and (
            row["namespace"] == namespace
            if namespace is not None
            else row["tenant_id"] == tenant_id
        ):
            yield row


def _over(
    hard: Mapping[str, Any], current: Usage, adds: Usage, amounts: Mapping[str, str] = KEYS
) -> list[tuple[str, str, str]]:
    """The keys of `hard` that `adds` would take past their limit: (key, amount, limit)."""
    over = []
    for key, limit in sorted(hard.items()):
        amount = amounts.get(key)
        if amount is None or adds.of(amount) <= 0:
            continue
        try:
            limited = parse_quantity(limit)
        except QuantityError:  # pragma: no cover - refused when the quota was written
            continue
        if plain(amount, current.of(amount) + adds.of(amount)) > limited:
            over.append((key, amount, str(limit).strip()))
    return over


def _refusal(
    what: str, quota: str, over: list[tuple[str, str, str]], current: Usage, adds: Usage
) -> str:
    requested = ",".join(f"{k}={shown(a, adds.of(a))}" for k, a, _ in over)
    in_use = ",".join(f"{k}={shown(a, current.of(a))}" for k, a, _ in over)
    limited = ",".join(f"{k}={h}" for k, _, h in over)
    return (
        f"{what} is forbidden: exceeded quota: {quota}, requested: {requested}, used: "
        f"{in_use}, limited: {limited}"
    )


def tenant_quota_name(tenant: str) -> str:
    """How a refusal names a tenant's own quota (it is no object of a namespace)."""
    return f"tenant/{tenant}"


def check(
    session: Session,
    *,
    namespace: str,
    pod: str,
    adds: Usage,
    verb: str = "create",
    tenant_id: int | None = None,
) -> None:
    """Raise Forbidden, in Kubernetes' words, when `adds` (what a create brings, or what a
    resize adds) would take the namespace past any of its quotas' hard limits, or the tenant
    past its own quota (across all its namespaces)."""
    what = f'pods "{pod}"'
    quotas = quotas_of(session, namespace, lock=True)
    if quotas:
        current = used(session, namespace)
        for quota in sorted(quotas, key=lambda q: q["name"]):
            over = _over(quota["hard"], current, adds)
            if over:
                raise Forbidden(
                    _refusal(what, quota["name"], over, current, adds),
                    ref=ResourceRef("pods", pod),
                )
    own = tenant_quota(session, tenant_id)
    if own is not None and any(KEYS.get(k) for k in own[1]):
        _lock_tenant(session, tenant_id)
        current = used(session, tenant_id=tenant_id)
        over = _over(own[1], current, adds)
        if over:
            raise Forbidden(
                _refusal(what, tenant_quota_name(own[0]), over, current, adds),
                ref=ResourceRef("pods", pod),
            )


def check_count(
    session: Session,
    *,
    namespace: str,
    tenant_id: int | None,
    group: str,
    resource: str,
    name: str,
) -> None:
    """Raise Forbidden when one more object of (group, resource) would pass a `count/<kind>`
    limit of the namespace's quotas or of its tenant's. Called in the create's transaction;
    the quotas' rows are locked first (so concurrent creates are counted one after the other)."""
    key = count_key(group, resource)
    if key not in COUNTS:
        return
    what = f'{resource}{"." + group if group else ""} "{name}"'
    one = Usage(pods=1)
    for quota in quotas_of(session, namespace, lock=True):
        if key in quota["hard"]:
            current = Usage(pods=counted(session, key, namespace))
            over = _over({key: quota["hard"][key]}, current, one, {key: PODS})
            if over:
                raise Forbidden(
                    _refusal(what, quota["name"], over, current, one),
                    ref=ResourceRef(resource, name, group),
                )
    own = tenant_quota(session, tenant_id)
    if own is not None and key in own[1]:
        _lock_tenant(session, tenant_id)
        current = Usage(pods=counted(session, key, tenant_id=tenant_id))
        over = _over({key: own[1][key]}, current, one, {key: PODS})
        if over:
            raise Forbidden(
                _refusal(what, tenant_quota_name(own[0]), over, current, one),
                ref=ResourceRef(resource, name, group),
            )


def _used_of(
    hard: Mapping[str, Any], session: Session, namespace: str | None, tenant_id: int | None
) -> dict[str, str]:
    current = used(session, namespace, tenant_id=tenant_id)
    out = {}
    for key in hard:
        if key in KEYS:
            out[key] = shown(KEYS[key], current.of(KEYS[key]))
        elif key in COUNTS:
            out[key] = str(counted(session, key, namespace, tenant_id=tenant_id))
    return out


def status(session: Session, obj: dict[str, Any]) -> None:
    """Fill a quota's `status` (in place): `hard` as its spec says, `used` what the
    namespace's live pods (and its objects, for `count/<kind>`) count for now (computed as
    it is read)."""
    hard = dict((obj.get("spec") or {}).get("hard") or {})
    obj["status"] = {
        "hard": hard,
        "used": _used_of(hard, session, obj["metadata"]["namespace"], None),
    }


def tenant_status(session: Session, tenant_id: int, hard: Mapping[str, Any]) -> dict[str, Any]:
    """A tenant quota's status: `hard`, and `used` across all the tenant's namespaces."""
    return {"hard": dict(hard), "used": _used_of(hard, session, None, tenant_id)}
