"""The settlement job's rules on plain Python data (no Spark): amounts are exact cents, a
merchant's settlement is the sum and count of its payments, records carry their batch, and a
run with no new offsets settles nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.settlement import (
    Payment,
    Settlement,
    batch_label,
    format_minor,
    pending,
    settle,
    to_minor,
)


@pytest.mark.parametrize(
    ("amount", "minor"),
    [("12.50", 1250), ("0.01", 1), ("7", 700), ("1000000.99", 100000099), (Decimal("0.1"), 10)],
)
def test_amounts_are_exact_cents(amount: str | Decimal, minor: int) -> None:
    assert to_minor(amount) == minor
    assert to_minor(format_minor(minor)) == minor


@pytest.mark.parametrize("amount", ["1.005", "NaN", "Infinity", "twelve", ""])
def test_fractions_of_a_cent_and_non_numbers_are_refused(amount: str) -> None:
    with pytest.raises(ValueError):
        to_minor(amount)


def test_sums_that_floats_would_round_are_exact() -> None:
    payments = [Payment(f"p{i}", "m-1", to_minor("0.10"), "EUR") for i in range(3)]
    [settlement] = settle(payments, "b")
    assert settlement.total_minor == 30  # 0.1 + 0.1 + 0.1 != 0.3 in binary floats
    assert format_minor(settlement.total_minor) == "0.30"


def test_payment_json_round_trips_with_a_decimal_string_amount() -> None:
    payment = Payment("pay-1", "m-007", 123456, "GBP")
    text = payment.to_json()
    assert '"amount":"1234.56"' in text
    assert Payment.from_json(text) == payment


def test_settlement_is_per_merchant_and_currency_sorted() -> None:
    payments = [
        Payment("1", "m-2", 100, "EUR"),
        Payment("2", "m-1", 250, "USD"),
        Payment("3", "m-2", 50, "EUR"),
        Payment("4", "m-1", 1, "EUR"),
    ]
    assert settle(payments, "b1") == [
        Settlement("b1", "m-1", "EUR", 1, 1),
        Settlement("b1", "m-1", "USD", 250, 1),
        Settlement("b1", "m-2", "EUR", 150, 2),
    ]


def test_settlement_json_round_trips_and_is_checked() -> None:
    settlement = Settlement("b1", "m-1", "EUR", 123450, 98)
    text = settlement.to_json()
    assert '"total":"1234.50"' in text and '"total_minor":123450' in text
    assert Settlement.from_json(text) == settlement
    forged = text.replace('"total_minor":123450', '"total_minor":123451')
    with pytest.raises(ValueError, match="differ"):
        Settlement.from_json(forged)


def test_settlement_key_tells_duplicates_apart_by_batch() -> None:
    first = Settlement("b1", "m-1", "EUR", 1, 1)
    assert first.key == Settlement("b1", "m-1", "EUR", 2, 2).key
    assert first.key != Settlement("b2", "m-1", "EUR", 1, 1).key


def test_batch_label_names_the_offset_ranges_earliest_as_zero() -> None:
    start = {"payments": {0: -2, 1: 40}}
    end = {"payments": {0: 120, 1: 98, 2: 7}}
    assert batch_label(start, end) == "payments:0@0-120,1@40-98,2@0-7"


def test_pending_counts_only_offsets_past_the_committed_positions() -> None:
    assert pending({"payments": {0: -2}}, {"payments": {0: 0}}) == 0
    assert pending({"payments": {0: 10, 1: 5}}, {"payments": {0: 10, 1: 5}}) == 0
    assert pending({"payments": {0: 10, 1: -2}}, {"payments": {0: 12, 1: 5}}) == 7
