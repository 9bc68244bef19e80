"""`tessera inventory load`: the topology YAML and the openb node list, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from app.db.engine import Database
from app.inventory.loader import InventoryError, read_file
from tests.conftest import unique

ROOT = Path(__file__).resolve().parents[2]
TESSERA = str(Path(sys.executable).with_name("tessera"))
OPENB = ROOT.parent / "shared" / "traces" / "openb" / "openb_node_list_gpu_node.csv"


def load(database_url: str, path: Path, tmp_path: Path) -> str:
    env = {**os.environ, "TESSERA_DATABASE_URL": database_url, "TESSERA_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [TESSERA, "inventory", "load", str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_pool_topology(tmp_path: Path) -> None:
    _, nodes = read_file(ROOT / "examples" / "demo-pool.yaml")
    gpu_nodes = [n for n in nodes if n.gpus]
    assert len(gpu_nodes) == 64 and sum(len(n.gpus) for n in nodes) == 512
    assert {n.zone for n in gpu_nodes} == {"eu-west-a", "eu-west-b"}
    assert len({(n.zone, n.rack) for n in gpu_nodes}) == 8
    assert all(
        len({g.nvlink_domain for g in n.gpus}) == 1 for n in gpu_nodes
    )  # NVLink domains of 8
    assert {g.numa_node for g in gpu_nodes[0].gpus} == {0, 1}


def test_openb_node_list_loads_and_reloading_keeps_what_exists(
    database_url: str, tmp_path: Path
) -> None:
    prefix = unique("ob")
    sample = tmp_path / "nodes.csv"
    rows = [f"{prefix}-{i},96000,393216,8,G2" for i in range(3)] + [
        f"{prefix}-t4,104000,524288,2,T4"
    ]
    sample.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(rows) + "\n")
    assert "4 nodes (26 GPUs) added, 0 already present" in load(database_url, sample, tmp_path)
    assert "0 nodes (0 GPUs) added, 4 already present" in load(database_url, sample, tmp_path)
    db = Database(database_url)
    try:
        models = db.read(
            lambda s: dict(
                s.execute(
                    text(
                        "SELECT model, count(*) FROM gpu_devices WHERE node_name LIKE :p GROUP BY model"
                    ),
                    {"p": f"{prefix}-%"},
                ).all()
            )
        )
    finally:
        db.dispose()
    assert models == {"G2": 24, "T4": 2}


@pytest.mark.skipif(not OPENB.exists(), reason="the openb trace is not next to the repository")
def test_the_published_openb_cluster() -> None:
    _, nodes = read_file(OPENB)
    assert len(nodes) == 1213 and sum(len(n.gpus) for n in nodes) == 6212


def test_bad_inventory_says_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodeClasses: {}\nregions: []\n")
    with pytest.raises(InventoryError, match="nodeClasses is missing or empty"):
        read_file(bad)
    csv = tmp_path / "bad.csv"
    csv.write_text("sn,cpu\nx,1\n")
    with pytest.raises(InventoryError, match="expected the columns"):
        read_file(csv)
