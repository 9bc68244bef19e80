"""Query parameters of the Kubernetes API, declared once and reused by every router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Query

from app.kube.lists import check_limit, check_resource_version_match, parse_resource_version
from app.kube.meta import INT64_MAX
from app.kube.selectors import (
    FieldRequirement,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)

LabelSelectorQ = Annotated[
    str | None,
    Query(alias="labelSelector", description="Label selector, e.g. `app=web,tier!=db`."),
]
FieldSelectorQ = Annotated[
    str | None,
    Query(alias="fieldSelector", description="Field selector, e.g. `status.phase=Pending`."),
]
LimitQ = Annotated[
    int | None,
    Query(
        ge=0, le=INT64_MAX, description="Page size; follow `metadata.continue` for the next page."
    ),
]
ContinueQ = Annotated[
    str | None, Query(alias="continue", description="Token from the previous page.")
]
WatchQ = Annotated[
    bool | None, Query(description="Stream ADDED/MODIFIED/DELETED events instead of a list.")
]
ResourceVersionQ = Annotated[
    str | None,
    Query(alias="resourceVersion", description="For watch: send changes after this version."),
]
ResourceVersionMatchQ = Annotated[str | None, Query(alias="resourceVersionMatch")]
TimeoutSecondsQ = Annotated[int | None, Query(alias="timeoutSeconds", ge=0, le=INT64_MAX)]
AllowBookmarksQ = Annotated[bool | None, Query(alias="allowWatchBookmarks")]
SendInitialEventsQ = Annotated[bool | None, Query(alias="sendInitialEvents")]
FieldValidationQ = Annotated[
    Literal["Strict", "Warn", "Ignore"] | None,
    Query(
        alias="fieldValidation",
        description="What an unknown field does: Strict refuses the request, Warn (default) "
        "drops it with a Warning header, Ignore drops it silently.",
    ),
]
DryRunQ = Annotated[
    Literal["All"] | None,
    Query(alias="dryRun", description="`All`: validate and answer without saving."),
]
FieldManagerQ = Annotated[str | None, Query(alias="fieldManager")]
ForceQ = Annotated[bool | None, Query()]
GracePeriodQ = Annotated[int | None, Query(alias="gracePeriodSeconds", ge=0, le=INT64_MAX)]
PropagationPolicyQ = Annotated[
    Literal["Orphan", "Background", "Foreground"] | None,
    Query(
        alias="propagationPolicy",
        description="What happens to the object's dependents (those whose ownerReferences name "
        "it): Background (the default) deletes the object now and its dependents after; "
        "Foreground deletes the dependents first while the object waits, marked, with the "
        "foregroundDeletion finalizer; Orphan leaves them, without the reference.",
    ),
]
PrettyQ = Annotated[str | None, Query(description="Ignored (responses are compact JSON).")]


@dataclass(frozen=True)
class ListQuery:
    """The query of a list (or watch) request, parsed once."""

    labels: LabelSelector
    field_selector: str | None
    limit: int | None
    continue_token: str | None
    watch: bool
    resource_version: str | None
    timeout_seconds: int | None
    bookmarks: bool

    def fields(self, supported: tuple[str, ...]) -> list[FieldRequirement]:
        return parse_field_selector(self.field_selector, supported)


async def list_query(
    label_selector: LabelSelectorQ = None,
    field_selector: FieldSelectorQ = None,
    limit: LimitQ = None,
    continue_: ContinueQ = None,
    watch: WatchQ = None,
    resource_version: ResourceVersionQ = None,
    resource_version_match: ResourceVersionMatchQ = None,
    timeout_seconds: TimeoutSecondsQ = None,
    allow_watch_bookmarks: AllowBookmarksQ = None,
    send_initial_events: SendInitialEventsQ = None,
    pretty: PrettyQ = None,
) -> ListQuery:
    parse_resource_version(resource_version)
    check_resource_version_match(resource_version_match, resource_version, watch=bool(watch))
    return ListQuery(
        labels=parse_label_selector(label_selector),
        field_selector=field_selector,
        limit=check_limit(limit),
        continue_token=continue_,
        watch=bool(watch),
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        bookmarks=bool(allow_watch_bookmarks),
    )


ListQueryDep = Annotated[ListQuery, Depends(list_query)]
