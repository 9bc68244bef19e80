"""The `tessera` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

log = logging.getLogger("tessera")
cli = typer.Typer(
    help="Tessera: a control plane for serverless GPU and CPU compute.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tenant_app = typer.Typer(help="Tenants (the admin's view).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
inventory_app = typer.Typer(help="The pool of nodes and GPUs.", no_args_is_help=True)
namespace_app = typer.Typer(help="Namespaces.", no_args_is_help=True)
gpu_app = typer.Typer(help="GPU faults and repairs (the admin's view).", no_args_is_help=True)
cli.add_typer(tenant_app, name="tenant")
cli.add_typer(token_app, name="token")
cli.add_typer(inventory_app, name="inventory")
cli.add_typer(namespace_app, name="namespace")
cli.add_typer(gpu_app, name="gpu")


def _settings(**overrides: Any) -> Any:
    from app.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _db(settings: Any, **options: Any) -> Any:
    """The database of a running Tessera (made by `tessera migrate`, `tessera dev` or `make
    run`); a clear error, and nothing created, when the settings point at none. `options`: the
    `Database`'s."""
    from app.db.engine import Database

    url = settings.effective_database_url
    if settings.database_url is None and not (settings.data_dir / "tessera.db").exists():
        _no_database(settings, f"there is no database in {settings.data_dir.resolve()}")
    db = Database(url, **options)
    if not db.has_schema():
        db.dispose()
        _no_database(settings, f"the database {_redacted(url)} holds no Tessera schema")
    return db


def _new_db(settings: Any) -> Any:
    """The database, created and migrated when it is not there yet (`migrate`, `dev`)."""
    from app.db.engine import Database
    from app.db.migrate import upgrade

    _private_dir(settings.data_dir)
    upgrade(settings.effective_database_url)
    return Database(settings.effective_database_url)


def _no_database(settings: Any, what: str) -> NoReturn:
    from app.kubeconfig import running_servers

    lines = [f"{what}, so this command has nothing to act on."]
    running = [
        (url, data) for url, data in running_servers() if data != settings.data_dir.resolve()
    ]
    if running:
        lines.append("Tessera servers running here, with their data directories:")
        lines += [f"  {url}  TESSERA_DATA_DIR={data}" for url, data in running]
        lines.append(
            f"Run it again with that TESSERA_DATA_DIR, e.g. TESSERA_DATA_DIR={running[0][1]}"
        )
    else:
        lines.append(
            "Start Tessera first (`make run`, or `tessera migrate` for a new database), or point "
            "TESSERA_DATA_DIR (or TESSERA_DATABASE_URL) at the running server's: `make run` "
            "prints its data directory on its first lines."
        )
    _fail("\n".join(lines))


def _notifier(db: Any, settings: Any) -> Any:
    """A notifier of `db`'s commits: announced on Redis (when configured), as the API's are, a
    watch on any API process sees what this process (the scheduler, the node loop) changed at
    once, not at its next look at the change log; and, started, it tells this process of every
    process's commits."""
    from app.watch.notify import Notifier

    notifier = Notifier(settings.redis_url)
    db.on_changes = notifier.publish
    return notifier


def _stop_on_sigterm() -> None:
    """SIGTERM ends a long-running command with exit code 0 (a stop asked for, not a crash),
    also while it starts, until its own handling (`_until_stopped`, uvicorn's) takes over; that
    handling hands a SIGTERM back to this one once it has shut down."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)


ALIVE_SECONDS = 5.0  # between touches of TESSERA_ALIVE_FILE


async def _touch_every(path: Path, seconds: float) -> None:
    while True:
        try:
            path.touch()
        except OSError as exc:
            log.warning("cannot touch %s (TESSERA_ALIVE_FILE): %s", path, exc)
        await asyncio.sleep(seconds)


def _until_stopped(work: Coroutine[Any, Any, None], *, alive: Path | None = None) -> None:
    """Run `work` until it ends, or until SIGTERM or SIGINT: then cancel it, let its cleanup run
    (the scheduler gives up its lease, the node agents close their connections) and return, so
    the process exits 0 at once. A container's PID 1 has no default action for SIGTERM: without
    this, `docker stop` waits its whole timeout and kills the process. `alive`: a file touched
    every ALIVE_SECONDS meanwhile (a healthcheck reads its age)."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        if alive is not None:
            touching = asyncio.create_task(_touch_every(alive, ALIVE_SECONDS))
            task.add_done_callback(lambda _: touching.cancel())
        received: list[signal.Signals] = []

        def stop(sig: signal.Signals) -> None:
            if not received:
                log.info("%s received: stopping", sig.name)
            received.append(sig)
            task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig)
        try:
            await task
        except asyncio.CancelledError:
            if not received:
                raise
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    asyncio.run(main())


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


