"""The delivery worker: sends the outbox's pending deliveries (see service.emit) after commit.

It runs in every API process (`tessera serve`, each of its workers, and `tessera dev`): the API
is the one process every deployment has, and a delivery emitted by a request in that process
wakes its worker at once. Processes share the outbox through a lease on each row (claimed by a
conditional UPDATE), so several API processes, or a crashed one, never lose or double-send a
delivery in the normal case; delivery is at least once (a process that dies after the receiver
answered but before recording it sends again once the lease expires), which the stable event
id lets receivers absorb. Transitions other processes commit (the scheduler's preemptions, the
agent's stops) are found by polling every `callback_poll_seconds`.

An attempt:
- POSTs the event as a CloudEvents 1.0 JSON document in structured mode
  (`Content-Type: application/cloudevents+json`), signed in `Tessera-Signature`
  (app/callbacks/signing.py) with the callback's current secret;
- resolves the URL's host and connects only to an address that is public or that the operator
  allows (checked on the address actually connected to, at every attempt: no DNS rebinding to
  private ones; app/callbacks/destinations.py);
- records only the status code of a failed answer, never the receiver's reason text, and a
  failed connection without the system's error (the record is the tenant's to read: it must not
  make the control plane a port scanner);
- follows no redirect (a 3xx is a failed attempt, its Location recorded);
- succeeds on any 2xx within `callback_timeout_seconds` (for the connection, the request and
  the wait for the answer); anything else is retried after an exponential backoff with jitter,
  up to `callback_max_attempts`, then the delivery is Failed.

Senders are shared fairly: a tenant holds at most a quarter of them (at least one) at once, and
each pass hands free senders out round-robin across the tenants with deliveries due, so one
tenant's receivers that never answer delay its own deliveries, not another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from app import __version__
from app.callbacks import signing
from app.callbacks.destinations import (
    NOTHING,
    Allowed,
    Refused,
    Resolver,
    is_loopback_host,
    resolve_allowed,
    system_resolver,
)
from app.callbacks.service import EVENT_TYPES, deliveries_t, objects_t, secrets_t
from app.db.engine import Database
from app.kube.meta import now
from app.metrics import metrics
from app.settings import Settings

log = logging.getLogger("tessera.callbacks")
MAX_ERROR_CHARS = 1024
MAX_RESPONSE_BYTES = 64 * 1024

# --- waking the workers of this process after a commit -----------------------------------

_wakers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
_wakers_lock = threading.Lock()


def wake() -> None:
    """Tell this process's delivery workers that new deliveries were committed."""
    with _wakers_lock:
        targets = list(_wakers)
    for loop, event in targets:
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(event.set)


