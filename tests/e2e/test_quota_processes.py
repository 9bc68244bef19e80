"""A count quota is exact when the creates that race for it are served by several API processes
(`tessera serve --workers 2`; pods and tenant quotas: tests/e2e/test_quotas.py): on PostgreSQL no lock is shared by every writer, so a check
locks the quotas it counts against (app/quotas/service.py) and concurrent checks of one
namespace or tenant run one after the other, in whichever process."""

from __future__ import annotations

from tests.conftest import unique
from tests.e2e.conftest import Process, race_creates


def test_count_quota_races_on_several_workers_admit_exactly_the_room(two_workers: Process) -> None:
    """`count/configmaps` (a registry kind's count) raced over two API processes."""
    tenant = unique("qp")
    two_workers.create_tenant(tenant)
    token = two_workers.tenant_token(tenant)
    with two_workers.admin() as admin:
        made = admin.post(
            f"/api/v1/namespaces/{tenant}/resourcequotas",
            json={"metadata": {"name": "maps"}, "spec": {"hard": {"count/configmaps": "5"}}},
        )
        assert made.status_code == 201, made.text
    path = f"/api/v1/namespaces/{tenant}/configmaps"
    maps = [(path, {"metadata": {"name": f"c-{i}"}, "data": {"k": "v"}}) for i in range(30)]
    assert race_creates(two_workers, token, maps) == ([201] * 5 + [403] * 25)
    with two_workers.admin() as admin:
        listed = admin.get(f"/api/v1/namespaces/{tenant}/configmaps").json()["items"]
    assert len(listed) == 5
