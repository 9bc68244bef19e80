"""The routes of every verb, for any strategy: `install(router, strategy)`.

HTTP only: each route parses the request, authorizes it (the tenancy check of every namespaced
request, `authorize_namespace`), and calls the kind's store in one transaction; `dryRun=All`
runs the same call in a transaction that is rolled back. The paths are Kubernetes':

    GET    {prefix}/{resource}                              list / watch, every namespace
    GET    {prefix}/namespaces/{ns}/{resource}              list / watch
    POST   {prefix}/namespaces/{ns}/{resource}              create
    DELETE {prefix}/namespaces/{ns}/{resource}              deletecollection
    GET    {prefix}/namespaces/{ns}/{resource}/{name}       get
    PUT    {prefix}/namespaces/{ns}/{resource}/{name}       update
    PATCH  {prefix}/namespaces/{ns}/{resource}/{name}       patch (merge, strategic, JSON, apply)
    DELETE {prefix}/namespaces/{ns}/{resource}/{name}       delete
    GET|PUT|PATCH .../{name}/status                         the status subresource, if any

A cluster-scoped kind has the same routes without `namespaces/{ns}`.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.deps import (
    PrincipalDep,
    Services,
    ServicesDep,
    authorize_namespace,
    json_response,
    respond,
)
from app.errors import BadRequest
from app.kube.bodies import (
    APPLY_PATCH,
    apply_patch,
    decode,
    decode_object,
    media_type,
    patch_type_of,
)
from app.kube.listing import list_object
from app.kube.params import (
    DryRunQ,
    FieldManagerQ,
    FieldValidationQ,
    ForceQ,
    GracePeriodQ,
    ListQueryDep,
    PrettyQ,
    PropagationPolicyQ,
)
from app.namespaces.service import NamespaceInfo
from app.pods.schemas import DeleteOptions
from app.pods.validation import FieldValidation, decode_model
from app.registry.crypto import LazyKeyring
from app.registry.scale import Scale, replicas_of, scale_of
from app.registry.store import Store
from app.registry.strategy import Obj, Strategy
from app.watch.stream import watch_response

MAX_FIELD_MANAGER_CHARS = 128


def install(router: APIRouter, strategy: Strategy) -> None:
    """Add the routes of every verb of `strategy`'s kind to `router`."""
    _Routes(strategy).add(router)