# --- configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryConfig:
    source: str
    timeout_seconds: float = 10.0
    max_attempts: int = 8
    retry_base_seconds: float = 5.0
    retry_max_seconds: float = 3600.0
    poll_seconds: float = 1.0
    concurrency: int = 8
    retention_seconds: int = 7 * 86400
    ca_file: Path | None = None
    allowed: Allowed = NOTHING

    @property
    def per_tenant(self) -> int:
        """Senders one tenant may hold at once."""
        return max(1, self.concurrency // 4)

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryConfig:
        return cls(
            source=settings.effective_public_url,
            timeout_seconds=settings.callback_timeout_seconds,
            max_attempts=settings.callback_max_attempts,
            retry_base_seconds=settings.callback_retry_base_seconds,
            retry_max_seconds=settings.callback_retry_max_seconds,
            poll_seconds=settings.callback_poll_seconds,
            concurrency=settings.callback_concurrency,
            retention_seconds=settings.callback_delivery_retention_seconds,
            ca_file=settings.callback_ca_file,
            allowed=Allowed(settings.callback_allowed_destinations),
        )

    @property
    def lease_seconds(self) -> float:
        """Long enough for an attempt to end and be recorded."""
        return 3 * self.timeout_seconds + 10


def backoff_seconds(attempts: int, config: DeliveryConfig, rng: random.Random) -> float:
    """The wait after the `attempts`-th failed attempt: base * 2^(attempts-1), at most the
    maximum, with "equal jitter" (half fixed, half random) so retries of many deliveries
    spread out."""
    ceiling = min(config.retry_max_seconds, config.retry_base_seconds * 2 ** min(attempts - 1, 40))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


# --- claiming and recording ----------------------------------------------------------------


def fair_share(
    due: Sequence[tuple[str, int | None]],
    limit: int,
    per_tenant: int,
    busy: dict[int | None, int],
) -> list[str]:
    """Up to `limit` of the `due` (uid, tenant) pairs, oldest first, taken round-robin across
    tenants, each tenant topped up to at most `per_tenant` with what it already holds."""
    queues: dict[int | None, list[str]] = {}
    for uid, tenant in due:
        queues.setdefault(tenant, []).append(uid)
    held = dict(busy)
    out: list[str] = []
    while len(out) < limit:
        progressed = False
        for tenant, queue in queues.items():
            if len(out) >= limit:
                break
            if queue and held.get(tenant, 0) < per_tenant:
                out.append(queue.pop(0))
                held[tenant] = held.get(tenant, 0) + 1
                progressed = True
        if not progressed:
            break
    return out


@dataclass(frozen=True)
class Claimed:
    tenant_id: int | None
    uid: str
    event_id: str
    type: str
    subject: str
    at: datetime
    data: dict[str, Any]
    attempts: int
    url: str
    secret: str
    lease_until: datetime


def _due(at: datetime) -> Any:
    return and_(
        deliveries_t.c.status == "Pending",
        deliveries_t.c.next_attempt_at <= at,
        or_(deliveries_t.c.lease_until.is_(None), deliveries_t.c.lease_until < at),
    )


def claim(
    db: Database,
    config: DeliveryConfig,
    *,
    limit: int,
    busy: dict[int | None, int] | None = None,
) -> list[Claimed]:
    """Lease up to `limit` due deliveries to this worker (a read first, so an idle outbox costs
    no write transaction): round-robin across tenants, the oldest due first within each, none
    to a tenant already holding `config.per_tenant` senders (`busy`: senders held per tenant)."""
    at = now()
    due = db.read(
        lambda s: s.execute(
            select(deliveries_t.c.uid, deliveries_t.c.tenant_id)
            .where(_due(at))
            .order_by(deliveries_t.c.next_attempt_at)
            .limit(limit * 16)
        ).all()
    )
    candidates = fair_share(due, limit, config.per_tenant, busy or {})
    if not candidates:
        return []

    def work(session: Session) -> list[Claimed]:
        at = now()
        until = at + timedelta(seconds=config.lease_seconds)
        out = []
        for uid in candidates:
            taken = session.execute(
                update(deliveries_t)
                .where(deliveries_t.c.uid == uid, _due(at))
                .values(lease_until=until)
            ).rowcount  # type: ignore[attr-defined]
            if not taken:
                continue
            row = (
                session.execute(
                    select(deliveries_t, objects_t.c.body, secrets_t.c.secret)
                    .join(objects_t, objects_t.c.uid == deliveries_t.c.callback_uid)
                    .join(secrets_t, secrets_t.c.callback_uid == deliveries_t.c.callback_uid)
                    .where(deliveries_t.c.uid == uid)
                )
                .mappings()
                .one()
            )
            out.append(
                Claimed(
                    tenant_id=row["tenant_id"],
                    uid=row["uid"],
                    event_id=row["event_id"],
                    type=row["type"],
                    subject=row["subject"],
                    at=row["at"],
                    data=row["data"],
                    attempts=row["attempts"],
                    url=(row["body"].get("spec") or {}).get("url") or "",
                    secret=row["secret"],
                    lease_until=until,
                )
            )
        return out

    return db.write(work)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    response_code: int | None = None
    error: str | None = None


def record(
    db: Database, claimed: Claimed, outcome: Outcome, config: DeliveryConfig, rng: random.Random
) -> None:
    attempts = claimed.attempts + 1
    at = now()
    values: dict[str, Any] = {
        "attempts": attempts,
        "last_attempt_at": at,
        "response_code": outcome.response_code,
        "last_error": (outcome.error or "")[:MAX_ERROR_CHARS] or None,
        "lease_until": None,
    }
    if outcome.ok:
        values.update(status="Delivered", delivered_at=at)
    elif attempts >= config.max_attempts:
        values.update(status="Failed")
        values["last_error"] = f"gave up after {attempts} attempts: {outcome.error or ''}"[
            :MAX_ERROR_CHARS
        ]
    else:
        wait = backoff_seconds(attempts, config, rng)
        values.update(next_attempt_at=at + timedelta(seconds=wait))
    db.write(
        lambda s: s.execute(
            update(deliveries_t)
            .where(
                deliveries_t.c.uid == claimed.uid,
                deliveries_t.c.lease_until == claimed.lease_until,
            )
            .values(**values)
        )
    )


def prune(db: Database, config: DeliveryConfig) -> None:
    """Forget deliveries that ended longer than the retention ago."""
    cutoff = now() - timedelta(seconds=config.retention_seconds)
    db.write(
        lambda s: s.execute(
            delete(deliveries_t).where(
                deliveries_t.c.status.in_(("Delivered", "Failed")),
                deliveries_t.c.created_at < cutoff,
            )
        )
    )


# --- one attempt ---------------------------------------------------------------------------


def cloud_event(claimed: Claimed, source: str) -> bytes:
    """The delivery's body: the same bytes on every attempt (but the signature's time)."""
    return orjson.dumps(
        {
            "specversion": "1.0",
            "id": claimed.event_id,
            "source": source,
            "type": EVENT_TYPES.get(claimed.type, claimed.type),
            "subject": claimed.subject,
            "time": claimed.at.isoformat().replace("+00:00", "Z"),
            "datacontenttype": "application/json",
            "data": claimed.data,
        }
    )


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP(S) to the addresses already vetted for the host, never to a fresh resolution."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        addresses: Sequence[str],
        timeout: float,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self._tls = tls

    def connect(self) -> None:
        error: OSError | None = None
        for address in self._addresses:
            try:
                sock = socket.create_connection((address, self.port), self.timeout)
                break
            except OSError as exc:
                error = exc
        else:
            raise error or OSError("no address to connect to")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        self.sock = sock


_RESOLVERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tessera-callback-dns")


def _resolve_in_time(
    host: str, port: int, resolve: Resolver, timeout: float, allowed: Allowed
) -> list[str]:
    """`resolve_allowed`, given at most `timeout` (the system resolver has no time limit)."""
    future = _RESOLVERS.submit(resolve_allowed, host, port, resolve, allowed)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout as exc:
        raise Refused(f"{host} did not resolve within {timeout:g}s") from exc


def send(
    claimed: Claimed,
    config: DeliveryConfig,
    *,
    resolve: Resolver = system_resolver,
    tls: ssl.SSLContext | None = None,
) -> Outcome:
    """One attempt; never raises."""
    try:
        parts = urlsplit(claimed.url)
        host = parts.hostname or ""
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        addresses = _resolve_in_time(host, port, resolve, config.timeout_seconds, config.allowed)
        if not https and not all(is_loopback_host(a) for a in addresses):
            raise Refused(f"{host} resolves to a non-loopback address: plain http is refused")
    except (Refused, ValueError) as exc:
        return Outcome(False, None, f"refused destination: {exc}")
    body = cloud_event(claimed, config.source)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {
        "Content-Type": "application/cloudevents+json",
        "User-Agent": f"Tessera-Callbacks/{__version__}",
        signing.HEADER: signing.sign(claimed.secret, body),
        "Tessera-Delivery-Attempt": str(claimed.attempts + 1),
        "Connection": "close",
    }
    context = tls if https else None
    if https and context is None:
        context = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
    connection = _PinnedConnection(
        host, port, addresses=addresses, timeout=config.timeout_seconds, tls=context
    )
    deadline = time.monotonic() + config.timeout_seconds
    try:
        connection.request("POST", path, body=body, headers=headers)
        if connection.sock is not None:
            connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
        response = connection.getresponse()
        response.read(MAX_RESPONSE_BYTES)
        code = response.status
        if 200 <= code < 300:
            return Outcome(True, code)
        if 300 <= code < 400:
            location = (response.getheader("Location") or "")[:300]
            return Outcome(
                False,
                code,
                f"redirect not followed ({code} to {location or 'no Location'}): point the "
                "callback's spec.url at the final address",
            )
        return Outcome(False, code, f"the receiver answered {code}")
    except TimeoutError:
        return Outcome(False, None, f"timed out: no answer within {config.timeout_seconds:g}s")
    except ssl.SSLError as exc:
        return Outcome(False, None, f"TLS failed: {exc.reason or 'handshake'}")
    except (OSError, http.client.HTTPException):
        # not the system's error: refused, reset and unreachable would tell ports apart
        return Outcome(False, None, "the connection failed or closed before an answer")
    finally:
        connection.close()


# --- the worker ----------------------------------------------------------------------------


class DeliveryWorker:
    def __init__(
        self,
        db: Database,
        config: DeliveryConfig,
        *,
        resolve: Resolver = system_resolver,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.config = config
        self.resolve = resolve
        self.rng = rng or random.Random()
        self._pool = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="tessera-callback"
        )
        self._pruned = 0.0
        self._lock = threading.Lock()
        self._in_flight = 0
        self._busy: dict[int | None, int] = {}  # senders held per tenant

    def run_once(self) -> int:
        """Lease as many due deliveries as there are free senders and hand each to one (it
        sends, records the outcome and wakes the loop); returns how many were handed out. A
        slow receiver holds one sender, never the others' deliveries."""
        with self._lock:
            free = self.config.concurrency - self._in_flight
            busy = dict(self._busy)
        if time.monotonic() - self._pruned > 600:
            self._pruned = time.monotonic()
            prune(self.db, self.config)
        if free <= 0:
            return 0
        claimed = claim(self.db, self.config, limit=free, busy=busy)
        for item in claimed:
            with self._lock:
                self._in_flight += 1
                self._busy[item.tenant_id] = self._busy.get(item.tenant_id, 0) + 1
            self._pool.submit(self._deliver, item)
        return len(claimed)

    def _deliver(self, item: Claimed) -> None:
        try:
            started = time.monotonic()
            outcome = send(item, self.config, resolve=self.resolve)
            counted = metrics()
            counted.callback_duration.observe(time.monotonic() - started)
            result = (
                "delivered"
                if outcome.ok
                else "failed"
                if item.attempts + 1 >= self.config.max_attempts
                else "retry"
            )
            counted.callback_attempts.labels(result).inc()
            record(self.db, item, outcome, self.config, self.rng)
            if not outcome.ok:
                log.info("callback delivery %s failed: %s", item.event_id, outcome.error)
        except Exception:  # the lease expires and another attempt is made
            log.exception("callback delivery %s could not be recorded", item.event_id)
        finally:
            with self._lock:
                self._in_flight -= 1
                left = self._busy.get(item.tenant_id, 1) - 1
                if left:
                    self._busy[item.tenant_id] = left
                else:
                    self._busy.pop(item.tenant_id, None)
            wake()

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        entry = (loop, event)
        with _wakers_lock:
            _wakers.add(entry)
        try:
            while True:
                event.clear()
                try:
                    sent = await asyncio.to_thread(self.run_once)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("callback delivery pass failed; retrying")
                    sent = 0
                if sent:
                    continue  # more may be due
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.poll_seconds):
                        await event.wait()
        finally:
            with _wakers_lock:
                _wakers.discard(entry)
            self._pool.shutdown(wait=False, cancel_futures=True)


def start(db: Database, settings: Settings) -> Callable[[], Any]:
    """The coroutine function the API's lifespan runs (see app/main.py)."""
    return DeliveryWorker(db, DeliveryConfig.from_settings(settings)).run_forever
