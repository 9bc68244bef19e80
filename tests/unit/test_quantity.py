from decimal import Decimal

import pytest

from app.kube.quantity import QuantityError, format_mib, parse_quantity, to_mib, to_milli


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        (2, Decimal(2)),
        (0.25, Decimal("0.25")),
        ("20Gi", Decimal(20 * 2**30)),
        ("512Mi", Decimal(512 * 2**20)),
        ("1e3", Decimal(1000)),
        ("1k", Decimal(1000)),
        ("1G", Decimal(10**9)),
        (".5", Decimal("0.5")),
    ],
)
def test_parse(text, value) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "5 Gi", "1Gb", True, float("nan")])
def test_parse_rejects_with_a_hint(text) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_conversions_round_up() -> None:
    assert to_milli(parse_quantity("1.0001")) == 1001
    assert to_mib(parse_quantity("1G")) == 954
    assert (
        format_mib(3584) == "3.5Gi"
        and format_mib(100) == "100Mi"
        and format_mib(81920) == "80Gi"
        and format_mib(0) == "0"
    )


def test_quantities_are_bounded_like_kubernetes() -> None:
    """At most 2^63-1 and 64 characters; huge exponents never expand (they used to hang or
    overflow), and booleans are not quantities."""
    import pytest

    from app.kube.quantity import MAX_QUANTITY, QuantityError, parse_quantity

    assert parse_quantity("9223372036854775807") == MAX_QUANTITY
    assert parse_quantity("1e-40") > 0  # tiny, but still rounds up to one unit
    for bad in (
        "1e999999999",
        "1e999",
        "9223372036854775808",
        "8Ei",
        "1" * 65,
        True,
        2**63,
        1e300,
        "2\n3",
    ):
        with pytest.raises(QuantityError):
            parse_quantity(bad)
