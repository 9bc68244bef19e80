"""A writer process for tests/db/test_version_order.py.

`python -m tests.db.version_writer URL NAMESPACE SEED SECONDS OUT`: for SECONDS, random
creates, data updates, annotation writes and deletes of ConfigMaps in NAMESPACE through the
registry's store, over a small shared set of names, each in its own transaction with a random pause inside it (the
transaction holds its versions and its row locks meanwhile); some take their versions first and
change the object only after the pause, when a transaction that began later may have changed it
(PostgreSQL refuses that write as out of order, and it runs again). After each commit it appends
`[verb, name, resourceVersion]` to OUT; a write refused (the name taken, the object gone, a
conflict) is not written. The test SIGKILLs some of these processes at random moments.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from sqlalchemy import select

from app.db.engine import Database, is_retryable, next_resource_version
from app.db.models import Namespace
from app.errors import TesseraError
from app.namespaces.service import NamespaceInfo
from app.registry.kinds.configmaps import ConfigMapStrategy
from app.registry.store import Store

NAMES = [f"cm-{i:02d}" for i in range(24)]


STORE = Store(ConfigMapStrategy())


def write_one(db: Database, rng: random.Random, ns: NamespaceInfo) -> tuple[str, str, int] | None:
    name = rng.choice(NAMES)
    verb = rng.choice(["create", "create", "update", "status", "delete"])
    pause = rng.choice([0.0, 0.0, rng.uniform(0, 0.02), rng.uniform(0.02, 0.25)])
    step = rng.randrange(1_000_000)
    # Some transactions take their versions first, pause, and only then change the object
    # (as a batch of writes does): another transaction may have changed it meanwhile.
    late = rng.random() < 0.4

    def work(session: Any) -> dict[str, Any]:
        if late:
            next_resource_version(session)
            time.sleep(pause)
        if verb == "create":
            obj = STORE.create(
                session, namespace=ns, obj={"metadata": {"name": name}, "data": {"n": str(step)}}
            )
        elif verb == "update":
            obj = STORE.patch(
                session,
                namespace=ns.name,
                name=name,
                change=lambda o: {**o, "data": {"n": str(step)}},
            )
        elif verb == "status":
            obj = STORE.patch(
                session,
                namespace=ns.name,
                name=name,
                change=lambda o: {
                    **o,
                    "metadata": {**o["metadata"], "annotations": {"n": str(step)}},
                },
            )
        else:
            obj = STORE.delete(session, namespace=ns.name, name=name)
        time.sleep(pause)  # inside the transaction: its versions are taken, not yet committed
        return obj

    try:
        obj = db.write(work)
    except TesseraError:
        return None
    except Exception as exc:  # refused again and again as out of order: not written
        if is_retryable(exc):
            return None
        raise
    return verb, name, int(obj["metadata"]["resourceVersion"])


def main(url: str, namespace: str, seed: int, seconds: float, out: str) -> None:
    rng = random.Random(seed)
    db = Database(url, pool_size=1)
    row = db.read(
        lambda s: s.execute(select(Namespace).where(Namespace.name == namespace)).scalar_one()
    )
    ns = NamespaceInfo(row.name, row.tenant_id, False)
    deadline = time.monotonic() + seconds
    with open(out, "a", buffering=1) as log:
        while time.monotonic() < deadline:
            done = write_one(db, rng, ns)
            if done is not None:
                log.write(json.dumps(done) + "\n")
    db.dispose()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
