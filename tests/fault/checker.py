"""Checks a fault workload's history for the anomalies exactly-once forbids (HISTORY.md) and
reports them with counts, a few examples each, and what the run did (transactions, faults)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.fault.history import Begin, Event, Fault, FaultCount, Group, Read, Txn

ANOMALIES = (
    "duplicate",
    "lost_commit",
    "aborted_read",
    "uncommitted_read",
    "torn_transaction",
    "order_violation",
    "reader_disagreement",
    "group_offset_ahead",
)
EXAMPLES_PER_KIND = 5

TxnKey = tuple[str, int]  # (producer, txn)
Partition = tuple[str, int]  # (topic, partition)
Position = tuple[str, int, int]  # (topic, partition, offset)


@dataclass
class Report:
    anomalies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in ANOMALIES})
    transactions_attempted: int = 0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    # Unknown transactions whose writes the final reads show: the ones that did commit.
    unknown_visible: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    reads: int = 0
    records_read: int = 0
    # Problems of the history itself (not of the service), e.g. two outcomes for one txn.
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())

    def add(self, kind: str, example: str) -> None:
        self.anomalies[kind] += 1
        if len(self.examples[kind]) < EXAMPLES_PER_KIND:
            self.examples[kind].append(example)

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "transactions": {
                "attempted": self.transactions_attempted,
                "committed": self.committed,
                "aborted": self.aborted,
                "unknown": self.unknown,
                "unknown_visible": self.unknown_visible,
            },
            "faults": dict(sorted(self.faults.items())),
            "anomalies": dict(self.anomalies),
            "examples": {k: list(v) for k, v in self.examples.items() if v},
            "reads": {"fetches": self.reads, "records": self.records_read},
            "warnings": list(self.warnings),
        }

    def table(self) -> str:
        rows: list[tuple[str, object]] = [
            ("transactions", ""),
            ("  attempted", self.transactions_attempted),
            ("  committed", self.committed),
            ("  aborted", self.aborted),
            ("  unknown", self.unknown),
            ("    of which visible", self.unknown_visible),
            ("reads", ""),
            ("  fetches", self.reads),
            ("  records", self.records_read),
            ("faults", "" if self.faults else "none"),
            *((f"  {kind}", n) for kind, n in sorted(self.faults.items())),
            ("anomalies", ""),
            *((f"  {kind}", n) for kind, n in self.anomalies.items()),
        ]
        width = max(len(name) for name, _ in rows) + 2
        lines = [f"{name:<{width}}{value:>8}".rstrip() for name, value in rows]
        lines.append(f"{'result':<{width}}{'ok' if self.ok else 'ANOMALIES':>8}")
        for kind, examples in self.examples.items():
            if examples:
                lines.append(f"\n{kind} ({self.anomalies[kind]}), e.g.:")
                lines.extend(f"  - {example}" for example in examples)
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        return "\n".join(lines)


@dataclass
class _Txn:
    key: TxnKey
    outcome: str
    event: Txn | None
    # Value -> (topic, partition, order within the txn). For an unknown txn this grows with the
    # values read that name it: a producer killed mid-transaction never logged its writes.
    writes: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def describe(self) -> str:
        name = f"txn {self.key[0]}-{self.key[1]}"
        e = self.event
        if e is None:
            return f"{name} (begun, never finished: unknown)"
        error = f", error {e.error}" if e.error else ""
        return f"{name} (tid {e.tid}, pid {e.pid}, epoch {e.epoch}, {self.outcome}{error})"


@dataclass
class _Seen:
    """Where a value was read: its first reading, for examples."""

    position: Position
    read: Read


def check(events: Iterable[Event]) -> Report:
    """The anomalies of HISTORY.md in `events` (from any number of processes, in any order
    between processes). Where HISTORY.md leaves room, the checker decides:

    - a `begin` with no `txn` event is an `unknown` txn; a runner's `unknown` yields to the
      producer's own committed/aborted event for the same (producer, txn);
    - a value read that no txn event lists but that names (`"{producer}-{txn}-{i}"`) an unknown
      txn is that txn's (a killed producer never logged its writes), one naming an aborted txn
      is an aborted read; any other unlisted value is an uncommitted read;
    - `torn_transaction` is about committed and unknown txns (an aborted one seen at all is an
      `aborted_read`); a committed txn partly visible is also a `lost_commit`;
    - `lost_commit` also covers a value of an unknown txn that a read returned and the final
      reads lack, and a group offset that went back or ended behind the offset of the last
      acknowledged commit that carried one (once per group partition);
    - a read with `offset` and `next_offset` that lacks a committed record another read returned
      in that range is a `reader_disagreement`, like two values at one offset.
    Counts are of distinct values, positions, txns or group offsets, not of reads."""
    report = Report()
    txn_events: list[Txn] = []
    begins: list[Begin] = []
    reads: list[Read] = []
    groups: list[Group] = []
    for event in events:
        match event:
            case Txn():
                txn_events.append(event)
            case Begin():
                begins.append(event)
            case Read():
                reads.append(event)
            case Group():
                groups.append(event)
            case Fault():
                report.faults[event.fault] = report.faults.get(event.fault, 0) + 1
            case FaultCount():
                report.faults[event.fault] = report.faults.get(event.fault, 0) + event.count

    txns, owner_of = _transactions(txn_events, begins, report)
    report.transactions_attempted = len(txns)
    outcomes = Counter(t.outcome for t in txns.values())
    report.committed, report.aborted, report.unknown = (
        outcomes["committed"],
        outcomes["aborted"],
        outcomes["unknown"],
    )

    view = _View(reads, report)
    final = view.final_values
    owners = _attribute(view, txns, owner_of, report)

    for txn in txns.values():
        visible = [v for v in txn.writes if v in final]
        if txn.outcome == "unknown" and visible:
            report.unknown_visible += 1
        if txn.outcome == "committed":
            for value, (topic, partition, _) in txn.writes.items():
                if value not in final:
                    report.add(
                        "lost_commit",
                        f"{value} of {txn.describe()} on {topic}/{partition}: "
                        "not in any final read",
                    )
        elif txn.outcome == "unknown":
            for value in txn.writes:
                if value not in final and value in view.first_seen:
                    seen = view.first_seen[value]
                    report.add(
                        "lost_commit",
                        f"{value} of {txn.describe()}: read by {_where(seen)} "
                        "but not in any final read",
                    )
        if txn.outcome != "aborted" and 0 < len(visible) < len(txn.writes):
            missing = [v for v in txn.writes if v not in final]
            report.add(
                "torn_transaction",
                f"{txn.describe()}: final reads show {_few(visible)} but not {_few(missing)}",
            )

    _check_order(view, owners, txns, report)
    _check_groups(groups, txns, final, report)
    return report


def _transactions(
    txn_events: list[Txn], begins: list[Begin], report: Report
) -> tuple[dict[TxnKey, _Txn], dict[str, TxnKey]]:
    txns: dict[TxnKey, _Txn] = {}
    for event in txn_events:
        key = (event.producer, event.txn)
        txn = txns.get(key)
        if txn is None:
            txn = txns[key] = _Txn(key, event.outcome, event)
        elif event.outcome != txn.outcome:
            # The runner's `unknown` for a txn whose producer did log its end loses to the end.
            if txn.outcome == "unknown":
                txn.outcome, txn.event = event.outcome, event
            elif event.outcome != "unknown":
                report.warnings.append(
                    f"txn {key[0]}-{key[1]} logged as both {txn.outcome} and {event.outcome}"
                )
        for index, write in enumerate(event.writes):
            txn.writes.setdefault(
                write.value, (write.topic, write.partition, _order(write.value, key, index))
            )
    for begin in begins:
        key = (begin.producer, begin.txn)
        if key not in txns:
            txns[key] = _Txn(key, "unknown", None)
    owner_of: dict[str, TxnKey] = {}
    for txn in txns.values():
        for value in txn.writes:
            other = owner_of.setdefault(value, txn.key)
            if other != txn.key:
                report.warnings.append(f"value {value} listed by txn {other} and txn {txn.key}")
    return txns, owner_of


class _View:
    """Everything the reads returned, indexed by value and by position."""

    def __init__(self, reads: list[Read], report: Report) -> None:
        self.first_seen: dict[str, _Seen] = {}
        self.positions: dict[str, dict[Position, Read]] = defaultdict(dict)
        self.at: dict[Position, tuple[str | None, Read]] = {}
        self.conflicts: dict[Position, dict[str | None, Read]] = {}
        self.final_values: set[str] = set()
        self.beyond_lso: dict[Position, tuple[str | None, Read]] = {}
        for read in reads:
            report.reads += 1
            report.records_read += len(read.records)
            lso = read.last_stable_offset
            for offset, value in read.records:
                position = (read.topic, read.partition, offset)
                if lso is not None and offset >= lso:
                    self.beyond_lso.setdefault(position, (value, read))
                first = self.at.setdefault(position, (value, read))
                if first[0] != value:
                    conflict = self.conflicts.setdefault(position, {first[0]: first[1]})
                    conflict.setdefault(value, read)
                if value is None:
                    continue
                self.positions[value].setdefault(position, read)
                self.first_seen.setdefault(value, _Seen(position, read))
                if read.phase == "final":
                    self.final_values.add(value)
        self.reads = reads

    def partitions(self) -> dict[Partition, list[int]]:
        """Each partition's offsets that some read returned, in order."""
        offsets: dict[Partition, list[int]] = defaultdict(list)
        for topic, partition, offset in self.at:
            offsets[(topic, partition)].append(offset)
        for values in offsets.values():
            values.sort()
        return offsets