def _run(fn: Any) -> Any:
    """Run a database operation; domain errors become a one-line message and exit code 1."""
    from app.errors import TesseraError

    try:
        return fn()
    except TesseraError as exc:
        _fail(exc.message)


# --- database ------------------------------------------------------------------------------


@cli.command()
def migrate(
    seed_prices: Annotated[
        Path | None,
        typer.Option(
            "--seed-prices",
            dir_okay=False,
            help="A Price (YAML) to load when the database has no price yet, so that a new "
            "installation rates usage from its first pod (examples/demo-price.yaml is an "
            "example, said so loudly).",
        ),
    ] = None,
    seed_nodes: Annotated[
        Path | None,
        typer.Option(
            "--seed-nodes",
            dir_okay=False,
            help="An inventory (YAML) to load when the database has no node yet, such as the "
            "virtual demo pool examples/demo-pool.yaml.",
        ),
    ] = None,
) -> None:
    """Create or upgrade the database schema (safe to run again); on a new database, optionally
    its first price list and nodes."""
    from app.bootstrap import bootstrap

    settings = _settings()
    db = _new_db(settings)
    bootstrap(db)
    typer.echo(f"database is at the latest schema: {_redacted(settings.effective_database_url)}")
    if seed_nodes is not None:
        _seed_nodes(db, seed_nodes)
    if seed_prices is not None:
        _seed_prices(db, settings, seed_prices)


def _seed_nodes(db: Any, path: Path) -> None:
    from app.bootstrap import seed_nodes
    from app.inventory.loader import InventoryError

    try:
        created = _run(lambda: seed_nodes(db, path))
    except (OSError, InventoryError) as exc:
        _fail(f"cannot load the nodes of {path}: {exc}")
    if created is None:
        typer.echo(f"nodes: the database has some already; {path} not loaded")
    else:
        typer.echo(f"nodes: {created} loaded from {path}")


def _seed_prices(db: Any, settings: Any, path: Path) -> None:
    import yaml

    from app.bootstrap import seed_prices

    try:
        seeded = _run(lambda: seed_prices(db, settings, path))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        _fail(f"cannot load the price list {path}: {exc}")
    if seeded is None:
        typer.echo("prices: the database has a price list already; nothing loaded")
        return
    typer.echo(f'prices: "{seeded.name}" loaded from {path}, in effect from now')
    if seeded.example:
        banner = "!" * 78
        typer.secho(
            f"{banner}\nWARNING: usage is rated with Tessera's EXAMPLE price list "
            f'"{seeded.name}" (its\nrates are made up). Add your own, in effect from a time '
            "you choose:\n  kubectl create -f my-prices.yaml   (kind: Price, "
            f"billing.tessera.io/v1)\n{banner}",
            fg=typer.colors.YELLOW,
            err=True,
        )


# --- serving -------------------------------------------------------------------------------


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8443, or TESSERA_PORT).")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    insecure_http: Annotated[
        bool, typer.Option("--insecure-http", help="Serve plain HTTP (tests only).")
    ] = False,
) -> None:
    """Serve the API (HTTPS)."""
    _stop_on_sigterm()
    settings = _settings(host=host, port=port)
    _serve(settings, workers=workers, insecure_http=insecure_http, embedded=False)


