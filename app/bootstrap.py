"""First start: system namespaces, and for `tessera dev` a demo pool, tenant and kubeconfigs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import func, select

from app.auth import service as auth
from app.billing_api import service as billing
from app.constants import LABEL_RUNTIME
from app.db.engine import Database
from app.db.models import Node, PriceVersion, Tenant
from app.errors import Unauthorized
from app.inventory import loader
from app.kubeconfig import build, write
from app.namespaces.service import ensure_system_namespaces
from app.settings import Settings

DEMO_POOL = Path(__file__).resolve().parents[1] / "examples" / "demo-pool.yaml"
DEMO_PRICE = DEMO_POOL.with_name("demo-price.yaml")
DEMO_TENANT = "demo"


@dataclass(frozen=True)
class Credentials:
    name: str
    token: str
    kubeconfig: Path


def bootstrap(db: Database) -> None:
    db.write(ensure_system_namespaces)


def seed_demo(db: Database, settings: Settings, ca_cert: Path) -> list[Credentials]:
    """Load the demo pool, price list and tenant once; (re)issue kubeconfigs whose token no
    longer works."""
    if (
        db.read(lambda s: s.scalar(select(func.count()).select_from(Node))) == 0
        and DEMO_POOL.exists()
    ):
        db.write(lambda s: loader.load(s, DEMO_POOL))
    if (
        db.read(lambda s: s.scalar(select(func.count()).select_from(PriceVersion))) == 0
        and DEMO_PRICE.exists()
    ):
        _seed_price(db, settings)
    if db.read(lambda s: s.scalar(select(Tenant.id).where(Tenant.name == DEMO_TENANT))) is None:
        db.write(lambda s: auth.create_tenant(s, name=DEMO_TENANT))
    return [
        _credentials(db, settings, ca_cert, "admin", None),
        _credentials(db, settings, ca_cert, DEMO_TENANT, DEMO_TENANT),
    ]


def virtual_nodes_path(settings: Settings) -> Path:
    return settings.data_dir / "virtual-nodes.yaml"


def seed_node_tokens(
    db: Database,
    settings: Settings,
    ca_cert: Path,
    *,
    path: Path | None = None,
    virtual_only: bool = False,
) -> Path:
    """A node token for every node of the pool, written with the server's URL and CA to the
    inventory `tessera agent --virtual` reads (once; again when its tokens stop working).
    `virtual_only`: not the nodes labelled for another runtime, whose own agent acts for them
    (the compose stack's host node): two agents would act for one node."""
    from agent.main import Inventory, NodeEntry, load_inventory, write_inventory

    path = path or virtual_nodes_path(settings)
    rows = db.read(lambda s: s.execute(select(Node.name, Node.labels).order_by(Node.name)).all())
    names = [
        name
        for name, labels in rows
        if not virtual_only or (labels or {}).get(LABEL_RUNTIME, "virtual") == "virtual"
    ]
    # a node labelled for the docker runtime (the host's own, `tessera dev`) is run by it
    runtimes = {
        row.name: "docker" for row in rows if (row.labels or {}).get(LABEL_RUNTIME) == "docker"
    }
    if path.exists():
        try:
            known = load_inventory(path)
            if (
                {n.name for n in known.nodes} == set(names)
                and all(n.runtime == runtimes.get(n.name) for n in known.nodes)
                and all(_works(db, n.token) for n in known.nodes[:1])
            ):
                return path
        except (OSError, ValueError, yaml.YAMLError):
            pass

    def issue(session: Any) -> list[NodeEntry]:
        return [
            NodeEntry(
                name,
                auth.create_token(
                    session, role="node", node=name, description="made by tessera dev"
                ).value,
                runtime=runtimes.get(name),
            )
            for name in names
        ]

    entries = db.write(issue)
    server = settings.agent_server or settings.effective_public_url
    write_inventory(path, Inventory(server, ca_cert.resolve(), tuple(entries)))
    return path


def docker_engine(url: str | None) -> str | None:
    """The version of the Docker engine at DOCKER_HOST (or the default socket) when one
    answers within a few seconds, else None."""
    import asyncio

    async def probe() -> str | None:
        import aiodocker

        try:
            docker = aiodocker.Docker(url=url)
        except Exception:  # no DOCKER_HOST and no socket
            return None
        try:
            async with asyncio.timeout(3.0):
                version = await docker.version()
            return str(version.get("Version") or "?")
        except Exception:
            return None
        finally:
            await docker.close()

    return asyncio.run(probe())


def host_node_name() -> str:
    import re
    import socket

    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "host"
    return f"docker-{host}"[:63].rstrip("-")


def seed_docker_node(db: Database, gpu_file: Path | None = None) -> str:
    """This host as a node run by the docker runtime (once): its CPUs, its memory less a
    reserve and its GPUs (agent/host.py), labelled tessera.io/runtime=docker. Its name."""
    from agent.host import MEMORY_RESERVE_MIB, host_gpus, node_manifest
    from app.inventory import service as inventory

    name = host_node_name()
    if db.read(lambda s: s.get(Node, name)) is not None:
        return name
    body = node_manifest(name, host_gpus(gpu_file), reserve_mib=MEMORY_RESERVE_MIB)
    body["metadata"]["labels"][LABEL_RUNTIME] = "docker"
    db.write(lambda s: inventory.create_node(s, inventory.node_spec_from_api(body)))
    return name


def _works(db: Database, token: str) -> bool:
    try:
        db.read(lambda s: auth.Authenticator(0).authenticate(s, token))
    except Unauthorized:
        return False
    return True


def _seed_price(db: Database, settings: Settings) -> None:
    """The demo price list, in effect from now (it names no effectiveFrom)."""
    seed_prices(db, settings, DEMO_PRICE)


EXAMPLE = "tessera.io/example"  # an annotation: this object is an example, not the operator's


@dataclass(frozen=True)
class Seeded:
    name: str
    example: bool


def seed_prices(db: Database, settings: Settings, path: Path) -> Seeded | None:
    """The price list in `path` (one Price), when the database has none yet: a fresh
    installation rates usage from its first pod. None when a price exists (nothing is read)."""
    from app.kube.meta import now

    if db.read(lambda s: s.scalar(select(func.count()).select_from(PriceVersion))):
        return None
    body = yaml.safe_load(path.read_text())
    if not isinstance(body, dict) or body.get("kind") != "Price":
        raise ValueError(f"{path}: expected one billing.tessera.io/v1 Price")
    at = now()
    money = billing.Money(settings.billing_currency, settings.billing_minor_digits)
    created = db.write(lambda s: billing.create_price(s, body=body, money=money, at=at))
    annotations = created["metadata"].get("annotations") or {}
    return Seeded(created["metadata"]["name"], annotations.get(EXAMPLE) == "true")


def seed_nodes(db: Database, path: Path) -> int | None:
    """The nodes of the inventory `path` when the database has no node yet; how many."""
    if db.read(lambda s: s.scalar(select(func.count()).select_from(Node))):
        return None
    return db.write(lambda s: loader.load(s, path)).nodes_created


def _credentials(
    db: Database, settings: Settings, ca_cert: Path, name: str, tenant: str | None
) -> Credentials:
    path = settings.data_dir / f"kubeconfig-{name}"
    token = _existing_token(db, path)
    if token is None:
        token = db.write(
            lambda s: auth.create_token(
                s,
                role="tenant" if tenant else "admin",
                tenant=tenant,
                description="made by tessera dev",
            )
        ).value
        config = build(
            server=settings.effective_public_url,
            ca_cert=ca_cert,
            user=name,
            token=token,
            namespace=tenant or "default",
        )
        write(path, config)
    return Credentials(name, token, path)


def seed_controller_credentials(
    db: Database, settings: Settings, ca_cert: Path, *, server: str | None = None
) -> Path:
    """The controller manager's kubeconfig (settings.effective_controllers_kubeconfig), with a
    token of the `controller` role, written once (again when its token no longer works)."""
    path = settings.effective_controllers_kubeconfig
    if _existing_token(db, path) is not None:
        return path
    token = db.write(
        lambda s: auth.create_token(s, role="controller", description="the controller manager")
    ).value
    config = build(
        server=server or settings.agent_server or settings.effective_public_url,
        ca_cert=ca_cert,
        user="tessera-controllers",
        token=token,
        namespace=None,
    )
    write(path, config)
    return path


def _existing_token(db: Database, path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        token = yaml.safe_load(path.read_text())["users"][0]["user"]["token"]
        db.read(lambda s: auth.Authenticator(0).authenticate(s, token))
        return str(token)
    except (Unauthorized, KeyError, IndexError, TypeError, yaml.YAMLError):
        return None
