"""The floor a create is measured against: the least an HTTPS create can cost on this machine.

    python -m bench.floor --port 9443 --database-url postgresql+psycopg://... --tls-dir DIR

As many worker processes as Tessera's API has in the run (`--workers`), serving
`POST /api/v1/namespaces/{namespace}/pods` with the same stack as Tessera (uvicorn with uvloop
and httptools, FastAPI, TLS with the same certificate): an async route that decodes the pod,
inserts it and an event row in one transaction (two INSERTs, through SQLAlchemy's async engine on
psycopg), and answers 201 with the pod: nothing else. Absolute figures move by tens of per cent between machines and sessions (shared
cores); the burst reports Tessera's creates and its pods bound end to end as fractions of this
floor, driven by the same clients with the same pods in the same run.
"""

from __future__ import annotations

import argparse
import os
import uuid

import orjson
from fastapi import FastAPI
from sqlalchemy import JSON, Column, MetaData, String, Table, create_engine
from starlette.requests import Request
from starlette.responses import Response

metadata = MetaData()
pods = Table(
    "floor_pods",
    metadata,
    Column("uid", String(36), primary_key=True),
    Column("namespace", String(63), nullable=False),
    Column("name", String(253), nullable=False),
    Column("body", JSON, nullable=False),
)
events = Table(
    "floor_events",
    metadata,
    Column("uid", String(36), primary_key=True),
    Column("pod_uid", String(36), nullable=False),
    Column("reason", String(63), nullable=False),
)


def app(database_url: str) -> FastAPI:
    """The floor's application: an async route and an async engine, so that no request waits
    for a thread of a pool, nor a worker's event loop for a query."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url, pool_size=16, max_overflow=16)
    served = FastAPI()

    @served.get("/readyz")
    async def ready() -> str:
        return "ok"

    @served.post("/api/v1/namespaces/{namespace}/pods", status_code=201)
    async def create(namespace: str, request: Request) -> Response:
        body = orjson.loads(await request.body())
        uid = str(uuid.uuid4())
        body.setdefault("metadata", {}).update(uid=uid, namespace=namespace)
        async with engine.begin() as connection:
            await connection.execute(
                pods.insert().values(
                    uid=uid, namespace=namespace, name=body["metadata"].get("name", ""), body=body
                )
            )
            await connection.execute(
                events.insert().values(uid=str(uuid.uuid4()), pod_uid=uid, reason="Created")
            )
        return Response(orjson.dumps(body), status_code=201, media_type="application/json")

    return served


def served() -> FastAPI:
    """The application of each worker process (`uvicorn --factory`)."""
    return app(os.environ["TESSERA_FLOOR_DATABASE_URL"])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--workers", type=int, default=1, help="as many as Tessera's API")
    args = parser.parse_args()
    engine = create_engine(args.database_url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    engine.dispose()
    os.environ["TESSERA_FLOOR_DATABASE_URL"] = args.database_url
    uvicorn.run(
        "bench.floor:served",
        factory=True,
        workers=args.workers,
        host="127.0.0.1",
        port=args.port,
        ssl_certfile=args.cert,
        ssl_keyfile=args.key,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
