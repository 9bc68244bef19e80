"""The `tessera` command line as a newcomer meets it: what it imports, and what it says when it
is pointed at no database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli

TESSERA = str(Path(sys.executable).parent / "tessera")


def test_help_lists_bench() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output


def test_everyday_commands_import_neither_the_benchmarks_nor_the_web_framework() -> None:
    """`tessera --help`, `tessera tenant create` and the report commands load the CLI and the
    database layer only: the benchmarks (the solver, OR-Tools) cost seconds, and the production
    image ships none; the registry's kinds and the pod schemas (a third of a second of pydantic
    models) are the API's, loaded on its first authorization decision, not on import."""
    probe = (
        "import sys, app.cli, app.db.engine, app.auth.service, app.billing_cli; "
        "print(sorted({m for m in sys.modules if m.split('.')[0] in "
        "{'bench', 'ortools', 'fastapi', 'scheduler', 'matplotlib', 'numpy'} "
        "or m in {'app.registry.kinds', 'app.kube.resources', 'app.pods.schemas'}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_bench_is_still_a_command() -> None:
    done = subprocess.run([TESSERA, "bench", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "burst" in done.stdout and "openb" in done.stdout


def _run(cwd: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return subprocess.run(
        [TESSERA, *args],
        cwd=cwd,
        env={**clean, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_pointed_at_no_database_says_so_and_creates_nothing(tmp_path: Path) -> None:
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    done = _run(elsewhere, home, "tenant", "create", "acme")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"there is no database in {elsewhere / '.tessera'}" in done.stderr
    assert "TESSERA_DATA_DIR" in done.stderr
    assert list(elsewhere.iterdir()) == []  # no stray .tessera/

    # A database without Tessera's schema (an empty SQLite file): named as such.
    (elsewhere / ".tessera").mkdir()
    (elsewhere / ".tessera" / "tessera.db").touch()
    done = _run(elsewhere, home, "tenant", "list")
    assert done.returncode == 1 and "holds no Tessera schema" in done.stderr

    # A server running here (its record in the user's list of running servers): the message
    # names its data directory, with which the command then works.
    data = tmp_path / "served" / ".tessera"
    migrated = _run(tmp_path, home, "migrate", TESSERA_DATA_DIR=str(data))
    assert migrated.returncode == 0, migrated.stderr
    servers = home / ".local" / "state" / "tessera" / "servers"
    servers.mkdir(parents=True)
    record = {"url": "https://127.0.0.1:9443", "pid": os.getpid(), "dataDir": str(data)}
    (servers / f"{os.getpid()}.json").write_text(json.dumps(record))
    done = _run(elsewhere, home, "tenant", "list")
    assert done.returncode == 1
    assert f"https://127.0.0.1:9443  TESSERA_DATA_DIR={data}" in done.stderr
    created = _run(elsewhere, home, "tenant", "create", "acme", TESSERA_DATA_DIR=str(data))
    assert created.returncode == 0, created.stderr
    # The record of a process that is gone is dropped, not shown.
    (servers / "gone.json").write_text(json.dumps({**record, "pid": 4_194_303}))
    assert "9443" in _run(elsewhere, home, "tenant", "list").stderr
    assert not (servers / "gone.json").exists()


def test_usage_rated_at_zero_for_want_of_a_price_list_is_said_so(tmp_path: Path) -> None:
    """A new installation without a price list rates usage at 0: `tessera usage` says why on
    stderr, and says nothing once the usage it shows was rated by a price list."""
    import time

    from app.bootstrap import bootstrap, seed_prices
    from app.db.engine import Database
    from app.db.migrate import upgrade
    from app.inventory import service as inventory
    from app.pods import service as pods
    from app.settings import Settings
    from tests.factories import pod
    from tests.scheduler.test_loop import create, new_tenant

    url = f"sqlite:///{tmp_path / 'tessera.db'}"
    upgrade(url)
    db = Database(url)
    bootstrap(db)
    spec = inventory.NodeSpec(
        name="n1", cpu_milli=64_000, memory_mib=256 * 1024, compute_classes=("general-purpose",)
    )
    db.write(lambda s: inventory.create_node(s, spec))

    def running_pod() -> str:
        ns = new_tenant(db)
        create(db, ns, pod("p", cpu="1", memory="1Gi"))
        db.write(lambda s: pods.bind(s, namespace=ns.name, name="p", node_name="n1", gpus=[]))
        return ns.name

    def usage(tenant: str, *output: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                TESSERA,
                "usage",
                "--tenant",
                tenant,
                "--granularity",
                "second",
                *(output or ("-o", "json")),
            ],
            env={**os.environ, "TESSERA_DATA_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    unpriced = running_pod()
    time.sleep(1.2)
    done = usage(unpriced)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"]["amount"] == "0.000000"
    assert "no price list is in effect: all usage here is rated at 0 USD" in done.stderr
    assert "kubectl create -f" in done.stderr

    settings = Settings(data_dir=tmp_path)
    assert seed_prices(db, settings, Path(__file__).parents[1] / "examples/demo-price.yaml")
    time.sleep(1.1)  # the price is in effect from its whole second on
    priced = running_pod()
    time.sleep(1.2)
    done = usage(priced)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert float(document["total"]["amount"]) > 0
    assert "warning" not in done.stderr
    # The table: a title, upper-case column names with their units, a row per bucket, the total.
    to = ("--to", document["to"])  # the same period: the pod is still running
    document = json.loads(usage(priced, *to, "-o", "json").stdout)
    table = usage(priced, *to, "--group-by", "namespace").stdout.splitlines()
    assert table[0].startswith("Usage ") and table[0].endswith("UTC by second")
    assert table[1].split()[:3] == ["START", "NAMESPACE", "VCPU"] and "(vCPU-s)" in table[1]
    assert table[2].split()[2] == priced
    assert table[-2].split() == ["Total", document["total"]["amount"]]
    assert table[-1] == "quantities in unit-seconds; amounts in USD at list price"
    # The first tenant's usage from before the price list is still unrated, and said so.
    assert "usage before it is rated at 0" in usage(unpriced).stderr
    db.dispose()


def test_the_controller_manager_started_before_the_api_waits_for_its_ca(tmp_path: Path) -> None:
    """`tessera controllers --issue-token` started beside `tessera serve` (compose, the
    benchmarks) may come up before the API has made its CA in the shared data directory: it
    waits for it, then writes credentials that carry it, instead of exiting."""
    import time

    from app.tls import ensure_tls

    data = tmp_path / "data"
    env = {"TESSERA_DATA_DIR": str(data), "TESSERA_DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    assert _run(tmp_path, tmp_path, "migrate", **env).returncode == 0
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    log = (tmp_path / "controllers.log").open("w")
    manager = subprocess.Popen(
        [TESSERA, "controllers", "--issue-token"],
        env={**clean, "HOME": str(tmp_path), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    kubeconfig = data / "kubeconfig-controllers"
    try:
        deadline = time.monotonic() + 60
        while (
            "waiting for the API's CA certificate" not in (tmp_path / "controllers.log").read_text()
        ):
            assert manager.poll() is None, (tmp_path / "controllers.log").read_text()
            assert time.monotonic() < deadline, "it never said it waits"
            time.sleep(0.1)
        assert manager.poll() is None and not kubeconfig.exists()
        tls = ensure_tls(data / "tls", ["127.0.0.1"])
        while not kubeconfig.exists():
            assert manager.poll() is None, (tmp_path / "controllers.log").read_text()
            assert time.monotonic() < deadline, "no credentials written once the CA was there"
            time.sleep(0.1)
        import base64

        import yaml

        written = yaml.safe_load(kubeconfig.read_text())
        ca_data = written["clusters"][0]["cluster"]["certificate-authority-data"]
        assert base64.b64decode(ca_data) == tls.ca_cert.read_bytes()
    finally:
        manager.kill()
        manager.wait(timeout=10)
        log.close()
