"""The kinds the registry keeps, each a strategy (app/registry/strategy.py).

`KINDS` is the one list the rest of Tessera reads them from: discovery and the authorization
rules (app/kube/resources.py), the routes (app/registry/router.py), `kubectl get`'s columns and a
namespace's deletion (app/registry/store.py). Adding a kind is adding its strategy here.
"""

from __future__ import annotations

from app.kube.tables import PRINTERS
from app.quotas import service as quotas
from app.registry.kinds.apps import DeploymentStrategyKind, ReplicaSetStrategy
from app.registry.kinds.callbacks import CallbackStrategy
from app.registry.kinds.commitments import CommitmentStrategy
from app.registry.kinds.configmaps import ConfigMapStrategy
from app.registry.kinds.cronjobs import CronJobStrategy
from app.registry.kinds.jobs import JobStrategy
from app.registry.kinds.jobsets import JobSetStrategy
from app.registry.kinds.leases import LeaseStrategy
from app.registry.kinds.podgroups import CoschedulingPodGroupStrategy, PodGroupStrategy
from app.registry.kinds.resourcequotas import ResourceQuotaStrategy
from app.registry.kinds.secrets import SecretStrategy
from app.registry.kinds.services import EndpointSliceStrategy, ServiceStrategy
from app.registry.strategy import Strategy

KINDS: tuple[Strategy, ...] = (
    ConfigMapStrategy(),
    SecretStrategy(),
    ResourceQuotaStrategy(),
    ServiceStrategy(),
    EndpointSliceStrategy(),
    ReplicaSetStrategy(),
    DeploymentStrategyKind(),
    JobStrategy(),
    CronJobStrategy(),
    JobSetStrategy(),
    CallbackStrategy(),
    PodGroupStrategy(),
    CoschedulingPodGroupStrategy(),
    CommitmentStrategy(),
    LeaseStrategy(),
)

for _kind in KINDS:  # `kubectl get` prints each kind with its own columns
    PRINTERS[_kind.log_kind] = (_kind.columns, _kind.row)

# `count/<resource>` in a ResourceQuota, for every namespaced kind the registry's one table keeps
quotas.count_kinds(k for k in KINDS if k.table is None)