def _attribute(
    view: _View, txns: dict[TxnKey, _Txn], owner_of: dict[str, TxnKey], report: Report
) -> dict[str, TxnKey]:
    """The txn each value read belongs to, reporting those that belong to none or to an aborted
    one, and every position two reads disagree on or one read took at or beyond its LSO."""
    owners: dict[str, TxnKey] = {}
    for value, seen in view.first_seen.items():
        key = owner_of.get(value)
        if key is None:
            named = _parse(value)
            txn = txns.get(named[:2]) if named else None
            if txn is not None and txn.outcome != "committed":
                key = txn.key
                if txn.outcome == "unknown":
                    txn.writes[value] = (*seen.position[:2], _order(value, key, 0))
        if key is None:
            report.add(
                "uncommitted_read",
                f"{value} read by {_where(seen)}: no txn wrote it",
            )
            continue
        owners[value] = key
        if txns[key].outcome == "aborted":
            report.add(
                "aborted_read",
                f"{value} of {txns[key].describe()} read by {_where(seen)}",
            )
    for value, positions in view.positions.items():
        if len(positions) > 1:
            where = ", ".join(
                f"{_pos(p)} ({read.reader} {read.phase})" for p, read in positions.items()
            )
            report.add("duplicate", f"{value} at {len(positions)} offsets: {where}")
    for position, (early, read) in view.beyond_lso.items():
        report.add(
            "uncommitted_read",
            f"{early} at {_pos(position)} read by {read.reader} ({read.phase}, t={read.t}) "
            f"at or beyond that read's last_stable_offset {read.last_stable_offset}",
        )
    for position, by_value in view.conflicts.items():
        where = ", ".join(f"{read.reader} ({read.phase}) read {v}" for v, read in by_value.items())
        report.add("reader_disagreement", f"{_pos(position)}: {where}")
    _check_coverage(view, owners, txns, report)
    return owners