@cli.command()
def dev(
    port: Annotated[int | None, typer.Option(help="Port (default 8443, or TESSERA_PORT).")] = None,
) -> None:
    """Everything in one process on the embedded database (API, scheduler, node agent): what
    `make run` starts."""
    _stop_on_sigterm()
    from app.bootstrap import bootstrap, seed_demo
    from app.tls import default_hosts, ensure_tls

    settings = _settings(port=port)
    if "callback_allowed_destinations" not in settings.model_fields_set:
        # one machine's own sandbox: callbacks may reach a receiver on it
        settings = settings.model_copy(
            update={"callback_allowed_destinations": "127.0.0.0/8,::1/128,localhost"}
        )
    db = _new_db(settings)
    bootstrap(db)
    tls = ensure_tls(
        settings.data_dir / "tls", default_hosts(settings.host, settings.tls_extra_sans)
    )
    credentials = _run(lambda: seed_demo(db, settings, tls.ca_cert))
    docker_node, engine = None, None
    wanted = settings.dev_docker_node and settings.agent_runtime != "virtual"
    if settings.dev_virtual_agent and wanted:
        from app.bootstrap import docker_engine, seed_docker_node

        engine = docker_engine(settings.docker_host)
        if engine is not None:
            docker_node = _run(lambda: seed_docker_node(db, settings.agent_gpu_file))
    settings = settings.model_copy(update={"dev_docker_node": docker_node is not None})
    if settings.dev_virtual_agent:
        from app.bootstrap import seed_node_tokens

        seed_node_tokens(db, settings, tls.ca_cert)
    if settings.controllers_embedded:
        from app.bootstrap import seed_controller_credentials

        seed_controller_credentials(db, settings, tls.ca_cert)
    virtual_count = _virtual_count(db)
    db.dispose()
    url = settings.effective_public_url
    typer.echo("")
    typer.secho(f"Tessera is starting on {url}", bold=True)
    typer.echo(f"  {'data:':<19}{settings.data_dir.resolve()}")
    typer.echo(f"  {'web console:':<19}{url}/ui (log in with a token below)")
    for c in credentials:
        typer.echo(f"  {c.name + ' token:':<19}{c.token}")
    for c in credentials:
        typer.echo(f"  {c.name + ' kubeconfig:':<19}{c.kubeconfig.resolve()}")
    demo = next(c for c in credentials if c.name != "admin")
    typer.echo("")
    typer.echo("Point kubectl at it:")
    typer.echo(f"  export KUBECONFIG={demo.kubeconfig.resolve()}")
    typer.echo("  kubectl get nodes")
    typer.echo("  kubectl apply -f examples/gpu-slice-pod.yaml && kubectl get pods -w")
    typer.echo("")
    typer.echo("Runtimes (node label tessera.io/runtime):")
    if settings.dev_virtual_agent:
        typer.echo(
            f"  virtual: the {virtual_count} demo nodes (pods run for show: nothing executes)"
        )
    if docker_node is not None:
        typer.echo(
            f"  docker:  {docker_node} (this host: real containers, Docker engine {engine} at "
            f"{_docker_host(settings)})"
        )
        typer.echo(
            "  run one for real: kubectl run hi --image=busybox --restart=Never "
            '--overrides=\'{"spec":{"nodeSelector":{"tessera.io/runtime":"docker"}}}\' '
            "-- echo hello"
        )
        typer.echo("  switch: TESSERA_AGENT_RUNTIME=virtual make run (no docker node)")
    elif settings.dev_virtual_agent:
        why = (
            f"no Docker engine answers at {_docker_host(settings)}"
            if wanted
            else "TESSERA_AGENT_RUNTIME=virtual"
        )
        typer.echo(f"  docker:  none ({why})")
        typer.echo(
            "  switch: start a Docker engine (or set DOCKER_HOST) and unset "
            "TESSERA_AGENT_RUNTIME to add this host as a docker node"
        )
    typer.echo("")
    _serve(settings, workers=1, insecure_http=False, embedded=True)


def _docker_host(settings: Any) -> str:
    return str(settings.docker_host or "unix:///var/run/docker.sock")


