"""Ownership histories of consumer group members, and the checker that finds any partition with
two owners at the same moment.

A member owns a partition from the moment its `on_assign` starts until its `on_revoke` or
`on_lost` returned (the widest reading: what it may have read or committed), or, when it was
killed, until it was dead. Two such intervals of different members on one partition must not
overlap.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Interval:
    member: str
    partition: int
    start: int
    end: int


def read_history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def intervals(events: list[dict[str, Any]], ends: dict[str, int] | None = None) -> list[Interval]:
    """Ownership intervals from every member's events; a member still owning partitions at the
    end of its history owns them until `ends[member]` (when it was killed), else forever."""
    ends = ends or {}
    held: dict[tuple[str, int], int] = {}
    found: list[Interval] = []
    for event in sorted(events, key=lambda e: e["t"]):
        member = event["member"]
        for partition in event["partitions"]:
            key = (member, partition)
            if event["event"] == "assign" and event["edge"] == "start":
                held.setdefault(key, event["t"])
            elif event["event"] in ("revoke", "lost") and event["edge"] == "end" and key in held:
                found.append(Interval(member, partition, held.pop(key), event["t"]))
    for (member, partition), start in held.items():
        found.append(Interval(member, partition, start, ends.get(member, 2**63)))
    return found


def double_owners(found: list[Interval]) -> list[tuple[Interval, Interval]]:
    """Every pair of intervals on one partition, of different members, that overlap."""
    by_partition: defaultdict[int, list[Interval]] = defaultdict(list)
    for interval in found:
        by_partition[interval.partition].append(interval)
    clashes = []
    for spans in by_partition.values():
        spans.sort(key=lambda i: i.start)
        for i, first in enumerate(spans):
            for second in spans[i + 1 :]:
                if second.start >= first.end:
                    break
                if second.member != first.member:
                    clashes.append((first, second))
    return clashes


def owned_now(events: list[dict[str, Any]], member: str) -> set[int]:
    """What `member`'s history says it owns after its last event."""
    return {i.partition for i in intervals(events) if i.member == member and i.end == 2**63}