def _check_coverage(
    view: _View, owners: dict[str, TxnKey], txns: dict[TxnKey, _Txn], report: Report
) -> None:
    """A read that says it covered [offset, next_offset) but skipped a committed record there
    that another read returned disagrees with that read."""
    offsets = view.partitions()
    for read in view.reads:
        if read.offset is None or read.next_offset is None:
            continue
        known = offsets.get((read.topic, read.partition), [])
        returned = {offset for offset, _ in read.records}
        start = bisect_left(known, read.offset)
        end = bisect_left(known, read.next_offset)
        for offset in known[start:end]:
            if offset in returned:
                continue
            position = (read.topic, read.partition, offset)
            value, other = view.at[position]
            key = owners.get(value) if value is not None else None
            if key is None or txns[key].outcome == "aborted":
                continue  # a record that should not be read at all: reported as such
            report.add(
                "reader_disagreement",
                f"{_pos(position)}: {other.reader} ({other.phase}) read {value}, "
                f"{read.reader} ({read.phase}, t={read.t}) read "
                f"[{read.offset}, {read.next_offset}) without it",
            )


def _check_order(
    view: _View, owners: dict[str, TxnKey], txns: dict[TxnKey, _Txn], report: Report
) -> None:
    """Within a partition, each producer's visible values come in (txn, i) order."""
    for (topic, partition), offsets in view.partitions().items():
        last: dict[str, tuple[tuple[int, int], str, int]] = {}
        seen: set[str] = set()
        for offset in offsets:
            value = view.at[(topic, partition, offset)][0]
            if value is None or value in seen:
                continue  # a second copy is a duplicate, not also an order violation
            seen.add(value)
            key = owners.get(value)
            if key is None or txns[key].outcome == "aborted":
                continue
            producer, number = key
            order = (number, txns[key].writes[value][2])
            previous = last.get(producer)
            if previous is not None and order <= previous[0]:
                report.add(
                    "order_violation",
                    f"{topic}/{partition}: {previous[1]} at offset {previous[2]} "
                    f"before {value} at offset {offset}",
                )
            last[producer] = (order, value, offset)


