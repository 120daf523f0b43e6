"""SQL both engines write the same way."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, or_


def pairs_in(first: Any, second: Any, pairs: Iterable[tuple[Any, Any]]) -> Any:
    """`(first, second) IN pairs` as one `first = a AND second IN (...)` per distinct `a`: Postgres
    plans a row-value IN list as nested comparisons, and a few thousand pairs (a topic's
    partitions) exhaust its stack. `pairs` must not be empty."""
    grouped: dict[Any, list[Any]] = {}
    for a, b in pairs:
        grouped.setdefault(a, []).append(b)
    return or_(*(and_(first == a, second.in_(bs)) for a, bs in grouped.items()))
