"""The sold-spec table and the rounding rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.specs import ComputeSpec, SpecCatalog, SpecTableError, load_catalog

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("cpu_milli", "memory_mib", "expected"),
    [
        (2000, 3584, "2-4Gi"),  # the example: 2 vCPU + 3.5 GiB
        (250, 512, "0.25-0.5Gi"),
        (250, 1536, "0.25-2Gi"),
        (250, 3072, "0.5-3Gi"),  # 0.25 vCPU sells at most 2 GiB
        (500, 8192, "1-8Gi"),  # 0.5 vCPU sells at most 4 GiB: more vCPU is needed
        (1500, 1, "1.5-2Gi"),  # memory starts at ceil(vCPU) GiB
        (1, 1, "0.25-0.5Gi"),
        (16000, 128 * 1024, "16-128Gi"),
        (16001, 1, "24-24Gi"),  # above 16 vCPU: 24, 32, 48, 64 with 1x/2x/4x/8x memory
        (24000, 25 * 1024, "24-48Gi"),
        (16000, 200 * 1024, "32-256Gi"),
        (64000, 512 * 1024, "64-512Gi"),
    ],
)
def test_round_up_examples(cpu_milli: int, memory_mib: int, expected: str) -> None:
    spec = CATALOG.round_up(cpu_milli, memory_mib)
    assert spec is not None and spec.name == expected


def test_impossible_demands_have_no_spec() -> None:
    assert CATALOG.round_up(64001, 1024) is None
    assert CATALOG.round_up(1000, 513 * 1024) is None


def test_the_table_sells_what_the_rules_say() -> None:
    specs = set(CATALOG.specs)
    for half_cores in range(1, 33):  # 0.5 .. 16 vCPU
        cpu = half_cores * 500
        low = -(-cpu // 1000)
        expected = {ComputeSpec(cpu, gib * 1024) for gib in range(low, cpu * 8 // 1000 + 1)}
        assert {s for s in specs if s.cpu_milli == cpu} == expected
    assert {s.memory_mib for s in specs if s.cpu_milli == 250} == {512, 1024, 2048}
    for cores in (24, 32, 48, 64):
        assert {s.memory_mib // 1024 for s in specs if s.cpu_milli == cores * 1000} == {
            cores * r for r in (1, 2, 4, 8)
        }
    assert {s.cpu_milli for s in specs} == {250} | {c * 500 for c in range(1, 33)} | {
        24000,
        32000,
        48000,
        64000,
    }


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64000), st.integers(1, 512 * 1024))
def test_round_up_is_the_smallest_covering_spec(cpu_milli: int, memory_mib: int) -> None:
    covering = [s for s in CATALOG.specs if s.cpu_milli >= cpu_milli and s.memory_mib >= memory_mib]
    spec = CATALOG.round_up(cpu_milli, memory_mib)
    if not covering:
        assert spec is None
    else:
        assert spec == min(covering)  # fewest vCPU, then least memory


def test_spec_names_round_trip() -> None:
    for spec in CATALOG.specs:
        assert ComputeSpec.parse(spec.name) == spec
    with pytest.raises(ValueError, match="2-4Gi"):
        ComputeSpec.parse("two-cpus")


def test_operators_can_replace_the_table(tmp_path) -> None:
    table = tmp_path / "specs.yaml"
    table.write_text("families:\n  - name: only\n    cpu: [1, 2]\n    memory_per_cpu: [4]\n")
    catalog = load_catalog(table)
    assert [s.name for s in catalog.specs] == ["1-4Gi", "2-8Gi"]
    assert catalog.round_up(1500, 1024) == ComputeSpec(2000, 8192)
    bad = tmp_path / "bad.yaml"
    bad.write_text("families:\n  - name: x\n    cpu: [1]\n")
    with pytest.raises(SpecTableError, match="memory_gib"):
        load_catalog(bad)
    assert isinstance(catalog, SpecCatalog)
