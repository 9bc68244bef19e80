"""Billing kinds as the API documents them (`billing.tessera.io/v1`).

The models check the shape (and refuse or warn about unknown fields, as `fieldValidation`
asks); the values are checked by `billing.prices.parse` and `app.billing_api.service`, which
name every bad field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta

Amount = str  # a decimal string, e.g. "0.04": money is never a float


class ComputeRates(KubeModel):
    vcpu_hour: Amount = Field(max_length=32, description="List price of one vCPU for an hour.")
    memory_gi_b_hour: Amount = Field(
        max_length=32, alias="memoryGiBHour", description="List price of 1 GiB for an hour."
    )


class GPURates(KubeModel):
    vram_gi_b_hour: Amount = Field(
        max_length=32, alias="vramGiBHour", description="1 GiB of VRAM for an hour."
    )
    sm_percent_hour: Amount = Field(max_length=32, description="1 % of the SMs for an hour.")


class Tier(KubeModel):
    min_per_day: Amount = Field(max_length=32, description="Daily commitment that reaches it.")
    discount: Amount = Field(max_length=32, description="Fraction off list price, e.g. 0.1.")


class PriceSpec(KubeModel):
    effective_from: str | None = Field(
        default=None,
        max_length=64,
        description="RFC 3339, whole seconds; not in the past. Default: the moment it is created.",
    )
    currency: str | None = Field(default=None, max_length=3)
    best_effort_fraction: Amount | None = Field(
        default=None, max_length=32, description="What BestEffort pods pay (default 0.2)."
    )
    compute: dict[str, ComputeRates] = Field(
        description="Per compute class: general-purpose, performance, gpu."
    )
    gpus: dict[str, GPURates] = Field(description='Per GPU model, "*" for any other.')
    commitment_tiers: list[Tier] = Field(default_factory=list, max_length=16)


class Price(KubeModel):
    """One version of the price book: immutable, in effect from spec.effectiveFrom until the
    next version's."""

    api_version: Literal["billing.tessera.io/v1"] | None = "billing.tessera.io/v1"
    kind: Literal["Price"] | None = "Price"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PriceSpec
    status: dict[str, object] | None = None


class PriceList(KubeModel):
    api_version: Literal["billing.tessera.io/v1"] = "billing.tessera.io/v1"
    kind: Literal["PriceList"] = "PriceList"
    metadata: ListMeta
    items: list[Price]


def _whole_as_text(value: object) -> object:
    """A whole number as its text (YAML's `amountPerDay: 20`); anything else as it is (a
    boolean is refused as not a string)."""
    return str(value) if type(value) is int else value


class CommitmentSpec(KubeModel):
    amount_per_day: Annotated[Amount, BeforeValidator(_whole_as_text)] = Field(
        max_length=32,
        description=(
            'What the tenant commits to per UTC day, in the currency: a decimal string ("100.00"; '
            "a whole number is taken too)."
        ),
    )


class Commitment(KubeModel):
    """A tenant's daily commitment plan: a new plan starts at the next UTC day; a raise counts
    from today, a lowering (or deleting it) from tomorrow."""

    api_version: Literal["billing.tessera.io/v1"] | None = "billing.tessera.io/v1"
    kind: Literal["Commitment"] | None = "Commitment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: CommitmentSpec
    status: dict[str, object] | None = None


class CommitmentList(KubeModel):
    api_version: Literal["billing.tessera.io/v1"] = "billing.tessera.io/v1"
    kind: Literal["CommitmentList"] = "CommitmentList"
    metadata: ListMeta
    items: list[Commitment]


class Statement(KubeModel):
    """A tenant's statement of one UTC day (named YYYY-MM-DD): Provisional while the day is
    open, Closed and final once it is over."""

    api_version: Literal["billing.tessera.io/v1"] = "billing.tessera.io/v1"
    kind: Literal["Statement"] = "Statement"
    metadata: ObjectMeta
    status: dict[str, object]


class StatementList(KubeModel):
    api_version: Literal["billing.tessera.io/v1"] = "billing.tessera.io/v1"
    kind: Literal["StatementList"] = "StatementList"
    metadata: ListMeta
    items: list[Statement]


class UsageRow(KubeModel):
    """One time bucket of one group; only the keys named in `groupBy` are present."""

    start: str
    end: str
    pod: str | None = None
    namespace: str | None = None
    resource: str | None = None
    class_: str | None = Field(default=None, alias="class")
    qos: str | None = None
    gpu_model: str | None = None
    quantities: dict[str, str] = Field(description="Unit-seconds per resource.")
    amount: str = Field(description="At list (or BestEffort) price, 6 decimal places.")


class UsageList(KubeModel):
    """Usage rows by time bucket and group; `text/csv` gives the same rows as CSV."""

    api_version: Literal["billing.tessera.io/v1"] = "billing.tessera.io/v1"
    kind: Literal["UsageList"] = "UsageList"
    metadata: ListMeta
    currency: str
    from_: str = Field(alias="from", description="The report's start (RFC 3339, UTC).")
    to: str = Field(description="The report's end (RFC 3339, UTC), exclusive.")
    granularity: str
    group_by: list[str]
    items: list[UsageRow]
    total: dict[str, object]