def _virtual_count(db: Any) -> int:
    """The nodes the virtual runtime runs: every node not labelled for the docker one."""
    from sqlalchemy import select

    from app.db.models import Node

    labels = db.read(lambda s: list(s.scalars(select(Node.labels))))
    return sum(1 for found in labels if (found or {}).get("tessera.io/runtime") != "docker")


def _metrics(settings: Any, *, workers: int = 1) -> None:
    """Multiprocess metrics, set up before anything is counted: in the configured directory,
    or, for several API workers without one, in a fresh directory of this run's own (so
    /metrics sums every worker and no earlier run's counts)."""
    from app.metrics import use_directory

    if settings.metrics_dir is not None:
        use_directory(settings.metrics_dir)
    elif workers > 1:
        import tempfile

        use_directory(Path(tempfile.mkdtemp(prefix="tessera-metrics-")))


def _serve(settings: Any, *, workers: int, insecure_http: bool, embedded: bool) -> None:
    import os

    import uvicorn

    _metrics(settings, workers=workers)

    from app.kubeconfig import forget_server, record_server
    from app.logs import uvicorn_config
    from app.server import uvicorn_options
    from app.tls import default_hosts, ensure_tls

    ssl: dict[str, Any] = {}
    if not insecure_http:
        tls = ensure_tls(
            settings.data_dir / "tls", default_hosts(settings.host, settings.tls_extra_sans)
        )
        ssl = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    from app.logs import configure

    configure()
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": "warning",
        "access_log": False,
        "loop": "uvloop" if sys.platform != "win32" else "asyncio",
        "timeout_graceful_shutdown": 5,
        "log_config": uvicorn_config(),
        **uvicorn_options(settings, workers=workers),
        **ssl,
    }
    url = settings.effective_public_url
    if insecure_http and not settings.public_url:
        url = f"http://{settings.host}:{settings.port}"
    record_server(settings.data_dir, url)
    try:
        if workers > 1:
            os.environ.setdefault("TESSERA_DATA_DIR", str(settings.data_dir))
            uvicorn.run("app.asgi:app", workers=workers, **common)
            return
        from app.main import create_app

        uvicorn.run(create_app(settings, embedded=embedded), **common)
    finally:
        forget_server(settings.data_dir)


@cli.command()
def scheduler(
    name: Annotated[
        str,
        typer.Option("--scheduler-name", help="Schedule only pods with this spec.schedulerName."),
    ] = "tessera",
    interval: Annotated[float, typer.Option(help="Seconds between cycles when idle.")] = 0.5,
    min_interval: Annotated[
        float,
        typer.Option(
            help="Seconds at least from a cycle's end to the next one a commit wakes: more "
            "makes larger batches for less CPU, less binds sooner."
        ),
    ] = 0.05,
    batch: Annotated[int, typer.Option(help="Pending pods solved together at most.")] = 512,
) -> None:
    """Run the scheduler: place pending pods with the solver and bind them."""
    _stop_on_sigterm()
    from scheduler.loop import LoopConfig, SchedulingLoop

    settings = _settings()
    _metrics(settings)
    from app.logs import configure

    configure()
    leader = None
    if settings.scheduler_leader_elect:
        import os
        import socket
        import uuid

        from app.leases.service import Claim

        leader = Claim(
            namespace="kube-system",
            name=f"{name}-scheduler",
            holder=f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}",
            duration_seconds=settings.scheduler_lease_seconds,
        )
    config = LoopConfig.from_settings(
        settings,
        scheduler_name=name,
        interval=interval,
        min_interval=min_interval,
        batch=batch,
        leader=leader,
    )
    from app.db.engine import idle_within_lease
    from app.process import collector_for_serving

    # a scheduler stopped inside a bind holds the lease's row: free it within half the lease
    db = _db(settings, idle_in_transaction_ms=idle_within_lease(settings.scheduler_lease_seconds))
    notifier = _notifier(db, settings)
    loop = SchedulingLoop(db, config, notifier=notifier)

    async def schedule() -> None:
        await notifier.start()  # pods created through any API process wake the loop
        try:
            await loop.run_forever()
        finally:
            await notifier.stop()

    with collector_for_serving():
        _until_stopped(schedule(), alive=settings.alive_file)


