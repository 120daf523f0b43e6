"""The payments the demo generates: merchants, currencies, amounts, and the waves they come in."""

from __future__ import annotations

import random
from collections.abc import Sequence

from jobs.demo.common import CURRENCIES
from jobs.settlement import (
    Payment,
)

# -- payments ----------------------------------------------------------------------------------


def merchant_names(count: int) -> list[str]:
    return [f"m-{i:03d}" for i in range(1, count + 1)]


def currency_of(merchant: str) -> str:
    """Each merchant settles in one currency."""
    return CURRENCIES[int(merchant.removeprefix("m-")) % len(CURRENCIES)]


def generate_payments(events: int, merchants: int, seed: int) -> list[Payment]:
    """`events` payments for `merchants` merchants, some busier than others; the same seed
    gives the same payments. Amounts 0.50 .. 500.00, in cents."""
    rng = random.Random(seed)
    names = merchant_names(merchants)
    weights = [1.0 / (rank + 1) ** 0.5 for rank in range(merchants)]
    chosen = rng.choices(names, weights=weights, k=events)
    return [
        Payment(f"pay-{seed}-{i:06d}", merchant, rng.randint(50, 50_000), currency_of(merchant))
        for i, merchant in enumerate(chosen)
    ]


def waves(payments: Sequence[Payment], rounds: int) -> list[list[Payment]]:
    """The payments split into `rounds` consecutive waves, one settlement run after each."""
    size = -(-len(payments) // rounds)
    return [list(payments[i : i + size]) for i in range(0, len(payments), size)]
