"""Why a request was not placed, in words a user can act on.

Three cases, checked in order against the snapshot as given:

1. some pod fits on no node at all: the filter's per-node reasons
   (``0/512 nodes are available: 300 insufficient tessera.io/gpu-memory, 12 cordoned.``);
2. a gang's pods each fit somewhere, but no domain of its required level (or no region) can
   hold all of them: say how close the roomiest domain comes;
3. it fits on its own, but the capacity went to other requests of the batch (higher priority,
   or more demand placed overall): it will be tried again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scheduler.jobs import Job
from scheduler.ledger import Ledger
from scheduler.plan import RequestStatus, Unschedulable
from scheduler.requests import PodRequest
from scheduler.snapshot import TopologyLevel

if TYPE_CHECKING:
    from scheduler.greedy import Context


def explain(ctx: Context, job: Job, pod: PodRequest | None = None) -> Unschedulable:
    """The reason one request (a gang, or one ``pod`` of a pod class) was not placed."""
    request = pod if pod is not None else job.requests[0]
    for group in job.groups:
        filt = ctx.filters[group.shape]
        if filt.fit_count == 0:
            prefix = ""
            if job.is_gang and len(job.groups) > 1:
                prefix = f"pod {group.pods[0].key} ({group.shape.describe()}): "
            return Unschedulable(
                request, RequestStatus.UNSCHEDULABLE, prefix + filt.message(), filt.reasons
            )

    if job.is_gang:
        reason = _gang_too_large(ctx, job)
        if reason is not None:
            return Unschedulable(request, RequestStatus.UNSCHEDULABLE, reason)

    fits = min(ctx.filters[g.shape].fit_count for g in job.groups)
    text = (
        f"fits on {fits}/{ctx.cycle.n_nodes} nodes on its own, but other requests in this batch "
        "(higher priority, or more demand placed overall) took that capacity; it stays pending"
    )
    return Unschedulable(request, RequestStatus.UNSCHEDULABLE, text)


def _gang_too_large(ctx: Context, job: Job) -> str | None:
    cycle = ctx.cycle
    ledger = Ledger(cycle)
    primary = job.groups[0]
    within_domain = job.required in (TopologyLevel.GPU, TopologyLevel.NVLINK)
    cap = ledger.node_capacity(ctx.filters[primary.shape], per_domain=within_domain)
    need = primary.count
    what = f"{need} pods of {primary.shape.describe()}"
    total = int(cap.sum())
    if total < need:
        return f"gang needs {what}; all available nodes together hold only {total}"
    level = job.required if job.required is not None else TopologyLevel.REGION
    level = max(level, TopologyLevel.NODE)
    ids = cycle.node_domain[level]
    per_domain = np.bincount(ids, weights=cap, minlength=cycle.domain_count[level])
    best = int(per_domain.max(initial=0))
    if best < need:
        scope = level.label if not within_domain else TopologyLevel.NVLINK.label
        return f"gang needs {what} within one {scope}; the roomiest {scope} holds only {best}"
    return None