@cli.command()
def agent(
    interval: Annotated[float, typer.Option(help="Seconds between passes.")] = 0.5,
    virtual: Annotated[
        bool,
        typer.Option(
            "--virtual",
            help="Act as the node agents of many nodes (virtual runtime, like KWOK), through "
            "the API with each node's token, instead of the control plane's node loop.",
        ),
    ] = False,
    nodes: Annotated[
        Path | None,
        typer.Option(
            help="With --virtual: the inventory of nodes and their tokens (YAML; default "
            "DATA_DIR/virtual-nodes.yaml, which tessera dev writes for the demo pool)."
        ),
    ] = None,
    issue_tokens: Annotated[
        bool,
        typer.Option(
            "--issue-tokens",
            help="With --virtual: first write that inventory, with a node token for every "
            "node in the database, unless it is there and its tokens work.",
        ),
    ] = False,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="Act as the node agents of the inventory's nodes with this runtime: docker "
            "(real containers through the Docker Engine API at DOCKER_HOST) or virtual (the "
            "same as --virtual). Default: TESSERA_AGENT_RUNTIME when set.",
        ),
    ] = None,
) -> None:
    """Run the control plane's node loop (the simulation of nodes no agent manages, node
    leases, housekeeping), or with --virtual / --runtime the node agents of an inventory's
    nodes."""
    _stop_on_sigterm()
    from app.agent import run_forever

    settings = _settings()
    from app.logs import configure

    configure()
    if runtime is not None and runtime not in ("docker", "virtual"):
        _fail(f"--runtime must be docker or virtual, not {runtime!r}")
    if virtual and runtime is None:
        runtime = "virtual"
    runtime = runtime or settings.agent_runtime
    if runtime is not None:
        from agent.main import load_inventory, run, timing_from

        path = nodes or settings.data_dir / "virtual-nodes.yaml"
        if issue_tokens:
            from app.bootstrap import seed_node_tokens

            _private_dir(settings.data_dir)
            ca = _ca_once_served(settings)
            seed_node_tokens(_db(settings), settings, ca, path=path, virtual_only=True)
        try:
            inventory = load_inventory(path)
        except (OSError, ValueError) as exc:
            _fail(f"cannot read the node inventory: {exc}")
        if settings.agent_server:
            inventory = replace(inventory, server=settings.agent_server)
        if settings.agent_ca_cert:
            inventory = replace(inventory, ca_cert=settings.agent_ca_cert)
        if not inventory.server:
            _fail(
                f"{path} names no server: add server: https://HOST:PORT or set TESSERA_AGENT_SERVER"
            )
        _until_stopped(run(inventory, timing_from(settings, runtime)), alive=settings.alive_file)
        return
    from app.process import collector_for_serving

    db = _db(settings)
    _notifier(db, settings)  # its commits (pods started, stopped) wake every API's watches
    with collector_for_serving():
        _until_stopped(
            run_forever(
                db,
                keep_changes=settings.watch_log_retention,
                interval=interval,
                settings=settings,
            ),
            alive=settings.alive_file,
        )


@cli.command()
def controllers(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="The manager's credentials (default TESSERA_CONTROLLERS_KUBECONFIG or "
            "DATA_DIR/kubeconfig-controllers)."
        ),
    ] = None,
    issue_token: Annotated[
        bool,
        typer.Option(
            "--issue-token",
            help="First write that kubeconfig, with a token of the controller role, unless it "
            "is there and its token works (needs the database).",
        ),
    ] = False,
    identity: Annotated[
        str | None,
        typer.Option(help="This manager's name in the leader Lease (default: host_pid_random)."),
    ] = None,
) -> None:
    """Run the controller manager: the controllers of the workload kinds (ReplicaSet,
    Deployment), through the API, while it holds the Lease kube-system/tessera-controllers."""
    _stop_on_sigterm()
    settings = _settings()
    if kubeconfig is not None:
        settings = settings.model_copy(update={"controllers_kubeconfig": kubeconfig})
    from app.logs import configure

    configure()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    path = settings.effective_controllers_kubeconfig
    if issue_token:
        from app.bootstrap import seed_controller_credentials

        _private_dir(settings.data_dir)
        ca = _ca_once_served(settings)
        seed_controller_credentials(_db(settings), settings, ca)
    if not path.exists():
        _fail(
            f"no credentials at {path}: give --kubeconfig, or --issue-token to write them "
            "(tessera dev writes them for its own server)"
        )
    from app.controllers import run

    _until_stopped(
        run(path, lease_seconds=settings.controllers_lease_seconds, identity=identity),
        alive=settings.alive_file,
    )