def _check_groups(
    groups: list[Group], txns: dict[TxnKey, _Txn], final: set[str], report: Report
) -> None:
    """A committed group offset names (in its metadata) the txn that committed it: that txn
    must have committed, all its writes visible. It never goes back, and at the end it is at
    least the offset of the last acknowledged commit that carried one."""
    checked: set[tuple[str, str, int, str]] = set()
    for group in groups:
        if not group.metadata:
            continue
        where = (group.group, group.topic, group.partition, group.metadata)
        if where in checked:
            continue
        checked.add(where)
        # confluent-kafka (the Kafka door's producers) sends metadata with its C string's
        # terminating NUL, which Kafka, and this service, keep as part of the text.
        named = _parse(group.metadata.rstrip("\0"), parts=2)
        txn = txns.get((named[0], named[1])) if named else None
        seen = f"{group.group} {group.topic}/{group.partition} at {group.offset} ({group.phase})"
        if txn is None:
            report.add("group_offset_ahead", f"{seen}: metadata {group.metadata} names no txn")
        elif txn.outcome == "aborted":
            report.add("group_offset_ahead", f"{seen}: from {txn.describe()}")
        else:
            missing = [v for v in txn.writes if v not in final]
            if missing:
                report.add(
                    "group_offset_ahead",
                    f"{seen}: from {txn.describe()} whose {_few(missing)} the final reads lack",
                )

    # A group partition whose committed offset got lost counts once, however often it shows.
    lost: dict[tuple[str, str, int], str] = {}
    latest: dict[tuple[str, str, str, int], Group] = {}
    for group in sorted(groups, key=lambda g: g.t or 0.0):
        where4 = (group.process or "", group.group, group.topic, group.partition)
        before = latest.get(where4)
        if before is not None and group.offset < before.offset:
            lost.setdefault(
                where4[1:],
                f"{group.group} {group.topic}/{group.partition} went back from {before.offset} "
                f"({before.metadata}, t={before.t}) to {group.offset} "
                f"({group.metadata}, t={group.t}) as seen by {group.process}",
            )
        latest[where4] = group

    acknowledged: dict[tuple[str, str, int], tuple[int, _Txn]] = {}
    for txn in txns.values():
        if txn.outcome != "committed" or txn.event is None:
            continue
        for sent in txn.event.offsets:
            where3 = (sent.group, sent.topic, sent.partition)
            if where3 not in acknowledged or sent.offset > acknowledged[where3][0]:
                acknowledged[where3] = (sent.offset, txn)
    for group in groups:
        where3 = (group.group, group.topic, group.partition)
        expected = acknowledged.get(where3)
        if group.phase == "final" and expected is not None and group.offset < expected[0]:
            lost.setdefault(
                where3,
                f"{group.group} {group.topic}/{group.partition} ends at {group.offset} "
                f"({group.metadata}) behind {expected[0]} of {expected[1].describe()}",
            )
    for example in lost.values():
        report.add("lost_commit", example)


def _parse(value: str, parts: int = 3) -> tuple[str, int, int] | None:
    """`"{producer}-{txn}-{i}"` (or `"{producer}-{txn}"` with parts=2) as (producer, txn, i)."""
    pieces = value.rsplit("-", parts - 1)
    if len(pieces) != parts or not all(p.isdigit() for p in pieces[1:]):
        return None
    return pieces[0], int(pieces[1]), int(pieces[2]) if parts == 3 else 0


def _order(value: str, key: TxnKey, index: int) -> int:
    """A value's place in its txn's produce order: its `i`, else its index in the txn's writes."""
    named = _parse(value)
    return named[2] if named is not None and named[:2] == key else index


def _pos(position: Position) -> str:
    return f"{position[0]}/{position[1]}@{position[2]}"


def _where(seen: _Seen) -> str:
    read = seen.read
    return f"{read.reader} ({read.phase}, t={read.t}) at {_pos(seen.position)}"


def _few(values: list[str], limit: int = 3) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")
