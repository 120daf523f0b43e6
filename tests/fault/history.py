"""The fault workload's history: one typed event per line of a JSON Lines file (HISTORY.md),
written by a thread- and process-safe `Recorder` and read back by `load`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias, TypeVar

import orjson

Outcome: TypeAlias = Literal["committed", "aborted", "unknown"]
Phase: TypeAlias = Literal["live", "final"]
OUTCOMES: tuple[Outcome, ...] = ("committed", "aborted", "unknown")
PHASES: tuple[Phase, ...] = ("live", "final")


@dataclass(frozen=True, slots=True, kw_only=True)
class Write:
    """One record a transaction produced: its value is `"{producer}-{txn}-{i}"`."""

    topic: str
    partition: int
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SentOffset:
    """One group offset a transaction sent with send_offsets_to_transaction."""

    group: str
    topic: str
    partition: int
    offset: int
    metadata: str | None = None


# `t` and `process` are filled in by the Recorder when left None; loaded events always have them.


@dataclass(frozen=True, slots=True, kw_only=True)
class Txn:
    kind: ClassVar[str] = "txn"
    producer: str
    txn: int
    outcome: Outcome
    tid: str | None = None
    pid: int | None = None
    epoch: int | None = None
    writes: list[Write] = field(default_factory=list)
    offsets: list[SentOffset] = field(default_factory=list)
    error: str | None = None
    process: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Begin:
    kind: ClassVar[str] = "begin"
    producer: str
    txn: int
    process: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    """A read_committed fetch that returned records. `offset` (where the fetch started) and
    `next_offset` (from the answer) are optional; given both, the read claims to have returned
    every committed record in [offset, next_offset), which lets the checker catch a skipped one."""

    kind: ClassVar[str] = "read"
    reader: str
    phase: Phase
    topic: str
    partition: int
    records: Sequence[tuple[int, str | None]]
    last_stable_offset: int | None = None
    high_watermark: int | None = None
    offset: int | None = None
    next_offset: int | None = None
    process: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """A committed group offset observed; `offset` -1 and `metadata` None: the group had none."""

    kind: ClassVar[str] = "group"
    group: str
    topic: str
    partition: int
    offset: int
    metadata: str | None
    phase: Phase
    process: str | None = None
    t: float | None = None

    @classmethod
    def observed(cls, group: str, entry: Mapping[str, Any], phase: Phase) -> Group:
        """From an entry of `GET /v1/groups/{group}/offsets`."""
        return cls(
            group=group,
            topic=entry["topic"],
            partition=entry["partition"],
            offset=entry["offset"],
            metadata=entry.get("metadata"),
            phase=phase,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    kind: ClassVar[str] = "fault"
    fault: str
    detail: dict[str, Any] = field(default_factory=dict)
    process: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultCount:
    """A summary of `count` faults of one kind (the proxy writes these instead of one each)."""

    kind: ClassVar[str] = "fault-count"
    fault: str
    count: int
    process: str | None = None
    t: float | None = None


Event: TypeAlias = Txn | Begin | Read | Group | Fault | FaultCount
E = TypeVar("E", Txn, Begin, Read, Group, Fault, FaultCount)


def to_json(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, **asdict(event)}


def from_json(obj: dict[str, Any]) -> Event | None:
    """The event of one decoded line; None for a kind this version does not know."""
    data = {k: v for k, v in obj.items() if k != "kind"}
    match obj.get("kind"):
        case "txn":
            data["writes"] = [Write(**w) for w in data.get("writes") or []]
            data["offsets"] = [SentOffset(**o) for o in data.get("offsets") or []]
            return _build(Txn, data)
        case "begin":
            return _build(Begin, data)
        case "read":
            data["records"] = [(int(o), v) for o, v in data["records"]]
            return _build(Read, data)
        case "group":
            return _build(Group, data)
        case "fault":
            data["detail"] = data.get("detail") or {}
            return _build(Fault, data)
        case "fault-count":
            return _build(FaultCount, data)
        case _:
            return None


def _build(cls: type[E], data: dict[str, Any]) -> E:
    # Fields a later writer adds are ignored rather than fatal: the history outlives the code.
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


class Recorder:
    """Appends events to `path`, one JSON line per `os.write` on an O_APPEND descriptor, so
    threads (serialised by a lock) and processes appending to the same file never split a line.

    `t` is `clock() - origin` (by default monotonic seconds since the recorder was made); pass
    `clock=time.time, origin=run_start` to put several processes on one time line."""

    def __init__(
        self,
        path: str | Path,
        process: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        origin: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.process = process
        self._clock = clock
        self._origin = clock() if origin is None else origin
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def now(self) -> float:
        return self._clock() - self._origin

    def record(self, event: Event) -> None:
        obj = to_json(event)
        if obj["process"] is None:
            obj["process"] = self.process
        with self._lock:
            if obj["t"] is None:
                # Taken under the lock so one recorder's lines are in time order.
                obj["t"] = round(self.now(), 6)
            line = orjson.dumps(obj) + b"\n"
            if self._fd is None:
                raise ValueError(f"recorder for {self.path} is closed")
            written = os.write(self._fd, line)
            while written < len(line):  # only on a full disk or a signal; never seen in practice
                written += os.write(self._fd, line[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(paths: str | Path | Iterable[str | Path]) -> list[Event]:
    """The events of one or more history files, file by file in line order.

    A last line without its newline that does not parse is what a SIGKILL leaves: skipped. Any
    other line that does not parse is an error naming the file and line."""
    if isinstance(paths, str | Path):
        paths = [paths]
    events: list[Event] = []
    for path in paths:
        data = Path(path).read_bytes()
        lines = data.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                event = from_json(orjson.loads(line))
            except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                if number == len(lines):  # no newline after it: cut short by a kill
                    break
                raise ValueError(f"{path}:{number}: not a history event: {exc}") from exc
            if event is not None:
                events.append(event)
    return events