# --- tenants, tokens, kubeconfigs -----------------------------------------------------------


WEIGHT_HELP = (
    "Fair share: when the pool is contended, the tenant is entitled to this many times the "
    "dominant share of a tenant of weight 1 (1-1000)."
)


@tenant_app.command("create")
def tenant_create(name: str, weight: Annotated[int, typer.Option(help=WEIGHT_HELP)] = 1) -> None:
    """Create a tenant and its namespace NAME."""
    from app.auth import service

    db = _db(_settings())
    _run(lambda: db.write(lambda s: service.create_tenant(s, name=name, weight=weight)))
    typer.echo(f'tenant "{name}" created with namespace "{name}"')
    typer.echo(f"next: tessera kubeconfig --tenant {name} --out {name}.kubeconfig")


@tenant_app.command("weight")
def tenant_weight(name: str, weight: Annotated[int, typer.Argument(help=WEIGHT_HELP)]) -> None:
    """Set tenant NAME's fair-share weight (the scheduler takes it at its next cycle)."""
    from app.auth import service

    db = _db(_settings())
    _run(lambda: db.write(lambda s: service.set_weight(s, name=name, weight=weight)))
    typer.echo(f'tenant "{name}" has weight {weight}')


@tenant_app.command("list")
def tenant_list() -> None:
    """List tenants and their fair-share weights."""
    from app.auth import service

    db = _db(_settings())
    for tenant in db.read(service.list_tenants):
        typer.echo(f"{tenant.name}  weight={tenant.weight}")


@namespace_app.command("create")
def namespace_create(
    name: str, tenant: Annotated[str, typer.Option(help="Owner: NAME or NAME-<suffix>.")]
) -> None:
    """Create a namespace for a tenant."""
    from app.auth import service as auth
    from app.namespaces import service

    db = _db(_settings())

    def work(session: Any) -> None:
        owner = auth.get_tenant(session, tenant)
        principal = auth.Principal("tenant", owner.id, owner.name, "cli")
        service.create_for(session, principal, name=name, labels=None, annotations=None)

    _run(lambda: db.write(work))
    typer.echo(f'namespace "{name}" created for tenant "{tenant}"')


@token_app.command("create")
def token_create(
    tenant: Annotated[str | None, typer.Option(help="The tenant the token acts for.")] = None,
    admin: Annotated[
        bool, typer.Option("--admin", help="An operator token (inventory, tenants).")
    ] = False,
    node: Annotated[
        str | None,
        typer.Option(help="A node agent's token: acts for this node, its lease and its pods."),
    ] = None,
    controller: Annotated[
        bool,
        typer.Option(
            "--controller",
            help="The controller manager's token (workload kinds, their pods and events).",
        ),
    ] = False,
    description: Annotated[str, typer.Option(help="A note to recognise it by.")] = "",
) -> None:
    """Issue a token and print it (it is shown only this once)."""
    from app.auth import service

    if [admin, tenant is not None, node is not None, controller].count(True) != 1:
        _fail("give one of --tenant NAME, --node NAME, --admin or --controller")
    role: service.Role = (
        "admin"
        if admin
        else "controller"
        if controller
        else "node"
        if node is not None
        else "tenant"
    )
    db = _db(_settings())
    new = _run(
        lambda: db.write(
            lambda s: service.create_token(
                s, role=role, tenant=tenant, node=node, description=description
            )
        )
    )
    typer.echo(new.value)


