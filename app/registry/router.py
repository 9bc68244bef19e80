"""HTTP for every kind the registry keeps (app/registry/kinds): the same routes for each."""

from __future__ import annotations

from fastapi import APIRouter

from app.errors import STATUS_RESPONSES
from app.registry.installer import install
from app.registry.kinds import KINDS

router = APIRouter(tags=["registry"], responses=STATUS_RESPONSES)
# The routes of the kinds requested about as often as pods (`Strategy.routes_first`: a node's
# Lease, renewed by every node every 10 s), which app/main.py matches before most of the API's:
# a request is matched route by route, and the registry's other kinds have hundreds.
first_router = APIRouter(tags=["registry"], responses=STATUS_RESPONSES)
for _strategy in KINDS:
    install(first_router if _strategy.routes_first else router, _strategy)