class _Routes:
    def __init__(self, strategy: Strategy) -> None:
        self.s = strategy
        prefix = f"/apis/{strategy.group}/{strategy.version}" if strategy.group else "/api/v1"
        self.prefix = prefix
        self.body: dict[str, Any] = {
            "requestBody": {
                "required": True,
                "content": {
                    media: {"schema": {"$ref": f"#/components/schemas/{strategy.model.__name__}"}}
                    for media in ("application/json", "application/yaml")
                },
            }
        }

    # --- helpers shared by the routes ----------------------------------------------------

    def store(self, services: Services) -> Store:
        return Store(self.s.configured(services.settings), LazyKeyring(services.settings))

    async def authorize(
        self,
        services: Services,
        principal: Principal,
        namespace: str | None,
        *,
        verb: str,
        name: str = "",
        subresource: str = "",
    ) -> NamespaceInfo | None:
        resource = f"{self.s.resource}/{subresource}" if subresource else self.s.resource
        if namespace is None:
            require(principal, verb=verb, resource=resource, group=self.s.group, name=name)
            return None
        return await authorize_namespace(
            services,
            principal,
            namespace,
            verb=verb,
            resource=resource,
            name=name,
            group=self.s.group,
        )

    def check(self, document: Obj, mode: FieldValidation, warnings: list[str]) -> Obj:
        """A body as the kind's schema reads it (unknown fields refused or dropped per
        fieldValidation), back as a plain object."""
        kind = document.get("kind")
        if kind not in (None, self.s.kind):
            raise BadRequest(
                f"the object is a {kind}, this endpoint takes a {self.s.kind}: send it to "
                f"its own resource"
            )
        version = document.get("apiVersion")
        if version not in (None, self.s.api_version):
            raise BadRequest(
                f'the object\'s apiVersion is "{version}": a {self.s.kind} is {self.s.api_version}'
            )
        model, found = decode_model(self.s.model, document, kind=self.s.kind, mode=mode)
        warnings.extend(found)
        obj: Obj = model.model_dump(by_alias=True, exclude_none=True)
        return obj

    async def run(self, services: Services, work: Any, dry_run: str | None) -> Any:
        return await (services.dry_run(work) if dry_run else services.write(work))

    # --- routes --------------------------------------------------------------------------

    def add(self, router: APIRouter) -> None:
        s = self.s
        item_model = {"model": s.model}
        list_model = {"model": s.list_model} if s.list_model is not None else {}
        collection = f"{self.prefix}/{s.resource}"
        if s.namespaced:
            scoped = f"{self.prefix}/namespaces/{{namespace}}/{s.resource}"
            router.add_api_route(
                collection,
                self.list_everywhere(),
                methods=["GET"],
                responses={200: list_model},
                summary=f"List or watch {s.resource} in every namespace the caller may see",
            )
        else:
            scoped = collection
        item = f"{scoped}/{{name}}"
        router.add_api_route(
            scoped,
            self.list_scoped(),
            methods=["GET"],
            responses={200: list_model},
            summary=f"List or watch {s.resource}",
        )
        router.add_api_route(
            scoped,
            self.create(),
            methods=["POST"],
            status_code=201,
            responses={201: item_model},
            openapi_extra=self.body,
            summary=f"Create a {s.kind}" + (f" ({s.summary})" if s.summary else ""),
        )
        router.add_api_route(
            scoped,
            self.delete_collection(),
            methods=["DELETE"],
            responses={200: list_model},
            summary=f"Delete the {s.resource} the selectors match",
        )
        router.add_api_route(
            item,
            self.get(),
            methods=["GET"],
            responses={200: item_model},
            summary=f"Read a {s.kind}",
        )
        router.add_api_route(
            item,
            self.replace(),
            methods=["PUT"],
            responses={200: item_model},
            openapi_extra=self.body,
            summary=f"Replace a {s.kind}; metadata.resourceVersion makes it conditional",
        )
        router.add_api_route(
            item,
            self.patch(),
            methods=["PATCH"],
            responses={200: item_model},
            summary=f"Change a {s.kind} (merge, strategic merge, JSON patch or server-side apply)",
        )
        router.add_api_route(
            item,
            self.delete(),
            methods=["DELETE"],
            responses={200: item_model},
            summary=f"Delete a {s.kind} (with finalizers: marked, and removed with the last one)",
        )
        if s.has_status:
            router.add_api_route(
                f"{item}/status",
                self.get(),
                methods=["GET"],
                responses={200: item_model},
                summary=f"Read a {s.kind}'s status",
            )
            router.add_api_route(
                f"{item}/status",
                self.replace("status"),
                methods=["PUT"],
                responses={200: item_model},
                openapi_extra=self.body,
                summary=f"Replace a {s.kind}'s status",
            )
            router.add_api_route(
                f"{item}/status",
                self.patch("status"),
                methods=["PATCH"],
                responses={200: item_model},
                summary=f"Change a {s.kind}'s status",
            )

        if s.scale_path is not None:
            scale_model = {"model": Scale}
            router.add_api_route(
                f"{item}/scale",
                self.scale("get"),
                methods=["GET"],
                responses={200: scale_model},
                summary=f"Read a {s.kind}'s scale (autoscaling/v1 Scale)",
            )
            router.add_api_route(
                f"{item}/scale",
                self.scale("update"),
                methods=["PUT"],
                responses={200: scale_model},
                openapi_extra={
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Scale"}}
                        },
                    }
                },
                summary=f"Replace a {s.kind}'s scale: its replicas",
            )
            router.add_api_route(
                f"{item}/scale",
                self.scale("patch"),
                methods=["PATCH"],
                responses={200: scale_model},
                summary=f"Change a {s.kind}'s scale: its replicas (kubectl scale)",
            )

    async def _serve_list(
        self,
        request: Request,
        services: Services,
        principal: Principal,
        query: Any,
        namespace: str | None,
    ) -> Response:
        s = self.s
        fields = query.fields(s.field_selectors)
        tenant = (
            None if principal.sees_every_tenant or namespace is not None else principal.tenant_id
        )
        store = self.store(services)
        if query.watch:
            return await watch_response(
                request,
                services,
                principal,
                kind=s.log_kind,
                namespace=namespace,
                labels=query.labels,
                fields=fields,
                resource_version=query.resource_version,
                timeout_seconds=query.timeout_seconds,
                bookmarks=query.bookmarks,
                initial=lambda session: store.list_all(
                    session, namespace=namespace, tenant_id=tenant
                ),
                api_version=s.api_version,
                decode=lambda obj: s.from_storage(obj, store.keyring),
            )
        items, rv, token = await services.read(
            lambda session: store.list_page(
                session,
                namespace=namespace,
                tenant_id=tenant,
                labels=query.labels,
                fields=fields,
                limit=query.limit,
                continue_token=query.continue_token,
            )
        )
        return respond(request, list_object(f"{s.kind}List", s.api_version, items, rv, token))

    def list_everywhere(self) -> Any:
        async def route(
            request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
        ) -> Response:
            verb = "watch" if query.watch else "list"
            await self.authorize(services, principal, None, verb=verb)
            return await self._serve_list(request, services, principal, query, None)

        return route

    def list_scoped(self) -> Any:
        if not self.s.namespaced:
            return self.list_everywhere()

        async def route(
            namespace: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            query: ListQueryDep,
        ) -> Response:
            verb = "watch" if query.watch else "list"
            await self.authorize(services, principal, namespace, verb=verb)
            return await self._serve_list(request, services, principal, query, namespace)

        return route

    def create(self) -> Any:
        s = self.s

        async def route(
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            field_validation: FieldValidationQ = None,
            dry_run: DryRunQ = None,
            field_manager: FieldManagerQ = None,
            pretty: PrettyQ = None,
        ) -> Response:
            document = decode_object(await request.body(), request.headers.get("content-type"))
            meta = document.get("metadata")
            name = str(meta.get("name") or "")[:253] if isinstance(meta, dict) else ""
            ns = await self.authorize(
                services, principal, namespace if s.namespaced else None, verb="create", name=name
            )
            warnings: list[str] = []
            obj = self.check(document, field_validation or "Warn", warnings)
            store = self.store(services)
            created = await self.run(
                services, lambda session: store.create(session, namespace=ns, obj=obj), dry_run
            )
            return json_response(created, 201, warnings)

        return _with_namespace(route, s.namespaced)

    def get(self) -> Any:
        s = self.s

        async def route(
            name: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            pretty: PrettyQ = None,
        ) -> Response:
            await self.authorize(services, principal, namespace, verb="get", name=name)
            store = self.store(services)
            obj = await services.read(
                lambda session: store.get(session, namespace=namespace or "", name=name)
            )
            return respond(request, obj)

        return _with_namespace(route, s.namespaced)

    def replace(self, subresource: str = "") -> Any:
        s = self.s

        async def route(
            name: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            field_validation: FieldValidationQ = None,
            dry_run: DryRunQ = None,
            field_manager: FieldManagerQ = None,
            pretty: PrettyQ = None,
        ) -> Response:
            await self.authorize(
                services, principal, namespace, verb="update", name=name, subresource=subresource
            )
            document = decode_object(await request.body(), request.headers.get("content-type"))
            warnings: list[str] = []
            obj = self.check(document, field_validation or "Warn", warnings)
            store = self.store(services)

            def work(session: Session) -> Obj:
                return store.update(
                    session, namespace=namespace or "", name=name, obj=obj, subresource=subresource
                )

            return json_response(await self.run(services, work, dry_run), 200, warnings)

        return _with_namespace(route, s.namespaced)

    def patch(self, subresource: str = "") -> Any:
        s = self.s

        async def route(
            name: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            field_validation: FieldValidationQ = None,
            dry_run: DryRunQ = None,
            field_manager: FieldManagerQ = None,
            force: ForceQ = None,
            pretty: PrettyQ = None,
        ) -> Response:
            ns = await self.authorize(
                services, principal, namespace, verb="patch", name=name, subresource=subresource
            )
            patch_type = patch_type_of(request.headers.get("content-type"))
            mode: FieldValidation = field_validation or "Warn"
            warnings: list[str] = []
            store = self.store(services)
            if patch_type == APPLY_PATCH:
                if subresource:
                    raise BadRequest(
                        f"server-side apply is not offered on {s.resource}/{subresource}: "
                        "send a merge patch"
                    )
                if not field_manager:
                    raise BadRequest(
                        "fieldManager is required for apply requests (kubectl sends it; curl: "
                        "add ?fieldManager=NAME)"
                    )
                if len(field_manager) > MAX_FIELD_MANAGER_CHARS:
                    raise BadRequest(
                        f"fieldManager is {len(field_manager)} characters; at most "
                        f"{MAX_FIELD_MANAGER_CHARS} are accepted"
                    )
                applied = decode_object(await request.body(), APPLY_PATCH)
                meta = applied.get("metadata")
                named = meta.get("name") if isinstance(meta, dict) else None
                if named not in (None, name):
                    raise BadRequest(
                        f'the name of the object ("{str(named)[:64]}") does not match the name '
                        f'on the URL ("{name}")'
                    )
                self.check(applied, mode, warnings)  # refuses unknown fields as Strict asks

                def apply(session: Session) -> tuple[Obj, bool]:
                    return store.apply(
                        session,
                        namespace=ns,
                        name=name,
                        applied={**applied, "metadata": {**(meta or {}), "name": name}},
                        manager=field_manager,
                        check=lambda obj: self.check(obj, "Ignore", []),
                    )

                obj, created = await self.run(services, apply, dry_run)
                return json_response(obj, 201 if created else 200, warnings)
            patch = decode(await request.body(), media_type(request.headers.get("content-type")))

            def change(current: Obj) -> Obj:
                warnings.clear()
                return self.check(apply_patch(current, patch, patch_type), mode, warnings)

            def work(session: Session) -> Obj:
                return store.patch(
                    session,
                    namespace=namespace or "",
                    name=name,
                    change=change,
                    subresource=subresource,
                )

            return json_response(await self.run(services, work, dry_run), 200, warnings)

        return _with_namespace(route, s.namespaced)

    def delete(self) -> Any:
        s = self.s

        async def route(
            name: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            dry_run: DryRunQ = None,
            grace_period_seconds: GracePeriodQ = None,
            propagation_policy: PropagationPolicyQ = None,
            pretty: PrettyQ = None,
        ) -> Response:
            await self.authorize(services, principal, namespace, verb="delete", name=name)
            options = await _delete_options(request)
            dry = dry_run or ("All" if options.dry_run and "All" in options.dry_run else None)
            preconditions = options.preconditions or {}
            store = self.store(services)

            def work(session: Session) -> Obj:
                return store.delete(
                    session,
                    namespace=namespace or "",
                    name=name,
                    uid=_text(preconditions.get("uid")),
                    resource_version=_text(preconditions.get("resourceVersion")),
                    propagation=propagation_of(options, propagation_policy),
                )

            return json_response(await self.run(services, work, dry))

        return _with_namespace(route, s.namespaced)

    def scale(self, verb: str) -> Any:
        """The `scale` subresource: the replicas of the object as an autoscaling/v1 Scale."""
        s = self.s

        async def route(
            name: str,
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            namespace: str | None = None,
            dry_run: DryRunQ = None,
            field_manager: FieldManagerQ = None,
            field_validation: FieldValidationQ = None,
            pretty: PrettyQ = None,
        ) -> Response:
            await self.authorize(
                services, principal, namespace, verb=verb, name=name, subresource="scale"
            )
            store = self.store(services)
            ns = namespace or ""
            if verb == "get":
                obj = await services.read(
                    lambda session: store.get(session, namespace=ns, name=name)
                )
                return respond(request, scale_of(s, obj))
            body = await request.body()
            if verb == "update":
                document = decode_object(body, request.headers.get("content-type"))
                wanted = (
                    (document.get("metadata") or {}) if isinstance(document, dict) else {}
                ).get("resourceVersion")
            else:
                patch_type = patch_type_of(request.headers.get("content-type"))
                patch = decode(body, media_type(request.headers.get("content-type")))
                wanted = None

            def change(current: Obj) -> Obj:
                current = copy.deepcopy(current)  # it shares its maps with the stored row
                scale = scale_of(s, current)
                new = document if verb == "update" else apply_patch(scale, patch, patch_type)
                replicas = replicas_of(new, s)
                node: Obj = current
                for part in (s.scale_path or ())[:-1]:
                    node = node.setdefault(part, {})
                node[(s.scale_path or ("",))[-1]] = replicas
                if wanted:
                    current["metadata"]["resourceVersion"] = str(wanted)
                return current

            def work(session: Session) -> Obj:
                return scale_of(s, store.patch(session, namespace=ns, name=name, change=change))

            return json_response(await self.run(services, work, dry_run))

        return _with_namespace(route, s.namespaced)

    def delete_collection(self) -> Any:
        s = self.s

        async def route(
            request: Request,
            services: ServicesDep,
            principal: PrincipalDep,
            query: ListQueryDep,
            namespace: str | None = None,
            dry_run: DryRunQ = None,
            grace_period_seconds: GracePeriodQ = None,
            propagation_policy: PropagationPolicyQ = None,
        ) -> Response:
            await self.authorize(services, principal, namespace, verb="deletecollection")
            options = await _delete_options(request)
            dry = dry_run or ("All" if options.dry_run and "All" in options.dry_run else None)
            fields = query.fields(s.field_selectors)
            store = self.store(services)

            def work(session: Session) -> list[Obj]:
                return store.delete_collection(
                    session,
                    namespace=namespace,
                    tenant_id=None,
                    labels=query.labels,
                    fields=fields,
                    propagation=propagation_of(options, propagation_policy),
                )

            items = await self.run(services, work, dry)
            return json_response(list_object(f"{s.kind}List", s.api_version, items, 0, None))

        return _with_namespace(route, s.namespaced)