@token_app.command("revoke")
def token_revoke(
    key: Annotated[
        str, typer.Argument(help="The token, or its key id (16 hex characters after tsr_).")
    ],
) -> None:
    """Revoke a token (API processes stop accepting it within TESSERA_AUTH_CACHE_SECONDS)."""
    from app.auth import service

    db = _db(_settings())
    _run(lambda: db.write(lambda s: service.revoke_token(s, key_id=key)))
    typer.echo("revoked")


@token_app.command("list")
def token_list(tenant: Annotated[str | None, typer.Option()] = None) -> None:
    """List tokens (key ids only; secrets are never stored)."""
    from app.auth import service

    db = _db(_settings())
    for token, tenant_name in db.read(lambda s: service.list_tokens(s, tenant=tenant)):
        state = "revoked" if token.revoked_at else "active"
        owner = tenant_name or token.node_name or "-"
        typer.echo(
            f"tsr_{token.key_id}_…  {token.role:<6} {owner:<20} {state:<8} {token.description}"
        )


@cli.command()
def kubeconfig(
    tenant: Annotated[str | None, typer.Option(help="Write a kubeconfig for this tenant.")] = None,
    admin: Annotated[bool, typer.Option("--admin")] = False,
    out: Annotated[Path | None, typer.Option(help="Where to write it (default: print it).")] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="API URL (default: TESSERA_PUBLIC_URL, TESSERA_HOST/TESSERA_PORT when set, "
            "the server running on this data directory, or https://127.0.0.1:8443)."
        ),
    ] = None,
) -> None:
    """Issue a token and write a kubeconfig that uses it (with the server's CA)."""
    import yaml

    from app.auth import service
    from app.kubeconfig import build, write
    from app.tls import default_hosts, ensure_tls

    if admin == (tenant is not None):
        _fail("give either --tenant NAME or --admin")
    settings = _settings()
    db = _db(settings)
    new = _run(
        lambda: db.write(
            lambda s: service.create_token(
                s, role="admin" if admin else "tenant", tenant=tenant, description="kubeconfig"
            )
        )
    )
    url = server or _server_url(settings)
    ca = None
    if url.startswith("https://"):
        ca = ensure_tls(
            settings.data_dir / "tls", default_hosts(settings.host, settings.tls_extra_sans)
        ).ca_cert
    config = build(
        server=url,
        ca_cert=ca,
        user=tenant or "admin",
        token=new.value,
        namespace=tenant or "default",
    )
    if out is None:
        typer.echo(yaml.safe_dump(config, sort_keys=False))
    else:
        write(out, config)
        typer.echo(f"wrote {out} for {url} (use: export KUBECONFIG={out.resolve()})")


def _server_url(settings: Any) -> str:
    """TESSERA_PUBLIC_URL, TESSERA_HOST/TESSERA_PORT when set here, else the URL of the server
    running on this data directory, else the default https://127.0.0.1:8443."""
    from app.kubeconfig import running_server_url

    explicit = settings.public_url or {"host", "port"} & settings.model_fields_set
    running = None if explicit else running_server_url(settings.data_dir)
    return running or str(settings.effective_public_url)


# --- inventory -----------------------------------------------------------------------------


@inventory_app.command("load")
def inventory_load(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, help="Inventory YAML, or an openb node list CSV."
        ),
    ],
) -> None:
    """Register the nodes of an inventory file (existing nodes are kept as they are)."""
    from app.inventory.loader import InventoryError, load

    db = _db(_settings())
    try:
        result = _run(lambda: db.write(lambda s: load(s, path)))
    except InventoryError as exc:
        _fail(str(exc))
    typer.echo(
        f"{result.nodes_created} nodes ({result.gpus_created} GPUs) added, {result.nodes_skipped} already present"
    )


# --- GPU faults ----------------------------------------------------------------------------


