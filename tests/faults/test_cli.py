"""`tessera gpu fault NODE GPU_INDEX` and `tessera gpu repair NODE GPU_INDEX` on the real
database (SQLite and PostgreSQL): the operator's way to report a fault and a repair."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import cli
from app.db.engine import Database
from app.db.models import Pod
from app.faults import service as faults
from app.inventory.service import GPUShare
from app.pods import service as pods
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create, gpu_node, in_pool, new_tenant


def tessera(database_url: str, data: Path, *args: str, grace: int = 30) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli,
        list(args),
        env={
            "TESSERA_DATA_DIR": str(data),
            "TESSERA_DATABASE_URL": database_url,
            "TESSERA_GPU_FAULT_GRACE_SECONDS": str(grace),
        },
    )
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout + result.stderr


def test_the_operator_reports_a_fault_and_a_repair(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    pool = unique("flc-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=2)
    create(
        db,
        ns,
        in_pool(pool, manifest("job", cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25)),
    )
    bound = db.write(
        lambda s: pods.bind(
            s,
            namespace=ns.name,
            name="job",
            node_name=node,
            gpus=[GPUShare(f"{node}-gpu1", 20480, 25)],
        )
    )
    db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))

    for args, words in (
        (("--kind", "xid"), "names its Xid"),
        (("--kind", "melted"), "supported values"),
        (("--kind", "xid", "--xid", "13"), "application error"),
    ):
        code, out = tessera(database_url, tmp_path, "gpu", "fault", node, "1", *args)
        assert code == 1 and words in out, out
    code, out = tessera(database_url, tmp_path, "gpu", "fault", node, "7", "--kind", "ecc")
    assert code == 1 and "has no GPU with index 7" in out
    assert db.read(lambda s: faults.get(s, name=f"{node}-gpu1"))["status"]["health"] == "Healthy"

    code, out = tessera(
        database_url, tmp_path, "gpu", "fault", node, "1", "--kind", "xid", "--xid", "79",
        "--message", "fell off the bus", grace=5,
    )  # fmt: skip
    assert code == 0 and "Unhealthy; 1 pod(s) on it stop in 5s" in out, out
    gpu = db.read(lambda s: faults.get(s, name=f"{node}-gpu1"))
    assert gpu["status"]["health"] == "Unhealthy"
    assert gpu["status"]["faults"][-1]["message"] == "fell off the bus"
    deadline = db.read(
        lambda s: s.scalar(
            select(Pod.disruption_deadline).where(Pod.uid == bound["metadata"]["uid"])
        )
    )
    assert 0 < (deadline - datetime.now(UTC)).total_seconds() <= 5  # the grace from the setting

    code, out = tessera(database_url, tmp_path, "gpu", "repair", node, "1")
    assert code == 0 and "Healthy and placeable again" in out
    gpu = db.read(lambda s: faults.get(s, name=f"{node}-gpu1"))
    assert gpu["status"]["health"] == "Healthy" and "taints" not in gpu["spec"]