def _with_namespace(route: Any, namespaced: bool) -> Any:
    """A namespaced kind's route takes `namespace` from the path; a cluster-scoped one's has no
    such parameter (FastAPI reads the signature)."""
    import inspect

    signature = inspect.signature(route)
    params = list(signature.parameters.values())
    if namespaced:
        params = [
            p.replace(default=inspect.Parameter.empty, annotation=str)
            if p.name == "namespace"
            else p
            for p in params
        ]
        # a parameter without a default may not follow ones with defaults: put it first
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    else:
        params = [p for p in params if p.name != "namespace"]
    route.__signature__ = signature.replace(parameters=params)
    return route


async def _delete_options(request: Request) -> DeleteOptions:
    body = await request.body()
    if not body.strip():
        return DeleteOptions()
    document = decode_object(body, request.headers.get("content-type"))
    options, _ = decode_model(DeleteOptions, document, kind="DeleteOptions", mode="Ignore")
    return options


def propagation_of(options: DeleteOptions, query: str | None) -> str | None:
    """A deletion's propagationPolicy: the body's (DeleteOptions), else the query's; the old
    `orphanDependents: true` is Orphan. 400 for any other policy, naming the three."""
    policy = options.propagation_policy or query
    if policy is None and options.orphan_dependents:
        return "Orphan"
    if policy not in (None, "Orphan", "Background", "Foreground"):
        raise BadRequest(
            f'propagationPolicy "{str(policy)[:64]}" is not one of Orphan, Background, Foreground'
        )
    return policy


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:64]