@gpu_app.command("fault")
def gpu_fault(
    node: Annotated[str, typer.Argument(help="The node the GPU is in.")],
    index: Annotated[int, typer.Argument(help="The GPU's index on the node.", min=0, max=1023)],
    kind: Annotated[
        str, typer.Option("--kind", help="ecc, xid, bus (fell off the bus) or driver.")
    ],
    xid: Annotated[int | None, typer.Option("--xid", help="The Xid (with --kind xid).")] = None,
    message: Annotated[str, typer.Option("--message", help="What was seen.")] = "",
) -> None:
    """Report a GPU fault: the GPU is Unhealthy at once; the pods on it are told now and stop
    after TESSERA_GPU_FAULT_GRACE_SECONDS (or are placed again); the rest of the node serves."""
    from app.faults import service

    settings = _settings()
    db = _db(settings)

    def work(session: Any) -> dict[str, Any]:
        name = service.gpu_name_at(session, node=node, index=index)
        return service.report_fault(
            session,
            name=name,
            kind=kind,
            xid=xid,
            message=message,
            grace_seconds=settings.gpu_fault_grace_seconds,
        )

    gpu = _run(lambda: db.write(work))
    pods = gpu["status"].get("pods") or []
    typer.echo(
        f"GPU {gpu['metadata']['name']} is Unhealthy; {len(pods)} pod(s) on it stop in "
        f"{settings.gpu_fault_grace_seconds}s"
    )


@gpu_app.command("repair")
def gpu_repair(
    node: Annotated[str, typer.Argument(help="The node the GPU is in.")],
    index: Annotated[int, typer.Argument(help="The GPU's index on the node.", min=0, max=1023)],
) -> None:
    """The GPU is repaired: Healthy and placeable again."""
    from app.faults import service

    db = _db(_settings())
    gpu = _run(
        lambda: db.write(
            lambda s: service.repair(s, name=service.gpu_name_at(s, node=node, index=index))
        )
    )
    typer.echo(f"GPU {gpu['metadata']['name']} is Healthy and placeable again")


# --- documents -----------------------------------------------------------------------------


@cli.command()
def openapi(
    out: Annotated[Path, typer.Option(help="Where to write the document.")] = Path(
        "openapi/openapi.json"
    ),
) -> None:
    """Write the OpenAPI document generated from the code."""
    from app.openapi import document

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document(), indent=2, sort_keys=True) + "\n")
    typer.echo(f"wrote {out}")


CA_WAIT_SECONDS = 120.0


def _ca_once_served(settings: Any) -> Path:
    """The CA certificate the written credentials carry: TESSERA_AGENT_CA_CERT, else the one
    `tessera serve` makes in the shared data directory at its first start. A process started
    beside the API (compose, the benchmarks) waits for it, up to CA_WAIT_SECONDS, instead of
    failing because it came up first."""
    import time

    ca: Path = settings.agent_ca_cert or settings.data_dir / "tls" / "ca.crt"
    deadline = time.monotonic() + CA_WAIT_SECONDS
    if not ca.exists():
        logging.getLogger("tessera").info("waiting for the API's CA certificate at %s", ca)
    while not ca.exists():
        if time.monotonic() > deadline:
            _fail(
                f"no CA certificate at {ca} after {CA_WAIT_SECONDS:.0f} s: start tessera serve "
                "with the same TESSERA_DATA_DIR first, or set TESSERA_AGENT_CA_CERT"
            )
        time.sleep(0.2)
    return ca


def _private_dir(path: Path) -> None:
    """The data directory holds the database and secrets: the owner's alone (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@cli.command(
    "bench",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench(ctx: typer.Context) -> None:
    """Run Tessera's benchmarks (`tessera bench --help` lists them)."""
    # Imported here: the benchmarks pull in the solver and OR-Tools (about 2 s), which no
    # other command needs, and the production image does not ship them.
    try:
        from bench.cli import bench_app
    except ImportError as exc:
        _fail(f"the benchmarks are not installed here ({exc}): run them from a source checkout")
    typer.main.get_command(bench_app).main(
        list(ctx.args), prog_name="tessera bench", standalone_mode=True
    )


def main() -> None:
    cli()


# --- billing (app/billing_cli.py) ------------------------------------------------------------

from app.billing_cli import billing_app  # noqa: E402
from app.billing_cli import statement as billing_statement  # noqa: E402
from app.billing_cli import usage as billing_usage  # noqa: E402

cli.add_typer(billing_app, name="billing")
cli.command("usage")(billing_usage)
cli.command("statement")(billing_statement)
