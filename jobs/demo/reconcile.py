"""The settlements read back against totals computed from what was generated."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from jobs.settlement import (
    Settlement,
)

# -- reconciliation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MerchantLine:
    merchant: str
    currency: str
    expected_minor: int
    expected_count: int
    settled_minor: int
    settled_count: int

    @property
    def ok(self) -> bool:
        return (self.expected_minor, self.expected_count) == (
            self.settled_minor,
            self.settled_count,
        )


@dataclass
class Reconciliation:
    """Settlements read back against the ones the generated payments call for."""

    lines: list[MerchantLine]
    records: int
    duplicates: int  # records whose (batch, merchant, currency) appeared before
    missing: int  # expected records absent
    unexpected: int  # records no batch calls for (e.g. a batch that should not exist)
    wrong: int  # records present once but with another total or count

    @property
    def merchants_wrong(self) -> int:
        return sum(not line.ok for line in self.lines)

    @property
    def mismatches(self) -> int:
        return self.merchants_wrong + self.duplicates + self.missing + self.unexpected + self.wrong


def reconcile(expected: Sequence[Settlement], settled: Sequence[Settlement]) -> Reconciliation:
    wanted = {s.key: s for s in expected}
    seen: Counter[tuple[str, str, str]] = Counter(s.key for s in settled)
    duplicates = sum(n - 1 for n in seen.values())
    missing = sum(1 for key in wanted if key not in seen)
    unexpected = sum(1 for key in seen if key not in wanted)
    first: dict[tuple[str, str, str], Settlement] = {}
    for s in settled:
        first.setdefault(s.key, s)
    wrong = sum(1 for key, s in first.items() if key in wanted and s != wanted[key])

    totals: dict[tuple[str, str], list[int]] = {}
    for which, records in ((0, expected), (1, settled)):
        for s in records:
            tally = totals.setdefault((s.merchant, s.currency), [0, 0, 0, 0])
            tally[2 * which] += s.total_minor
            tally[2 * which + 1] += s.count
    lines = [
        MerchantLine(merchant, currency, *tally)
        for (merchant, currency), tally in sorted(totals.items())
    ]
    return Reconciliation(lines, len(settled), duplicates, missing, unexpected, wrong)
