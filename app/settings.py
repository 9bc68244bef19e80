"""Tessera's settings: one class, read from `TESSERA_*` environment variables.

Nothing else in the code base reads `os.environ`; everything that can be configured is here.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TESSERA_", extra="ignore")

    data_dir: Path = Field(
        default=Path(".tessera"),
        description="Where the embedded database, TLS material and kubeconfigs live.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: a SQLite file in the data dir. "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    redis_url: str | None = Field(
        default=None,
        description="Optional. When set, change notifications and rate limits cross processes.",
    )
    host: str = "127.0.0.1"
    port: int = 8443
    # A long-running command that serves no HTTP (the scheduler, the node loop, node agents)
    # touches this file every few seconds while its event loop turns, so that a container's
    # healthcheck can tell a live process from a hung one by the file's age.
    alive_file: Path | None = None
    public_url: str | None = Field(
        default=None, description="URL written into kubeconfigs; default https://HOST:PORT."
    )
    tls_extra_sans: list[str] = Field(
        default_factory=list, description="Extra DNS names / IPs for the server certificate."
    )

    # Authentication: verified tokens are cached this long; a revoked token stops working
    # within this many seconds on every API process.
    auth_cache_seconds: float = 5.0
    # A directory shared by the processes on one host (API workers, scheduler, agent) whose
    # metrics /metrics sums (prometheus-client's multiprocess mode). None: each process its own.
    metrics_dir: Path | None = None
    # Requests per second per tenant (token bucket, burst = 2x); 0 disables the limit.
    rate_limit_per_second: float = 2000.0
    # Requests per second per node agent's token (burst = 2x): an agent renews its lease and
    # reports its pods' status far below this; a node's token that floods the API is slowed,
    # the agent waiting out each 429's Retry-After. 0 disables the limit.
    node_rate_limit_per_second: float = 100.0
    # Preemption: a regular pod that does not fit stops the cheapest set of BestEffort pods that
    # have run at least `preemption_min_runtime_seconds`; they get this notice before they stop.
    # One active scheduler: `tessera scheduler` processes elect a leader through the Lease
    # kube-system/tessera-scheduler; a standby takes over once the leader has not renewed it for
    # `scheduler_lease_seconds` (it renews every second).
    scheduler_leader_elect: bool = True
    scheduler_lease_seconds: int = Field(default=4, ge=2, le=300)
    preemption: bool = True
    preemption_notice_seconds: int = Field(default=30, ge=0, le=3600)
    preemption_min_runtime_seconds: int = Field(default=60, ge=0, le=86400)
    # A pod that has waited longer than this for a node (seconds since it was created) fails:
    # phase Failed, reason PendingTimeout, an event and the PodFinished callback, as serverless
    # services fail a request that found no capacity in time. None (the default): pods wait
    # as long as it takes.
    max_pending_seconds: float | None = Field(default=None, ge=0, le=30 * 86400)
    # GPU faults: a pod holding a fragment of a GPU that failed is told at once and stops (or is
    # placed again) this many seconds later, time to checkpoint; its billing ends at the fault.
    gpu_fault_grace_seconds: int = Field(default=30, ge=0, le=3600)
    # Failed authentications per second per client address (burst = 2x); once over it, that
    # address's requests with malformed or wrong tokens are answered 429 (a token that verifies
    # is always served). 0 disables the limit.
    auth_failures_per_second: float = 10.0
    # Proxies whose X-Forwarded-For (and -Proto) is believed: comma-separated addresses or CIDR
    # networks (e.g. "10.0.0.0/8"). Empty: none, a client's address is the connection's own.
    trusted_proxies: str = Field(default="", max_length=4096)

    # HTTP: the request head may take this many bytes (431 beyond), and a client this long to
    # send the head and then the body (408 after). Bodies are limited to 3 MiB (413).
    max_header_bytes: int = 1024 * 1024
    header_timeout_seconds: float = 30.0
    body_timeout_seconds: float = 60.0

    # Watch: a watch lasts at most a random time between this and twice this (as Kubernetes'
    # --min-request-timeout), or its timeoutSeconds if shorter; each tenant may hold this many
    # watches open on each API process (429 beyond).
    watch_min_timeout_seconds: float = 1800.0
    watch_max_per_tenant: int = 100

    # Sessions (`kubectl exec`, `attach`, `port-forward`; app/sessions): each tenant may hold
    # this many open on each API process (429 beyond); a frame (one WebSocket message) is at
    # most this many bytes; a session with no byte either way for this long ends, as does one
    # whose agent does not take it within `session_connect_seconds`; its token and pod are
    # checked again every `session_check_seconds` (revoked, or the pod ended: it ends).
    session_max_per_tenant: int = 20
    session_max_frame_bytes: int = 256 * 1024
    session_idle_seconds: float = 900.0
    session_connect_seconds: float = 15.0
    session_check_seconds: float = 5.0

    # Watch: how many change-log entries are kept (older resourceVersions answer 410 Gone).
    watch_log_retention: int = 100_000
    watch_bookmark_seconds: float = 30.0
    # How often each process looks through the change log for changes no notification told
    # its watches of (notifications come from this process, or from others through Redis):
    # the longest a watch can lag a change made elsewhere when they do not arrive.
    watch_poll_seconds: float = 1.0

    # Optional override of the sold-spec table (YAML); default ships with Tessera.
    spec_table: Path | None = None

    # Pods with no resources at all get this spec.
    default_pod_spec: str = "2-4Gi"

    # Billing: the currency every price is in, its minor unit (2: cents), and how long after
    # midnight UTC a day's statements are closed (late usage after that becomes an adjustment).
    billing_currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    billing_minor_digits: int = Field(default=2, ge=0, le=4)
    billing_close_delay_seconds: int = Field(default=3600, ge=0, le=7 * 86400)
    # Spend limits: how often the node loop meters the spend of tenants with limits (their
    # statements so far today and this month), tells thresholds crossed, and stops pods of a
    # spent budget that asks for it. New pods are refused by the last reading.
    budget_check_seconds: float = Field(default=10.0, ge=0.5, le=3600)

    # Callbacks (webhooks): every API process sends due deliveries (False: this one does not).
    # An attempt has `callback_timeout_seconds`; a failed one is retried after
    # base * 2^(n-1) seconds (at most the max, with jitter), up to `callback_max_attempts`
    # attempts in all. Transitions committed by other processes are found every poll. Ended
    # deliveries are kept (and listed) this long. `callback_ca_file`: extra CAs to trust for
    # https receivers (default: the system's).
    # Secrets are encrypted at rest with AES-256-GCM. `secret_keys`: "name:base64key,..." (32-byte
    # keys; the first encrypts, every one decrypts, so a key is rotated by putting a new one
    # first). Empty: a key generated once into the data dir (`secret.key`), which every process
    # of one store must share (with PostgreSQL and several hosts, set this instead).
    secret_keys: str = Field(default="", repr=False)
    callback_delivery: bool = True
    callback_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    callback_max_attempts: int = Field(default=8, ge=1, le=50)
    callback_retry_base_seconds: float = Field(default=5.0, gt=0, le=3600)
    callback_retry_max_seconds: float = Field(default=3600.0, gt=0, le=86400)
    callback_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    callback_concurrency: int = Field(default=8, ge=1, le=64)
    callback_delivery_retention_seconds: int = Field(default=7 * 86400, ge=60, le=90 * 86400)
    callback_ca_file: Path | None = None
    # Destinations callbacks may reach besides public addresses: networks and host names,
    # comma-separated ("127.0.0.0/8,::1/128,hooks.internal"). `tessera dev` allows loopback.
    callback_allowed_destinations: str = Field(default="", max_length=4096)
    # Node agents (agent/, `tessera agent --virtual`): a node is agent-managed once it has a
    # Lease in kube-node-lease. Its agent renews it every `agent_heartbeat_seconds` for
    # `node_lease_seconds`; a node whose lease has expired is NotReady (Ready=Unknown), and
    # `node_lost_grace_seconds` after that its pods fail with reason NodeLost, billed until
    # the last renewal.
    node_lease_seconds: int = Field(default=40, ge=1, le=3600)
    node_lost_grace_seconds: float = Field(default=300.0, ge=0, le=86400)
    agent_heartbeat_seconds: float = Field(default=10.0, gt=0, le=3600)
    # The virtual runtime: a bound pod starts this long after its agent sees it, and a
    # container told to stop (SIGTERM) exits this long after.
    agent_start_delay_seconds: float = Field(default=0.5, ge=0, le=3600)
    agent_stop_seconds: float = Field(default=1.0, ge=0, le=3600)
    # A running virtual container writes a "running" line this often (at most 1000 a run).
    agent_log_step_seconds: float = Field(default=10.0, ge=0.1, le=3600)
    # Pod logs that node agents send (POST .../pods/{name}/log): each container run keeps at
    # most this many lines and bytes (the oldest dropped); the current and previous run only.
    pod_log_max_lines: int = Field(default=10_000, ge=10, le=1_000_000)
    pod_log_max_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    # The runtime of the nodes an agent runs (`tessera agent --runtime`): "virtual" (nothing
    # runs, like KWOK) or "docker" (real containers through the Docker Engine API at
    # DOCKER_HOST, a unix socket by default).
    # Unset: `tessera agent` runs the control plane's node loop unless told --runtime, and
    # `tessera dev` adds a docker node when an engine answers; "virtual": it adds none.
    agent_runtime: Literal["virtual", "docker"] | None = None
    # The Docker engine of the docker runtime (DOCKER_HOST, as the docker CLI reads it; unset:
    # the default socket).
    docker_host: str | None = Field(default=None, validation_alias="DOCKER_HOST")
    # `tessera dev` runs the virtual agent for the demo pool in its process, and a docker
    # runtime node for this host when a Docker engine answers (False: never).
    dev_virtual_agent: bool = True
    dev_docker_node: bool = True
    # Sessions on a node (`kubectl exec`, `attach`, `port-forward`; agent/sessions.py): its
    # agent runs at most this many at once; port-forward reaches a pod's port through a relay
    # container of this image in the pod's network namespace (it needs `nc`, as busybox has).
    agent_session_max: int = Field(default=32, ge=1, le=10_000)
    # The GPUs a docker-runtime node registers: read from NVML (the `nvidia` extra,
    # nvidia-ml-py) when the host has an NVIDIA driver, none otherwise; this file (YAML or
    # JSON, agent/host.py says its shape) describes them instead (tests, hosts NVML misreads).
    agent_gpu_file: Path | None = None
    # A shared GPU's NVIDIA MPS control daemon (agent/mps.py): a container of this image
    # running this command (JSON list in the environment), started with the GPU's first slice
    # pod and stopped after its last. The NVIDIA Container Toolkit brings the driver's
    # nvidia-cuda-mps-control into it.
    agent_mps_image: str = Field(default="nvidia/cuda:12.4.1-base-ubuntu22.04", max_length=512)
    agent_mps_command: list[str] = Field(
        default=["nvidia-cuda-mps-control", "-f"], min_length=1, max_length=32
    )
    # False for an engine without the NVIDIA runtime (tests): containers get no GPU device
    # requests; the rest (MPS limits, daemons, mounts) is as on a GPU host.
    agent_nvidia_runtime: bool = True
    # Whether pods of the docker runtime reach out of the host (pip, a model hub): each
    # namespace's network is then a bridge the engine NATs out, and namespaces are kept apart by
    # the engine's firewall rules; off, it is internal, with no route out at all.
    agent_pod_egress: bool = False
    agent_relay_image: str = "busybox:stable"
    # Resource usage (`kubectl top`): the agent reports its node's and pods' every this often.
    agent_metrics_seconds: float = Field(default=15.0, ge=0.5, le=3600)
    # The API the agent speaks to (default: this server's public URL) and its CA bundle.
    agent_server: str | None = None
    agent_ca_cert: Path | None = None
    # The controller manager (`tessera controllers`): its credentials (a kubeconfig; default
    # DATA_DIR/kubeconfig-controllers, which `tessera dev` and `tessera controllers
    # --issue-token` write), and its leader Lease's duration (it renews within two thirds of
    # it, every 2/15 of it, as Kubernetes' 15 s / 10 s / 2 s). `tessera dev` runs it in its
    # process unless `controllers_embedded` is false.
    controllers_kubeconfig: Path | None = None
    controllers_lease_seconds: int = Field(default=15, ge=2, le=300)
    controllers_embedded: bool = True

    @cached_property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'tessera.db').resolve()}"

    @property
    def effective_controllers_kubeconfig(self) -> Path:
        return self.controllers_kubeconfig or self.data_dir / "kubeconfig-controllers"

    @property
    def effective_public_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        return f"https://{self.host}:{self.port}"
