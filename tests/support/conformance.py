"""Differential conformance (issue 38, item 3): one corpus of request sequences, sent byte by byte
to Apache Kafka and to the coordinator's Kafka listener, their answers compared field by field.

- `build` makes a request of any served API and version from the fields a step gives (fields the
  version lacks are left out, fields it needs and the step omits take their zero value), so each
  scenario runs at every version of its APIs that the listener serves (`SUPPORTED`).
- `Normaliser` rewrites what must differ between two brokers and nothing else: node and cluster
  ids, hosts, ports and log directories, throttle times, topic ids, broker clock times (log
  append times, transaction start times, control batches' timestamps), the metadata log's epoch,
  producer and member ids and client-telemetry subscription ids (numbered in the order a
  scenario meets them), and error messages
  (free text, not compared). Lists of configs and of config resources are compared sorted by
  name.
  Record sets are decoded into their batches and records.
- `differences` compares two runs of a scenario; `KNOWN` lists the differences that remain, each
  with its reason. `bench/conformance.py` runs the corpus against both brokers, writes Kafka's
  answers to `tests/kafka/conformance_kafka.json` and the findings to `docs/pages/conformance.md`;
  `tests/kafka/test_conformance.py` replays the corpus against the listener on both stores and
  holds it to Kafka's recorded answers and `KNOWN`, without a JVM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import fnmatch
import struct
import types
import typing
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from coordinator.kafka.wire import SUPPORTED, payload_type
from sdk import recordbatch
from tests.support.kafka_wire import Connection

# -- requests --------------------------------------------------------------------------------------


def build(api_key: int, version: int, fields: Mapping[str, Any]) -> Any:
    """The request of `api_key` at `version` from `fields` (nested entities as dicts, arrays as
    lists, durations in milliseconds)."""
    return _entity(payload_type(api_key, version, EntityType.request), fields)


def _entity(cls: type, values: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = _value(hints[f.name], values[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return cls(**kwargs)


def _optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def _value(hint: Any, value: Any) -> Any:
    hint, _ = _optional(hint)
    if value is None:
        return None
    if typing.get_origin(hint) is tuple:
        (item, *_) = typing.get_args(hint)
        return tuple(_value(item, v) for v in value)
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return _entity(typing.cast(type, hint), value)
    if isinstance(hint, type) and issubclass(hint, datetime.timedelta) and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    return value


def _zero(hint: Any) -> Any:
    hint, optional = _optional(hint)
    if optional:
        return None
    if typing.get_origin(hint) is tuple:
        return ()
    if dataclasses.is_dataclass(hint):
        return _entity(typing.cast(type, hint), {})
    if isinstance(hint, type):
        if issubclass(hint, bool):
            return False
        if issubclass(hint, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(hint, enum.Enum):
            return next(iter(hint))
        if issubclass(hint, uuid.UUID):
            return uuid.UUID(int=0)
        for base in (int, str, bytes):
            if issubclass(hint, base):
                return hint(base())
    raise TypeError(f"no zero value for {hint!r}")


# -- answers ---------------------------------------------------------------------------------------

NODE_FIELDS = {"node_id", "leader_id", "controller_id", "coordinator_id", "broker_id"}
NODE_LISTS = {
    "replica_nodes",
    "isr_nodes",
    "offline_replicas",
    "eligible_leader_replicas",
    "last_known_elr",
}
CLOCK_FIELDS = {"log_append_time", "transaction_start_time", "transaction_start_time_ms"}


class Normaliser:
    """A scenario's answers with what must differ between brokers rewritten (module docstring).
    Producer and member ids are numbered per scenario, in the order they are met."""

    def __init__(self) -> None:
        self.ids: dict[str, dict[Any, str]] = {}

    def label(self, kind: str, raw: Any) -> str:
        seen = self.ids.setdefault(kind, {})
        return seen.setdefault(raw, f"<{kind}#{len(seen)}>")

    def __call__(self, value: Any, name: str = "") -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self(getattr(value, f.name), f.name) for f in dataclasses.fields(value)}
        if isinstance(value, tuple | list):
            if name in NODE_LISTS:
                return ["<node>" for _ in value]
            items = [self(v, name) for v in value]
            if name == "configs" and all(isinstance(i, dict) and "name" in i for i in items):
                items.sort(key=lambda i: str(i["name"]))  # a broker lists configs in no set order
            if name == "config_resources":  # nor config resources (ListConfigResources)
                items.sort(key=lambda i: (i.get("resource_type", 0), str(i["resource_name"])))
            return items
        if isinstance(value, enum.Enum):
            return value.name
        if name == "throttle_time":
            return 0
        if name in NODE_FIELDS and isinstance(value, int) and value >= 0:
            return "<node>"
        if name in {"host", "cluster_id", "log_dir"} and value:
            return f"<{name}>"
        if name == "finalized_features_epoch":
            return "<epoch>"  # the offset of the broker's metadata log
        if name == "port":
            return "<port>"
        if name == "topic_id" and isinstance(value, uuid.UUID):
            return "<topic_id>" if value.int else str(value)
        if name == "producer_id" and isinstance(value, int) and value >= 0:
            return self.label("pid", value)
        if name == "subscription_id" and isinstance(value, int):
            return self.label("subscription", value)  # KIP-714's: opaque, the broker's own
        if name in {"member_id", "leader"} and isinstance(value, str) and value:
            return self.label("member", value)
        if name in {"error_message", "message"}:
            return "<text>"  # free text, and whether a broker gives one at all: not compared
        if name in {"records", "record_set"} and isinstance(value, bytes):
            return self.records(value)
        if isinstance(value, datetime.timedelta):
            ms = round(value.total_seconds() * 1000)
            return "<clock>" if name in CLOCK_FIELDS and ms >= 0 else ms
        if name in CLOCK_FIELDS and isinstance(value, int) and value >= 0:
            return "<clock>"
        if isinstance(value, datetime.datetime):
            return "<clock>"
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, bytes):
            return value.hex()
        return value

    def records(self, data: bytes) -> list[Any]:
        batches = []
        for pos, header in recordbatch.iter_batches(data):
            batch: dict[str, Any] = {
                "base_offset": header.base_offset,
                "last_offset_delta": header.last_offset_delta,
                "partition_leader_epoch": header.partition_leader_epoch,
                "attributes": header.attributes,
                "producer_id": self(header.producer_id, "producer_id"),
                "producer_epoch": header.producer_epoch,
                "base_sequence": header.base_sequence,
                "record_count": header.record_count,
            }
            clock = header.is_control or header.log_append_time
            batch["base_timestamp"] = "<clock>" if clock else header.base_timestamp
            batch["max_timestamp"] = "<clock>" if clock else header.max_timestamp
            batch["records"] = [
                [
                    r.offset,
                    r.key.hex() if r.key else r.key,
                    r.value.hex() if r.value else r.value,
                    [[k, v.hex() if v else v] for k, v in r.headers],
                ]
                for r in recordbatch.records(data, pos, header)
            ]
            batches.append(batch)
        return batches


# -- running a scenario ----------------------------------------------------------------------------

Connect = Callable[[], Awaitable[Connection]]
# What a coordinator answers while it loads its state: COORDINATOR_LOAD_IN_PROGRESS,
# COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, CONCURRENT_TRANSACTIONS.
_LOADING = {14, 15, 16, 51}
CLOSED = {"closed": True}


class Run:
    """One scenario against one broker: its recorded answers, in order."""

    def __init__(self, scenario: str, connect: Connect) -> None:
        self.scenario = scenario
        self._connect = connect
        self._connection: Connection | None = None
        self.normalise = Normaliser()
        self.answers: list[dict[str, Any]] = []

    def topic(self, suffix: object) -> str:
        return f"cf-{self.scenario}-{suffix}"

    @staticmethod
    def versions(api_key: int) -> range:
        low, high = SUPPORTED[api_key]
        return range(low, high + 1)

    async def connection(self) -> Connection:
        if self._connection is None:
            self._connection = await self._connect()
        return self._connection

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.writer.close()
            self._connection = None

    async def quiet(self, api_key: int, version: int, **fields: Any) -> Any:
        """A call whose answer is not compared (setting up, waiting for Kafka's metadata)."""
        connection = await self.connection()
        return await connection.request(build(api_key, version, fields))

    async def call(
        self,
        step: str,
        api_key: int,
        version: int,
        keep: Callable[[Any], Any] | None = None,
        **fields: Any,
    ) -> Any:
        """A compared call: its answer, normalised (then passed through `keep`, which may pick
        the part a scenario owns out of a cluster-wide answer), is recorded under `step`. A
        connection the broker closed is recorded as `{"closed": true}` (and opened again for the
        next step)."""
        connection = await self.connection()
        try:
            answer = await connection.request(build(api_key, version, fields))
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            self._record(step, api_key, version, CLOSED)
            return None
        except SerialError as exc:
            # An answer kio cannot read (a -1 where its schema wants a time): recorded as such.
            await self.close()
            self._record(step, api_key, version, {"unreadable": str(exc)})
            return None
        normalised = self.normalise(answer)
        self._record(step, api_key, version, keep(normalised) if keep else normalised)
        return answer

    async def raw(
        self, step: str, api_key: int, sent: int, read: int, body: bytes, flexible: bool = False
    ) -> None:
        """A request of `api_key` at version `sent` (header v1, or v2 when `flexible`; `body` as
        given), its answer read as version `read`: versions kio cannot build."""
        connection = await self.connection()
        connection.correlation += 1
        client = b"conformance"
        header = struct.pack(">hhih", api_key, sent, connection.correlation, len(client)) + client
        if flexible:
            header += b"\x00"  # no tagged fields
        try:
            await connection.send(header + body)
            answer = await connection.receive(api_key, read)
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            self._record(step, api_key, sent, CLOSED)
            return
        self._record(step, api_key, sent, self.normalise(answer))

    def _record(self, step: str, api_key: int, version: int, answer: Any) -> None:
        self.answers.append(
            {"step": step, "api_key": api_key, "version": version, "answer": answer}
        )

    async def topics(self, *names: str, partitions: int = 1, **configs: str) -> None:
        """Create topics (not compared) and wait until the broker serves them."""
        await self.quiet(
            19,
            7,
            topics=[
                {
                    "name": name,
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "configs": [{"name": k, "value": v} for k, v in configs.items()],
                }
                for name in names
            ],
            timeout=30_000,
        )
        for _ in range(200):
            answer = await self.quiet(3, 12, topics=[{"name": n} for n in names])
            # The leader serves a partition once its log is open: ListOffsets says so.
            offsets = await self.quiet(
                2,
                7,
                replica_id=-1,
                topics=[
                    {
                        "name": name,
                        "partitions": [
                            {"partition_index": i, "timestamp": -1, "current_leader_epoch": -1}
                            for i in range(partitions)
                        ],
                    }
                    for name in names
                ],
            )
            if any(p.error_code.value != 0 for t in offsets.topics for p in t.partitions):
                await asyncio.sleep(0.05)
                continue
            if all(
                t.error_code.value == 0
                and t.partitions
                and all(p.leader_id >= 0 for p in t.partitions)
                for t in answer.topics
            ):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"topics {names} never became available")

    async def init_producer(self, transactional_id: str | None) -> tuple[int, int]:
        """InitProducerId (not compared): the producer id and epoch, or an error if the broker
        refused (a corpus that goes on with -1 would compare nothing)."""
        for _ in range(400):
            answer = await self.quiet(
                22,
                4,
                transactional_id=transactional_id,
                transaction_timeout=60_000,
                producer_id=-1,
                producer_epoch=-1,
            )
            if answer.error_code.value == 0:
                return answer.producer_id, answer.producer_epoch
            if answer.error_code.value not in _LOADING:
                break
            await asyncio.sleep(0.05)
        raise RuntimeError(f"InitProducerId({transactional_id!r}): {answer.error_code}")

    async def coordinators(self, *keys: tuple[int, str]) -> None:
        """Wait until the broker coordinates these (key type, key): Kafka answers
        COORDINATOR_NOT_AVAILABLE while it makes its internal topics, and a group's calls
        NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS while its partition of them loads,
        after FindCoordinator already names the broker (not compared)."""
        groups = [key for key_type, key in keys if key_type == 0]
        for _ in range(400):
            answers = [
                await self.quiet(10, 3, key=key, key_type=key_type) for key_type, key in keys
            ]
            if all(a.error_code.value == 0 for a in answers):
                described = await self.quiet(
                    15, 5, groups=groups, include_authorized_operations=False
                )
                if all(g.error_code.value not in _LOADING for g in described.groups):
                    return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no coordinator for {keys}")

    async def settled(self, transactional_id: str) -> None:
        """Wait until the transaction is no longer preparing its end: Kafka writes its markers
        after answering EndTxn (not compared)."""
        for _ in range(400):
            try:
                answer = await self.quiet(65, 0, transactional_ids=[transactional_id])
            except SerialError:  # a -1 start time kio cannot read: not preparing
                await self.close()
                return
            if answer.transaction_states[0].transaction_state not in {
                "PrepareCommit",
                "PrepareAbort",
            }:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{transactional_id} never settled")

    async def produce(
        self, topic: str, values: list[bytes], partition: int = 0, **batch: Any
    ) -> Any:
        """Append one batch (Produce v9, acks -1; not compared)."""
        data = batch_of(values, **batch)
        return await self.quiet(
            0,
            9,
            acks=-1,
            timeout=30_000,
            topic_data=[{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
        )


# Every record the corpus writes carries a timestamp of its own, so answers do not depend on clocks.
TIMESTAMP = 1_700_000_000_000


def batch_of(values: list[bytes], **options: Any) -> bytes:
    return recordbatch.build(
        [(TIMESTAMP + i, None, value, ()) for i, value in enumerate(values)], **options
    )


Scenario = Callable[[Run], Awaitable[None]]


async def run_scenario(
    scenarios: Mapping[str, Scenario], name: str, connect: Connect
) -> list[dict[str, Any]]:
    run = Run(name, connect)
    try:
        await scenarios[name](run)
    finally:
        await run.close()
    return run.answers


# -- comparing -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Difference:
    scenario: str
    step: str
    api_key: int
    version: int
    path: str
    kafka: Any
    ours: Any

    @property
    def where(self) -> str:
        return f"{self.scenario}/{self.step}/v{self.version}{self.path}"


def differences(
    scenario: str, kafka: list[dict[str, Any]], ours: list[dict[str, Any]]
) -> list[Difference]:
    found: list[Difference] = []
    for i in range(max(len(kafka), len(ours))):
        k = kafka[i] if i < len(kafka) else None
        o = ours[i] if i < len(ours) else None
        if k is None or o is None or (k["step"], k["version"]) != (o["step"], o["version"]):
            step = (k or o or {}).get("step", "?")
            found.append(
                Difference(scenario, step, -1, (k or o or {}).get("version", -1), "", k, o)
            )
            break
        for path, a, b in _diff(k["answer"], o["answer"], ""):
            found.append(Difference(scenario, k["step"], k["api_key"], k["version"], path, a, b))
    return found


def _diff(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += _diff(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}/{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _diff(x, y, f"{path}/{i}")
        return out
    return [] if a == b else [(path, a, b)]


def explain(difference: Difference, known: list[tuple[str, str]]) -> str | None:
    """The reason `known` gives for the difference (patterns on `Difference.where`), if any."""
    for pattern, reason in known:
        if fnmatch.fnmatchcase(difference.where, pattern):
            return reason
    return None
