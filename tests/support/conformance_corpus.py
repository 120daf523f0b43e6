# ruff: noqa: B023  (each step's helpers run within their loop iteration)
"""The differential corpus (`tests.support.conformance`): request sequences over every API the
listener serves, each at every version it serves, happy paths and the errors Kafka's broker
names; and `KNOWN`, the differences from Kafka that remain, each with its reason.

Each scenario works in topics, transactional ids and groups of its own (named after it), so the
scenarios may run in any order against one broker.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

from opentelemetry.proto.metrics.v1 import metrics_pb2 as otlp

from tests.support.conformance import TIMESTAMP, Run, Scenario, batch_of

SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__.replace("_", "-")] = fn
    return fn


def _committing(topic: str, offset: int, metadata: str) -> list[dict[str, Any]]:
    """An offset commit's topics (OffsetCommit, TxnOffsetCommit): partition 0 at `offset`."""
    return [
        {
            "name": topic,
            "partitions": [
                {
                    "partition_index": 0,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": metadata,
                }
            ],
        }
    ]


def _topic_data(topic: str, data: bytes, partition: int = 0) -> list[dict[str, Any]]:
    return [{"name": topic, "partition_data": [{"index": partition, "records": data}]}]


# -- cluster ---------------------------------------------------------------------------------------


@scenario
async def api_versions(r: Run) -> None:
    for v in r.versions(18):
        await r.call(
            "supported", 18, v, client_software_name="conformance", client_software_version="1.0"
        )
    # A version the broker does not know, as clients newer than it send it (header v2, a body of
    # two empty compact strings and no tagged fields): answered in version 0,
    # UNSUPPORTED_VERSION, with the versions it serves.
    await r.raw("unknown version", 18, 127, 0, b"\x01\x01\x00", flexible=True)


@scenario
async def metadata(r: Run) -> None:
    topic = r.topic("t")
    await r.topics(topic, partitions=2)
    for v in r.versions(3):
        await r.call("one topic", 3, v, topics=[{"name": topic}], allow_auto_topic_creation=False)
        if v < 4:  # no choice before v4: a topic asked for is created
            await r.call("auto-created", 3, v, topics=[{"name": r.topic(f"auto-v{v}")}])
        else:
            await r.call(
                "unknown topic",
                3,
                v,
                topics=[{"name": r.topic(f"missing-v{v}")}],
                allow_auto_topic_creation=False,
            )
            await r.call(
                "invalid name",
                3,
                v,
                topics=[{"name": "bad name!"}],
                allow_auto_topic_creation=False,
            )


@scenario
async def describe_cluster(r: Run) -> None:
    for v in r.versions(60):
        await r.call("cluster", 60, v, endpoint_type=1)


@scenario
async def find_coordinator(r: Run) -> None:
    await r.coordinators((0, r.topic("g")), (1, r.topic("tid")))
    for v in r.versions(10):
        await r.call("group", 10, v, key=r.topic("g"), key_type=0, coordinator_keys=[r.topic("g")])
        if v >= 1:
            await r.call(
                "transaction",
                10,
                v,
                key=r.topic("tid"),
                key_type=1,
                coordinator_keys=[r.topic("tid")],
            )


# -- topics ----------------------------------------------------------------------------------------


@scenario
async def create_topics(r: Run) -> None:
    for v in r.versions(19):

        def topic(suffix: str, partitions: int = 2, **configs: str) -> dict[str, Any]:
            return {
                "name": r.topic(f"{suffix}-v{v}"),
                "num_partitions": partitions,
                "replication_factor": 1,
                "configs": [{"name": k, "value": c} for k, c in configs.items()],
            }

        await r.call(
            "created", 19, v, topics=[topic("a", **{"retention.ms": "86400000"})], timeout=30_000
        )
        await r.call("already exists", 19, v, topics=[topic("a")], timeout=30_000)
        await r.call("no partitions", 19, v, topics=[topic("zero", partitions=0)], timeout=30_000)
        await r.call(
            "bad name", 19, v, topics=[{**topic("x"), "name": "bad name!"}], timeout=30_000
        )
        await r.call(
            "bad config", 19, v, topics=[topic("c", **{"retention.ms": "soon"})], timeout=30_000
        )
        await r.call(
            "unknown config", 19, v, topics=[topic("u", **{"no.such.config": "1"})], timeout=30_000
        )
        await r.call(
            "validate only", 19, v, topics=[topic("dry")], timeout=30_000, validate_only=True
        )


@scenario
async def create_partitions(r: Run) -> None:
    for v in r.versions(37):
        topic = r.topic(f"v{v}")
        await r.topics(topic, partitions=2)
        await r.call("grow", 37, v, topics=[{"name": topic, "count": 3}], timeout=30_000)
        await r.call("shrink", 37, v, topics=[{"name": topic, "count": 1}], timeout=30_000)
        await r.call(
            "unknown topic",
            37,
            v,
            topics=[{"name": r.topic("missing"), "count": 3}],
            timeout=30_000,
        )


@scenario
async def delete_topics(r: Run) -> None:
    for v in r.versions(20):
        topic = r.topic(f"v{v}")
        await r.topics(topic)
        await r.call(
            "deleted", 20, v, topics=[{"name": topic}], topic_names=[topic], timeout=30_000
        )
        await r.call(
            "unknown topic",
            20,
            v,
            topics=[{"name": r.topic("missing")}],
            topic_names=[r.topic("missing")],
            timeout=30_000,
        )


@scenario
async def configs(r: Run) -> None:
    topic = r.topic("t")
    await r.topics(topic, **{"retention.ms": "86400000"})
    for v in r.versions(32):
        await r.call(
            "every config",
            32,
            v,
            resources=[{"resource_type": 2, "resource_name": topic, "configuration_keys": None}],
        )
        await r.call(
            "topic",
            32,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": topic,
                    "configuration_keys": ["retention.ms", "cleanup.policy"],
                }
            ],
        )
        await r.call(
            "unknown topic",
            32,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": r.topic("missing"),
                    "configuration_keys": ["retention.ms"],
                }
            ],
        )
    for v in r.versions(44):
        await r.call(
            "incremental set",
            44,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": topic,
                    "configs": [
                        {"name": "retention.ms", "config_operation": 0, "value": "3600000"}
                    ],
                }
            ],
        )
        await r.call(
            "incremental bad value",
            44,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": topic,
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "soon"}],
                }
            ],
        )
        await r.call(
            "incremental unknown topic",
            44,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": r.topic("missing"),
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}],
                }
            ],
        )
    for v in r.versions(33):
        await r.call(
            "alter",
            33,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": topic,
                    "configs": [{"name": "retention.ms", "value": "7200000"}],
                }
            ],
        )
        await r.call(
            "alter unknown topic",
            33,
            v,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": r.topic("missing"),
                    "configs": [{"name": "retention.ms", "value": "1"}],
                }
            ],
        )


# -- records ---------------------------------------------------------------------------------------


@scenario
async def produce(r: Run) -> None:
    small = r.topic("small")
    await r.topics(small, **{"max.message.bytes": "1000"})
    for v in r.versions(0):
        topic = r.topic(f"v{v}")
        await r.topics(topic)
        data = batch_of([b"a", b"b"])
        await r.call("appended", 0, v, acks=-1, timeout=30_000, topic_data=_topic_data(topic, data))
        await r.call(
            "unknown topic",
            0,
            v,
            acks=-1,
            timeout=30_000,
            topic_data=_topic_data(r.topic("missing"), data),
        )
        await r.call(
            "unknown partition",
            0,
            v,
            acks=-1,
            timeout=30_000,
            topic_data=_topic_data(topic, data, partition=7),
        )
        await r.call(
            "too large",
            0,
            v,
            acks=-1,
            timeout=30_000,
            topic_data=_topic_data(small, batch_of([b"x" * 2000])),
        )
        await r.call("bad acks", 0, v, acks=3, timeout=30_000, topic_data=_topic_data(topic, data))
        await r.call(
            "corrupt",
            0,
            v,
            acks=-1,
            timeout=30_000,
            topic_data=_topic_data(topic, data[:-3] + b"zzz"),
        )


@scenario
async def produce_idempotent(r: Run) -> None:
    for v in r.versions(0):
        topic = r.topic(f"v{v}")
        await r.topics(topic)
        pid, epoch = await r.init_producer(None)

        def batch(sequence: int, *values: bytes, at: int = epoch) -> list[dict[str, Any]]:
            data = batch_of(
                list(values), producer_id=pid, producer_epoch=at, base_sequence=sequence
            )
            return _topic_data(topic, data)

        await r.call("first", 0, v, acks=-1, timeout=30_000, topic_data=batch(0, b"a", b"b"))
        await r.call("next", 0, v, acks=-1, timeout=30_000, topic_data=batch(2, b"c"))
        await r.call("duplicate", 0, v, acks=-1, timeout=30_000, topic_data=batch(0, b"a", b"b"))
        await r.call("gap", 0, v, acks=-1, timeout=30_000, topic_data=batch(9, b"z"))
        # An epoch the producer raised itself (KIP-360: InitProducerId gave `epoch`), not from
        # sequence 0, then from 0, then the older epoch again.
        await r.call(
            "newer epoch, not from 0",
            0,
            v,
            acks=-1,
            timeout=30_000,
            topic_data=batch(3, b"d", at=epoch + 1),
        )
        await r.call(
            "newer epoch", 0, v, acks=-1, timeout=30_000, topic_data=batch(0, b"d", at=epoch + 1)
        )
        await r.call(
            "older epoch", 0, v, acks=-1, timeout=30_000, topic_data=batch(3, b"e", at=epoch)
        )


async def _filled(r: Run, topic: str) -> None:
    await r.topics(topic)
    await r.produce(topic, [b"a", b"b", b"c"])
    await r.produce(topic, [b"d", b"e"])


@scenario
async def list_offsets(r: Run) -> None:
    topic = r.topic("t")
    await _filled(r, topic)
    for v in r.versions(2):

        def ask(
            *pairs: tuple[int, int], name: str = topic, current: int = -1
        ) -> list[dict[str, Any]]:
            return [
                {
                    "name": name,
                    "partitions": [
                        {"partition_index": p, "timestamp": ts, "current_leader_epoch": current}
                        for p, ts in pairs
                    ],
                }
            ]

        await r.call("earliest latest", 2, v, replica_id=-1, topics=ask((0, -2)))
        await r.call("latest", 2, v, replica_id=-1, topics=ask((0, -1)))
        await r.call("by time", 2, v, replica_id=-1, topics=ask((0, TIMESTAMP + 1)))
        await r.call("after every record", 2, v, replica_id=-1, topics=ask((0, TIMESTAMP + 99)))
        if v >= 7:
            await r.call("max timestamp", 2, v, replica_id=-1, topics=ask((0, -3)))
        if v >= 4:  # current_leader_epoch is checked from version 4 (KIP-320)
            for current in (0, 3):
                await r.call(
                    f"current leader epoch {current}",
                    2,
                    v,
                    replica_id=-1,
                    topics=ask((0, -1), current=current),
                )
        await r.call("unknown partition", 2, v, replica_id=-1, topics=ask((5, -1)))
        await r.call(
            "unknown topic", 2, v, replica_id=-1, topics=ask((0, -1), name=r.topic("missing"))
        )


@scenario
async def fetch(r: Run) -> None:
    topic = r.topic("t")
    await _filled(r, topic)
    meta = await r.quiet(3, 12, topics=[{"name": topic}])
    topic_id = meta.topics[0].topic_id
    for v in r.versions(1):

        def ask(
            offset: int,
            name: str = topic,
            tid: Any = topic_id,
            partition: int = 0,
            current: int = -1,
        ) -> list[dict[str, Any]]:
            return [
                {
                    "topic": name,
                    "topic_id": tid,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": current,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                        }
                    ],
                }
            ]

        common: dict[str, Any] = {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "forgotten_topics_data": [],
        }
        await r.call("from the start", 1, v, topics=ask(0), **common)
        await r.call("from the middle", 1, v, topics=ask(3), **common)
        await r.call("at the end", 1, v, topics=ask(5), **common)
        await r.call("out of range", 1, v, topics=ask(99), **common)
        await r.call("read committed", 1, v, topics=ask(0), **{**common, "isolation_level": 1})
        if v >= 9:  # current_leader_epoch is checked from version 9 (KIP-320)
            for current in (0, 3):
                await r.call(
                    f"current leader epoch {current}",
                    1,
                    v,
                    topics=ask(3, current=current),
                    **common,
                )
        await r.call("unknown partition", 1, v, topics=ask(0, partition=4), **common)
        await r.call(
            "unknown topic",
            1,
            v,
            topics=ask(0, name=r.topic("missing"), tid=uuid.UUID(int=12345)),
            **common,
        )


@scenario
async def offset_for_leader_epoch(r: Run) -> None:
    """KIP-320's check of a position: the current epoch's end is the log end; an epoch the log
    never had, or none, is undefined; the client's current epoch is checked as Fetch's is."""
    topic = r.topic("t")
    await _filled(r, topic)
    for v in r.versions(23):

        def ask(
            epoch: int, current: int = -1, name: str = topic, partition: int = 0
        ) -> list[dict[str, Any]]:
            return [
                {
                    "topic": name,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": current,
                            "leader_epoch": epoch,
                        }
                    ],
                }
            ]

        await r.call("current epoch", 23, v, replica_id=-1, topics=ask(0))
        await r.call("current epoch, said", 23, v, replica_id=-1, topics=ask(0, current=0))
        await r.call("a later epoch", 23, v, replica_id=-1, topics=ask(4))
        await r.call("no epoch", 23, v, replica_id=-1, topics=ask(-1))
        await r.call("current epoch newer", 23, v, replica_id=-1, topics=ask(0, current=2))
        await r.call("unknown partition", 23, v, replica_id=-1, topics=ask(0, partition=3))
        await r.call("unknown topic", 23, v, replica_id=-1, topics=ask(0, name=r.topic("missing")))


@scenario
async def delete_records(r: Run) -> None:
    for v in r.versions(21):
        topic = r.topic(f"v{v}")
        await _filled(r, topic)

        def ask(offset: int, partition: int = 0) -> list[dict[str, Any]]:
            return [
                {"name": topic, "partitions": [{"partition_index": partition, "offset": offset}]}
            ]

        await r.call("deleted", 21, v, topics=ask(2), timeout=30_000)
        await r.call("below the start", 21, v, topics=ask(1), timeout=30_000)
        await r.call("past the end", 21, v, topics=ask(9), timeout=30_000)
        await r.call("to the end", 21, v, topics=ask(-1), timeout=30_000)
        await r.call("unknown partition", 21, v, topics=ask(0, partition=3), timeout=30_000)


# -- transactions ----------------------------------------------------------------------------------


@scenario
async def init_producer_id(r: Run) -> None:
    await r.coordinators(*((1, r.topic(f"v{v}")) for v in r.versions(22)))
    for v in r.versions(22):
        tid = r.topic(f"v{v}")
        fresh = {"transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1}
        await r.call("idempotent", 22, v, transactional_id=None, **fresh)
        first = await r.call("transactional", 22, v, transactional_id=tid, **fresh)
        await r.call("again", 22, v, transactional_id=tid, **fresh)
        await r.call(
            "timeout too long",
            22,
            v,
            transactional_id=tid,
            **{**fresh, "transaction_timeout": 3_600_000},
        )
        if v >= 3 and first is not None:
            await r.call(
                "stale epoch",
                22,
                v,
                transactional_id=tid,
                **{
                    **fresh,
                    "producer_id": first.producer_id,
                    "producer_epoch": first.producer_epoch,
                },
            )


@scenario
async def transactions(r: Run) -> None:
    """Transaction version 1: AddPartitionsToTxn v0-3, EndTxn v0-4, each at every version."""
    topic = r.topic("t")
    await r.topics(topic, partitions=2)
    await r.coordinators(*((1, r.topic(f"v{v}")) for v in range(5)))
    for v in range(0, 5):
        tid = r.topic(f"v{v}")
        pid, epoch = await r.init_producer(tid)
        caller = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
        add_version = min(v, 3)

        def add(*partitions: int, name: str = topic, at: int = epoch) -> dict[str, Any]:
            return {
                "v3_and_below_transactional_id": tid,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": at,
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": at,
                "v3_and_below_topics": [{"name": name, "partitions": list(partitions)}],
                "topics": [{"name": name, "partitions": list(partitions)}],
            }

        await r.call("add partitions", 24, add_version, **add(0, 1))
        await r.call("add unknown topic", 24, add_version, **add(0, name=r.topic("missing")))
        await r.call("add at an old epoch", 24, add_version, **add(0, at=epoch + 3))
        data = batch_of(
            [b"t1"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        )
        await r.call(
            "produce in it",
            0,
            9,
            transactional_id=tid,
            acks=-1,
            timeout=30_000,
            topic_data=_topic_data(topic, data),
        )
        await r.call(
            "commit",
            26,
            v,
            **caller,
            committed=True,
        )
        await r.settled(tid)
        await r.call(
            "commit again",
            26,
            v,
            **caller,
            committed=True,
        )
        await r.call(
            "abort with none open",
            26,
            v,
            **caller,
            committed=False,
        )
        await r.call(
            "end at a fenced epoch",
            26,
            v,
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch + 7,
            committed=True,
        )
        await r.call(
            "end unknown id",
            26,
            v,
            transactional_id=r.topic("nobody"),
            producer_id=pid,
            producer_epoch=epoch,
            committed=True,
        )
    for v in r.versions(65):
        await r.call("describe", 65, v, transactional_ids=[r.topic("v0"), r.topic("nobody")])
    for v in r.versions(66):
        await r.call("list ongoing", 66, v, state_filters=["Ongoing"], producer_id_filters=[])


@scenario
async def transactions_v2(r: Run) -> None:
    """Transaction version 2 (KIP-890): a produce (v12) adds its partition, EndTxn v5 raises the
    epoch and answers it; AddPartitionsToTxn v4-5 in the batched form; TxnOffsetCommit v0."""
    topic = r.topic("t")
    await r.topics(topic)
    tids = [r.topic(name) for name in ("a", "b", "c")]
    await r.coordinators(*((1, tid) for tid in tids), (0, r.topic("g")))
    tid = tids[0]
    pid, epoch = await r.init_producer(tid)
    caller = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
    data = batch_of(
        [b"v2"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
    )
    await r.call(
        "produce joins",
        0,
        12,
        transactional_id=tid,
        acks=-1,
        timeout=30_000,
        topic_data=_topic_data(topic, data),
    )
    ended = await r.call("commit", 26, 5, **caller, committed=True)
    await r.settled(tid)
    await r.call(
        "commit again",
        26,
        5,
        **caller,
        committed=True,
    )
    if ended is not None:
        await r.call(
            "abort with none open",
            26,
            5,
            transactional_id=tid,
            producer_id=ended.producer_id,
            producer_epoch=ended.producer_epoch,
            committed=False,
        )
    for v, tid in zip((4, 5), tids[1:], strict=True):
        pid, epoch = await r.init_producer(tid)
        caller = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
        await r.call(
            "add partitions, batched",
            24,
            v,
            transactions=[
                {
                    "transactional_id": tid,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "verify_only": False,
                    "topics": [{"name": topic, "partitions": [0]}],
                }
            ],
        )
        await r.call(
            "end",
            26,
            5,
            **caller,
            committed=False,
        )
        await r.settled(tid)
    tid = tids[0]
    pid, epoch = await r.init_producer(tid)
    caller = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
    await r.quiet(25, 0, **caller, group_id=r.topic("g"))
    await r.call(
        "commit offsets v0",
        28,
        0,
        transactional_id=tid,
        group_id=r.topic("g"),
        producer_id=pid,
        producer_epoch=epoch,
        topics=_committing(topic, 1, ""),
    )
    await r.call("end", 26, 3, **caller, committed=True)


@scenario
async def transaction_offsets(r: Run) -> None:
    topic = r.topic("t")
    await r.topics(topic)
    group = r.topic("g")
    await r.coordinators((0, group), *((1, r.topic(f"v{v}")) for v in r.versions(25)))
    for v in r.versions(25):
        tid = r.topic(f"v{v}")
        pid, epoch = await r.init_producer(tid)
        caller = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
        await r.call(
            "add offsets",
            25,
            v,
            **caller,
            group_id=group,
        )
        await r.call(
            "add offsets, fenced",
            25,
            v,
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch + 4,
            group_id=group,
        )
        commit_version = min(v + 1, 5)
        offsets = _committing(topic, 1, "m")
        await r.call(
            "commit offsets",
            28,
            commit_version,
            transactional_id=tid,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            topics=offsets,
        )
        if commit_version >= 3:
            await r.call(
                "commit offsets, unknown member",
                28,
                commit_version,
                transactional_id=tid,
                group_id=group,
                producer_id=pid,
                producer_epoch=epoch,
                generation_id=5,
                member_id="stranger",
                topics=offsets,
            )
        await r.call(
            "end",
            26,
            4,
            **caller,
            committed=False,
        )


# -- groups ----------------------------------------------------------------------------------------


@scenario
async def offsets(r: Run) -> None:
    topic = r.topic("t")
    await _filled(r, topic)
    await r.coordinators(*((0, r.topic(f"v{v}")) for v in r.versions(8)), (0, r.topic("nobody")))
    for v in r.versions(8):
        group = r.topic(f"v{v}")
        offsets = _committing(topic, 2, "x")
        await r.call(
            "simple commit",
            8,
            v,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=offsets,
        )
        await r.call(
            "commit with a stranger",
            8,
            v,
            group_id=group,
            generation_id_or_member_epoch=3,
            member_id="stranger",
            topics=offsets,
        )
    for v in r.versions(9):
        group = r.topic("v8")
        await r.call(
            "fetch",
            9,
            v,
            group_id=group,
            topics=[{"name": topic, "partition_indexes": [0, 1]}],
            groups=[{"group_id": group, "topics": [{"name": topic, "partition_indexes": [0, 1]}]}],
        )
        await r.call(
            "fetch unknown group",
            9,
            v,
            group_id=r.topic("nobody"),
            topics=[{"name": topic, "partition_indexes": [0]}],
            groups=[
                {
                    "group_id": r.topic("nobody"),
                    "topics": [{"name": topic, "partition_indexes": [0]}],
                }
            ],
        )
    for v in r.versions(47):
        await r.call(
            "delete offsets",
            47,
            v,
            group_id=r.topic("v8"),
            topics=[{"name": topic, "partitions": [{"partition_index": 0}]}],
        )


@scenario
async def classic_group(r: Run) -> None:
    topic = r.topic("t")
    await r.topics(topic)
    # Kafka's consumer protocol: a subscription (version 0) to the topic, and its assignment.
    name = topic.encode()
    subscription = struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)
    assignment = (
        struct.pack(">hih", 0, 1, len(name))
        + name
        + struct.pack(">ii", 1, 0)
        + struct.pack(">i", -1)
    )
    protocols = [{"name": "range", "metadata": subscription}]
    await r.coordinators(*((0, r.topic(f"v{v}")) for v in r.versions(11)))
    for v in r.versions(11):
        group = r.topic(f"v{v}")
        join: dict[str, Any] = {
            "group_id": group,
            "session_timeout": 30_000,
            "rebalance_timeout": 30_000,
            "protocol_type": "consumer",
            "protocols": protocols,
        }
        first = await r.call("join", 11, v, member_id="", **join)
        member = first.member_id if first is not None else ""
        if v >= 4:
            joined = await r.call("join with the id", 11, v, member_id=member, **join)
        else:
            joined = first
        generation = joined.generation_id if joined is not None else -1
        sync_v = min(v, 4) if v >= 0 else 0
        await r.call(
            "sync",
            14,
            sync_v,
            group_id=group,
            generation_id=generation,
            member_id=member,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[{"member_id": member, "assignment": assignment}],
        )
        hb_v = min(v, 4)
        await r.call(
            "heartbeat", 12, hb_v, group_id=group, generation_id=generation, member_id=member
        )
        await r.call(
            "heartbeat, old generation",
            12,
            hb_v,
            group_id=group,
            generation_id=generation + 5,
            member_id=member,
        )
        await r.call(
            "heartbeat, unknown member",
            12,
            hb_v,
            group_id=group,
            generation_id=generation,
            member_id="stranger",
        )
        await r.call(
            "commit in the generation",
            8,
            8,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member,
            topics=_committing(topic, 0, ""),
        )
        await r.call(
            "commit, illegal generation",
            8,
            8,
            group_id=group,
            generation_id_or_member_epoch=generation + 9,
            member_id=member,
            topics=_committing(topic, 0, ""),
        )
        await r.call("delete a live group", 42, 2, groups_names=[group])
        describe_v = min(v, 5)
        await r.call("describe", 15, describe_v, groups=[group])
        leave_v = min(v, 4)
        await r.call(
            "leave", 13, leave_v, group_id=group, member_id=member, members=[{"member_id": member}]
        )
        await r.call(
            "leave, unknown member",
            13,
            leave_v,
            group_id=group,
            member_id="stranger",
            members=[{"member_id": "stranger"}],
        )

    def own(answer: Any) -> Any:  # the cluster's groups, in no set order: this scenario's, sorted
        groups = [g for g in answer["groups"] if g["group_id"].startswith(r.topic(""))]
        return {**answer, "groups": sorted(groups, key=lambda g: g["group_id"])}

    for v in r.versions(16):
        await r.call("list", 16, v, keep=own, states_filter=["Stable"], types_filter=["classic"])
    # A group id no group may have.
    await r.call(
        "join, empty group id",
        11,
        7,
        member_id="",
        group_id="",
        session_timeout=30_000,
        rebalance_timeout=30_000,
        protocol_type="consumer",
        protocols=protocols,
    )
    # Groups whose metadata the coordinator keeps opaque: the consumer protocol's that it cannot
    # read, and another protocol type's (Kafka Connect's workers; Schema Registry's is "sr").
    for kind, protocol_type, name in (
        ("opaque", "consumer", "range"),
        ("connect", "connect", "sessioned"),
    ):
        group = r.topic(kind)
        fields = {
            "group_id": group,
            "session_timeout": 30_000,
            "rebalance_timeout": 30_000,
            "protocol_type": protocol_type,
            "protocols": [{"name": name, "metadata": b"\x00\x01"}],
        }
        first = await r.call(f"{kind}: join", 11, 7, member_id="", **fields)
        member = first.member_id if first is not None else ""
        joined = await r.call(f"{kind}: join with the id", 11, 7, member_id=member, **fields)
        generation = joined.generation_id if joined is not None else -1
        await r.call(
            f"{kind}: sync",
            14,
            5,
            group_id=group,
            generation_id=generation,
            member_id=member,
            protocol_type=protocol_type,
            protocol_name=name,
            assignments=[{"member_id": member, "assignment": b"\x00\x02"}],
        )
        await r.call(
            f"{kind}: sync, another protocol type",
            14,
            5,
            group_id=group,
            generation_id=generation,
            member_id=member,
            protocol_type="other",
            protocol_name=name,
            assignments=[],
        )
        await r.call(
            f"{kind}: another member of another type",
            11,
            7,
            member_id="",
            **{**fields, "protocol_type": "other"},
        )
        await r.call(f"{kind}: describe", 15, 5, groups=[group])
        await r.call(f"{kind}: leave", 13, 4, group_id=group, members=[{"member_id": member}])
    for v in r.versions(42):
        await r.call("delete", 42, v, groups_names=[r.topic(f"v{v}"), r.topic("nobody")])


@scenario
async def consumer_group(r: Run) -> None:
    topic = r.topic("t")
    await r.topics(topic, partitions=2)
    await r.coordinators(*((0, r.topic(f"v{v}")) for v in r.versions(68)))

    def by_id(answer: Any) -> Any:  # groups in no set order
        return {**answer, "groups": sorted(answer["groups"], key=lambda g: g["group_id"])}

    for v in r.versions(68):
        group = r.topic(f"v{v}")
        joined = await r.call(
            "join",
            68,
            v,
            group_id=group,
            member_id=f"m{v}-aaaaaaaaaaaaaaaaaaaaa"[:22],
            member_epoch=0,
            rebalance_timeout=30_000,
            subscribed_topic_names=[topic],
            server_assignor="uniform",
            topic_partitions=[],
        )
        if joined is None:
            continue
        await r.call(
            "heartbeat, fenced epoch",
            68,
            v,
            group_id=group,
            member_id=joined.member_id,
            member_epoch=joined.member_epoch + 5,
        )
        await r.call(
            "heartbeat, unknown member",
            68,
            v,
            group_id=group,
            member_id="stranger-stranger-stra",
            member_epoch=1,
        )
        for d in r.versions(69):
            await r.call("describe", 69, d, keep=by_id, group_ids=[group, r.topic("nobody")])
        await r.call("leave", 68, v, group_id=group, member_id=joined.member_id, member_epoch=-1)


@scenario
async def static_consumer_group(r: Run) -> None:
    """KIP-848's rebalance timeout (-1: unchanged, not to join) and static membership."""
    topic = r.topic("t")
    await r.topics(topic, partitions=2)
    await r.coordinators(*((0, r.topic(f"v{v}")) for v in r.versions(68)))
    for v in r.versions(68):
        group, instance = r.topic(f"v{v}"), f"instance-{v}"
        first, second = f"a{v}-aaaaaaaaaaaaaaaaaaaa"[:22], f"b{v}-bbbbbbbbbbbbbbbbbbbb"[:22]
        joining = {"group_id": group, "member_epoch": 0, "subscribed_topic_names": [topic]}
        joining |= {"server_assignor": "uniform", "topic_partitions": []}
        await r.call("join, no rebalance timeout", 68, v, member_id=first, **joining)
        joined = await r.call(
            "join",
            68,
            v,
            member_id=first,
            instance_id=instance,
            rebalance_timeout=30_000,
            **joining,
        )
        if joined is None:
            continue
        await r.call(
            "join, instance in use",
            68,
            v,
            member_id=second,
            instance_id=instance,
            rebalance_timeout=30_000,
            **joining,
        )
        await r.call(
            "leave for now, no instance", 68, v, group_id=group, member_id=first, member_epoch=-2
        )
        await r.call(
            "leave for now",
            68,
            v,
            group_id=group,
            member_id=first,
            member_epoch=-2,
            instance_id=instance,
        )
        await r.call(
            "back",
            68,
            v,
            member_id=second,
            instance_id=instance,
            rebalance_timeout=30_000,
            **joining,
        )
        await r.call(
            "leave", 68, v, group_id=group, member_id=second, member_epoch=-1, instance_id=instance
        )


# -- one broker ------------------------------------------------------------------------------------


@scenario
async def one_broker(r: Run) -> None:
    topic = r.topic("t")
    await _filled(r, topic)
    for v in r.versions(35):
        await r.call("log dirs", 35, v, topics=[{"topic": topic, "partitions": [0]}])
    for v in r.versions(43):
        await r.call(
            "elect leaders",
            43,
            v,
            election_type=0,
            timeout=30_000,
            topic_partitions=[{"topic": topic, "partitions": [0]}],
        )
    for v in r.versions(46):
        await r.call("reassignments", 46, v, timeout=30_000, topics=None)
    for v in r.versions(48):
        await r.call("client quotas", 48, v, components=[], strict=False)
    for v in r.versions(50):
        await r.call("scram users", 50, v, users=[{"name": "nobody"}])
    for v in r.versions(61):
        await r.call("producers", 61, v, topics=[{"name": topic, "partition_indexes": [0, 3]}])
    for v in r.versions(75):
        await r.call(
            "topic partitions",
            75,
            v,
            topics=[{"name": topic}, {"name": r.topic("x")}],
            response_partition_limit=100,
        )
    for v in r.versions(29):
        await r.call(
            "acls",
            29,
            v,
            resource_type_filter=1,
            pattern_type_filter=1,
            operation=1,
            permission_type=1,
        )
    for v in r.versions(17):
        await r.close()  # a handshake changes what the connection expects next
        await r.call("sasl handshake", 17, v, mechanism="PLAIN")
    for v in r.versions(36):
        await r.close()
        await r.call("sasl authenticate, no handshake", 36, v, auth_bytes=b"\x00user\x00pw")
    await r.close()


@scenario
async def acls(r: Run) -> None:
    acl = {
        "resource_type": 2,
        "resource_name": r.topic("t"),
        "resource_pattern_type": 3,
        "principal": "User:alice",
        "host": "*",
        "operation": 3,
        "permission_type": 3,
    }
    for v in r.versions(30):
        await r.call("create", 30, v, creations=[acl])
    for v in r.versions(29):
        await r.call(
            "describe",
            29,
            v,
            resource_type_filter=2,
            resource_name_filter=None,
            pattern_type_filter=1,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        )
    for v in r.versions(31):
        await r.call(
            "delete",
            31,
            v,
            filters=[
                {
                    "resource_type_filter": 2,
                    "resource_name_filter": r.topic("t"),
                    "pattern_type_filter": 3,
                    "principal_filter": "User:alice",
                    "host_filter": "*",
                    "operation": 3,
                    "permission_type": 3,
                }
            ],
        )


@scenario
async def scram_credentials(r: Run) -> None:
    user = r.topic("user")
    upsert = {
        "name": user,
        "mechanism": 1,
        "iterations": 8192,
        "salt": b"s" * 16,
        "salted_password": b"p" * 32,
    }
    for v in r.versions(51):
        await r.call("upsert", 51, v, deletions=[], upsertions=[upsert])
        await r.call(
            "too few iterations", 51, v, deletions=[], upsertions=[{**upsert, "iterations": 10}]
        )
        await r.call(
            "unknown mechanism", 51, v, deletions=[], upsertions=[{**upsert, "mechanism": 9}]
        )
        await r.call(
            "delete unknown",
            51,
            v,
            upsertions=[],
            deletions=[{"name": r.topic("nobody"), "mechanism": 1}],
        )
    for v in r.versions(50):
        await r.call("describe", 50, v, users=[{"name": user}])
        await r.call(
            "describe all",
            50,
            v,
            users=None,
            keep=lambda a: {
                **a,
                "results": [x for x in a["results"] if x["user"].startswith(r.topic(""))],
            },
        )
    for v in r.versions(51):
        await r.call("delete", 51, v, upsertions=[], deletions=[{"name": user, "mechanism": 1}])


@scenario
async def client_quotas(r: Run) -> None:
    """`kafka-configs --entity-type users --add-config controller_mutation_rate=N`: set,
    described, removed; Kafka's checks of an entity, a key and a value. What Kafka keeps and
    the listener refuses (a byte rate, a client id's quota) is asked validate-only, so Kafka
    keeps nothing that other scenarios would see."""
    user = r.topic("user")
    rate = "controller_mutation_rate"

    def entry(entity: tuple[tuple[str, str | None], ...], key: str, value: float | None) -> Any:
        return {
            "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
            "ops": [{"key": key, "value": value or 0.0, "remove": value is None}],
        }

    mine = (("user", user),)
    asked = [{"entity_type": "user", "match_type": 0, "match": user}]
    for v in r.versions(49):
        await r.call("set", 49, v, entries=[entry(mine, rate, 50.0 + v)], validate_only=False)
        await r.call(
            "validate only",
            49,
            v,
            entries=[entry((("user", r.topic("other")),), rate, 5.0)],
            validate_only=True,
        )
        await r.call(
            "not above zero", 49, v, entries=[entry(mine, rate, -1.0)], validate_only=False
        )
        await r.call(
            "unknown key", 49, v, entries=[entry(mine, "no_such", 1.0)], validate_only=False
        )
        await r.call("empty entity", 49, v, entries=[entry((), rate, 1.0)], validate_only=False)
        await r.call(
            "a byte rate",
            49,
            v,
            entries=[entry(mine, "producer_byte_rate", 1024.0)],
            validate_only=True,
        )
        await r.call(
            "a client id",
            49,
            v,
            entries=[entry((("client-id", "c"),), rate, 1.0)],
            validate_only=True,
        )
    # Kafka's broker serves quotas from its metadata, a moment behind its controller.
    for _ in range(100):
        found = await r.quiet(48, 1, components=asked, strict=True)
        if found.entries and found.entries[0].values[0].value == 50.0 + max(r.versions(49)):
            break
        await asyncio.sleep(0.05)
    for v in r.versions(48):
        await r.call("describe the user", 48, v, components=asked, strict=True)
        await r.call(
            "describe a client id",
            48,
            v,
            components=[{"entity_type": "client-id", "match_type": 2}],
            strict=False,
        )
    await r.call("remove", 49, 1, entries=[entry(mine, rate, None)], validate_only=False)


@scenario
async def client_telemetry(r: Run) -> None:
    """kafka-client-metrics.sh's calls (a subscription altered, described, listed, Kafka's
    checks of its configs) and a client's own (KIP-714): GetTelemetrySubscriptions, early and
    not, and PushTelemetry with each of Kafka's refusals. Each push is a new instance's, so only
    the refusal tried is met; instance ids are fixed, so both brokers see the same."""
    checked, pushed = r.topic("checked"), r.topic("pushed")

    def alter(name: str, *ops: tuple[str, int, str]) -> list[dict[str, Any]]:
        configs = [{"name": n, "config_operation": o, "value": v} for n, o, v in ops]
        return [{"resource_type": 16, "resource_name": name, "configs": configs}]

    for v in r.versions(44):
        nobody = ("match", 0, "client_id=nobody")
        await r.call("set", 44, v, resources=alter(checked, ("metrics", 0, "a."), nobody))
        await r.call("append", 44, v, resources=alter(checked, ("metrics", 2, "b.")))
        await r.call("subtract", 44, v, resources=alter(checked, ("metrics", 3, "a.")))
        await r.call(
            "interval too short", 44, v, resources=alter(checked, ("interval.ms", 0, "50"))
        )
        await r.call("unknown config", 44, v, resources=alter(checked, ("colour", 0, "red")))
        await r.call("bad match", 44, v, resources=alter(checked, ("match", 0, "who=me")))
        await r.call("no name", 44, v, resources=alter("", ("metrics", 0, "a.")))
    # A minute's interval: the early ask and the early push below come well within it on any
    # machine (with Kafka's shortest, 100 ms, a loaded machine made them late, and accepted).
    subscription = alter(
        pushed,
        ("metrics", 0, "org.apache.kafka.producer."),
        ("interval.ms", 0, "60000"),
        ("match", 0, "client_id=test"),
    )
    await r.quiet(44, 1, resources=subscription, validate_only=False)
    # Kafka's broker sees a subscription from its metadata, a moment behind its controller.
    described = {"resource_type": 16, "resource_name": pushed, "configuration_keys": None}
    for _ in range(100):
        found = await r.quiet(32, 4, resources=[described])
        if len(found.results[0].configs) == 3:
            break
        await asyncio.sleep(0.05)
    for v in r.versions(32):
        for step, name, keys in (
            ("described", checked, None),
            ("one key", checked, ["metrics"]),
            ("no such subscription", r.topic("missing"), None),
        ):
            await r.call(
                step,
                32,
                v,
                resources=[{**described, "resource_name": name, "configuration_keys": keys}],
                include_synonyms=False,
                include_documentation=False,
            )
    for v in r.versions(74):
        await r.call("listed", 74, v, resource_types=[16])

    instances = iter(uuid.uuid5(uuid.NAMESPACE_URL, f"{r.scenario}-{i}") for i in range(100))

    async def subscribed(step: str | None = None) -> Any:
        if step is None:
            return await r.quiet(71, 0, client_instance_id=next(instances))
        return await r.call(step, 71, 0, client_instance_id=next(instances))

    def push(got: Any, **fields: Any) -> dict[str, Any]:
        return {
            "client_instance_id": got.client_instance_id,
            "subscription_id": got.subscription_id,
            "terminating": False,
            "compression_type": 0,
            "metrics": _METRICS_DATA,
            **fields,
        }

    got = await subscribed("subscribed")
    await r.call("early", 71, 0, client_instance_id=got.client_instance_id)
    await r.call("pushed", 72, 0, **push(got))
    await r.call("early push", 72, 0, **push(got))
    await r.call("stale subscription", 72, 0, **push(await subscribed(), subscription_id=1))
    await r.call("unknown codec", 72, 0, **push(await subscribed(), compression_type=7))
    too_large = b"\0" * (1024 * 1024 + 1)  # telemetry.max.bytes, 1 MiB by default
    await r.call("too large", 72, 0, **push(await subscribed(), metrics=too_large))
    await r.call("zero instance", 72, 0, **push(got, client_instance_id=uuid.UUID(int=0)))
    await r.call("not metrics", 72, 0, **push(await subscribed(), metrics=b"\xff\xff"))
    last = await subscribed()
    await r.call("terminating", 72, 0, **push(last, terminating=True))
    await r.call("after terminating", 72, 0, **push(last))


@scenario
async def delegation_tokens(r: Run) -> None:
    """kafka-delegation-tokens.sh's calls over a connection without a SASL login, as Kafka's
    PLAINTEXT listener answers them: DELEGATION_TOKEN_REQUEST_NOT_ALLOWED (the token flows need
    a SASL login; the suite tries them against the listener and with Kafka's tool)."""
    owner = [{"principal_type": "User", "principal_name": "alice"}]
    for v in r.versions(38):
        await r.call("create", 38, v, renewers=owner, max_lifetime=-1)
    for v in r.versions(39):
        await r.call("renew", 39, v, hmac=b"not-a-token", renew_period=-1)
    for v in r.versions(40):
        await r.call("expire", 40, v, hmac=b"not-a-token", expiry_time_period=-1)
    for v in r.versions(41):
        await r.call("describe", 41, v, owners=owner)
        await r.call("describe all", 41, v, owners=None)


# What a producer pushes (KIP-714): OpenTelemetry's MetricsData, one gauge.
_METRICS_DATA = otlp.MetricsData(
    resource_metrics=[
        otlp.ResourceMetrics(
            scope_metrics=[
                otlp.ScopeMetrics(
                    metrics=[
                        otlp.Metric(
                            name="org.apache.kafka.producer.buffer.available.bytes",
                            gauge=otlp.Gauge(data_points=[otlp.NumberDataPoint(as_int=4096)]),
                        )
                    ]
                )
            ]
        )
    ]
).SerializeToString()


@scenario
async def write_txn_markers(r: Run) -> None:
    """What `kafka-transactions.sh abort` sends for a hanging transaction (Admin's
    abortTransaction): an abort marker straight to the partition."""
    topic = r.topic("t")
    await r.topics(topic)
    await r.coordinators(*((1, r.topic(f"tid-v{v}")) for v in r.versions(27)))
    for v in r.versions(27):
        tid = r.topic(f"tid-v{v}")
        pid, epoch = await r.init_producer(tid)
        await r.quiet(
            24,
            3,
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[{"name": topic, "partitions": [0]}],
        )
        data = batch_of(
            [b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        )
        await r.quiet(
            0, 9, transactional_id=tid, acks=-1, timeout=30_000, topic_data=_topic_data(topic, data)
        )
        marker = {
            "producer_id": pid,
            "producer_epoch": epoch,
            "transaction_result": False,
            "coordinator_epoch": 0,
            "topics": [{"name": topic, "partition_indexes": [0]}],
        }
        await r.call("abort marker", 27, v, markers=[marker])
        await r.call(
            "unknown partition",
            27,
            v,
            markers=[
                {**marker, "topics": [{"name": r.topic("missing"), "partition_indexes": [0]}]}
            ],
        )


# -- share groups (KIP-932) ------------------------------------------------------------------------

_SHARE_CONFIGS = [
    "share.auto.offset.reset",
    "share.delivery.count.limit",
    "share.isolation.level",
    "share.record.lock.duration.ms",
    "share.session.timeout.ms",
]


def _share_acks(topic_id: Any, batches: list[tuple[int, int, list[int]]]) -> list[Any]:
    return [
        {
            "topic_id": topic_id,
            "partitions": [
                {
                    "partition_index": 0,
                    "acknowledgement_batches": [
                        {"first_offset": a, "last_offset": b, "acknowledge_types": t}
                        for a, b, t in batches
                    ],
                }
            ],
        }
    ]


@scenario
async def share_group(r: Run) -> None:
    """A share group's life at every version of its calls: its configs, a member that joins
    and is assigned, share sessions that acquire, acknowledge (accept, release, reject) and
    close, each session error, the group described and listed, its offsets described, reset
    and deleted, and the group deleted."""
    topic = r.topic("t")
    await r.topics(topic, partitions=2)
    topic_id = (await r.quiet(3, 12, topics=[{"name": topic}])).topics[0].topic_id
    groups = [r.topic(f"g{v}") for v in r.versions(78)]
    await r.coordinators(*((0, g) for g in groups))
    group_resource = {"resource_type": 32, "resource_name": groups[0]}
    await r.call(
        "group configs, defaults",
        32,
        4,
        resources=[{**group_resource, "configuration_keys": _SHARE_CONFIGS}],
    )
    for name, value in [("share.nope", "1"), ("share.record.lock.duration.ms", "1000")]:
        await r.call(
            f"group config {name}={value}",
            44,
            1,
            resources=[
                {
                    **group_resource,
                    "configs": [{"name": name, "config_operation": 0, "value": value}],
                }
            ],
        )
    for group in groups:
        await r.quiet(
            44,
            1,
            resources=[
                {
                    "resource_type": 32,
                    "resource_name": group,
                    "configs": [
                        {
                            "name": "share.auto.offset.reset",
                            "config_operation": 0,
                            "value": "earliest",
                        }
                    ],
                }
            ],
        )
    await r.call(
        "group configs, set",
        32,
        4,
        resources=[{**group_resource, "configuration_keys": _SHARE_CONFIGS}],
    )
    await r.produce(topic, [b"a", b"b", b"c", b"d", b"e"])
    joining = {"member_epoch": 0, "subscribed_topic_names": [topic]}
    for v, group in zip(r.versions(78), groups, strict=True):
        member = f"s{v}-aaaaaaaaaaaaaaaaaaaaa"[:22]
        await r.call("join, no member id", 76, 1, group_id=group, member_id="", **joining)
        await r.call("join, no topics", 76, 1, group_id=group, member_id=member, member_epoch=0)
        # Kafka assigns once it has initialized the share partitions: wait for it (not compared).
        epoch = 0
        for _ in range(200):
            beat = await r.quiet(
                76, 1, group_id=group, member_id=member, member_epoch=epoch,
                subscribed_topic_names=[topic],
            )  # fmt: skip
            epoch = beat.member_epoch
            if beat.assignment is not None and beat.assignment.topic_partitions:
                break
            await asyncio.sleep(0.1)
        await r.call("heartbeat", 76, 1, group_id=group, member_id=member, member_epoch=epoch)
        await r.call(
            "heartbeat, fenced epoch",
            76,
            1,
            group_id=group,
            member_id=member,
            member_epoch=epoch + 5,
        )
        await r.call(
            "heartbeat, unknown member",
            76,
            1,
            group_id=group,
            member_id="stranger-stranger-stra",
            member_epoch=1,
        )
        await r.call(
            "describe", 77, 1, group_ids=[group, r.topic("nobody")],
            include_authorized_operations=False,
        )  # fmt: skip
        fetching = {"group_id": group, "member_id": member, "max_wait": 5000, "min_bytes": 1}
        fetching |= {"max_bytes": 1 << 20, "max_records": 500, "batch_size": 500}
        both = [
            {"topic_id": topic_id, "partitions": [{"partition_index": 0}, {"partition_index": 1}]}
        ]
        await r.call(
            "fetch, open with acknowledgements",
            78,
            v,
            share_session_epoch=0,
            topics=_share_acks(topic_id, [(0, 0, [1])]),
            **fetching,
        )
        await r.call("fetch, open", 78, v, share_session_epoch=0, topics=both, **fetching)
        await r.call(
            "fetch, accept 0-1, release 2, reject 3-4",
            78,
            v,
            share_session_epoch=1,
            topics=_share_acks(topic_id, [(0, 1, [1]), (2, 2, [2]), (3, 4, [3])]),
            **fetching,
        )
        acknowledging = {"group_id": group, "member_id": member}
        await r.call(
            "acknowledge 2",
            79,
            v,
            share_session_epoch=2,
            topics=_share_acks(topic_id, [(2, 2, [1])]),
            **acknowledging,
        )
        await r.call(
            "acknowledge 2 again",
            79,
            v,
            share_session_epoch=3,
            topics=_share_acks(topic_id, [(2, 2, [1])]),
            **acknowledging,
        )
        await r.call("acknowledge, open", 79, v, share_session_epoch=0, topics=[], **acknowledging)
        await r.call("fetch, wrong epoch", 78, v, share_session_epoch=9, topics=[], **fetching)
        await r.call(
            "fetch, no session",
            78,
            v,
            share_session_epoch=1,
            topics=[],
            **{**fetching, "member_id": "stranger-stranger-stra"},
        )
        for d in r.versions(90):
            await r.call(
                "offsets, described",
                90,
                d,
                groups=[
                    {"group_id": group, "topics": [{"topic_name": topic, "partitions": [0, 1]}]}
                ],
            )
        await r.call(
            "offsets, reset while a member is in",
            91,
            0,
            group_id=group,
            topics=[
                {"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": 1}]}
            ],
        )
        await r.call(
            "fetch, close", 78, v, share_session_epoch=-1, topics=[], **{**fetching, "max_wait": 0}
        )
        await r.call("leave", 76, 1, group_id=group, member_id=member, member_epoch=-1)
    for v in r.versions(16):
        await r.call(
            "listed",
            16,
            v,
            keep=lambda a: {
                **a,
                "groups": sorted(
                    (g for g in a["groups"] if g["group_id"] in groups),
                    key=lambda g: g["group_id"],  # a broker lists groups in no set order
                ),
            },
            states_filter=[],
            types_filter=["share"],
        )
    group = groups[0]
    await r.call(
        "offsets, reset",
        91,
        0,
        group_id=group,
        topics=[{"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": 1}]}],
    )
    await r.call(
        "offsets, described after the reset",
        90,
        1,
        groups=[{"group_id": group, "topics": [{"topic_name": topic, "partitions": [0]}]}],
    )
    await r.call("offsets, deleted", 92, 0, group_id=group, topics=[{"topic_name": topic}])
    await r.call(
        "offsets, deleted, unknown topic",
        92,
        0,
        group_id=group,
        topics=[{"topic_name": r.topic("missing")}],
    )
    await r.call(
        "offsets, described after the deletion",
        90,
        1,
        groups=[{"group_id": group, "topics": [{"topic_name": topic, "partitions": [0]}]}],
    )
    await r.call("group deleted", 42, 2, groups_names=[group])


def _streams_topology(source: str, group: str, epoch: int = 0) -> dict[str, Any]:
    """Kafka Streams' usual shape: subtopology 0 reads `source` and writes a repartition topic,
    1 reads it into a store with a compacted changelog."""
    repartition, changelog = f"{group}-rep", f"{group}-store-changelog"

    def info(name: str, configs: dict[str, str]) -> dict[str, Any]:
        return {
            "name": name,
            "partitions": 0,
            "replication_factor": 0,
            "topic_configs": [{"key": k, "value": v} for k, v in configs.items()],
        }

    subtopology: dict[str, Any] = {
        "source_topic_regex": [],
        "state_changelog_topics": [],
        "repartition_sink_topics": [],
        "repartition_source_topics": [],
        "copartition_groups": [],
    }
    return {
        "epoch": epoch,
        "subtopologies": [
            {
                **subtopology,
                "subtopology_id": "0",
                "source_topics": [source],
                "repartition_sink_topics": [repartition],
            },
            {
                **subtopology,
                "subtopology_id": "1",
                "source_topics": [],
                "repartition_source_topics": [info(repartition, {"retention.ms": "-1"})],
                "state_changelog_topics": [info(changelog, {"cleanup.policy": "compact"})],
            },
        ],
    }


def _streams_beat(group: str, member: str, epoch: int, **fields: Any) -> dict[str, Any]:
    return {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "endpoint_information_epoch": 0,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": 30000 if epoch == 0 else -1,
        "topology": None,
        # Joining, a member owns nothing (empty lists, as Kafka requires); later, None: as before.
        "active_tasks": [] if epoch == 0 else None,
        "standby_tasks": [] if epoch == 0 else None,
        "warmup_tasks": [] if epoch == 0 else None,
        "process_id": "process-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" if epoch == 0 else None,
        "user_endpoint": None,
        "client_tags": None,
        "task_offsets": None,
        "task_end_offsets": None,
        "shutdown_application": False,
        **fields,
    }


@scenario
async def streams_group(r: Run) -> None:
    """A streams group's life (KIP-1071): joins refused (no topology, no member id, a bad
    topology), a member that joins with its topology, whose internal topics the coordinator
    makes, assigned every task, heartbeating, fenced and unknown epochs, a missing source topic's
    status, the group described and listed, the member leaving, and the group deleted."""
    source = r.topic("in")
    await r.topics(source, partitions=2)
    group, other = r.topic("app"), r.topic("missing-app")
    await r.coordinators((0, group), (0, other))
    member = "streams-aaaaaaaaaaaaaa"
    topology = _streams_topology(source, group)
    await r.call("join, no topology", 88, 0, **_streams_beat(group, member, 0))
    await r.call("join, no member id", 88, 0, **_streams_beat(group, "", 0, topology=topology))
    twice = {**topology, "subtopologies": [topology["subtopologies"][0]] * 2}
    await r.call(
        "join, subtopology ids repeat", 88, 0, **_streams_beat(group, member, 0, topology=twice)
    )
    # Kafka creates the internal topics beside the heartbeat, and assigns once they are there:
    # wait for it (not compared).
    epoch, tasks = 0, None
    joining: dict[str, Any] = {"topology": topology}
    for _ in range(200):
        beat = await r.quiet(88, 0, **_streams_beat(group, member, epoch, **joining))
        epoch, joining = beat.member_epoch, {}
        if beat.active_tasks:
            tasks = [
                {"subtopology_id": t.subtopology_id, "partitions": list(t.partitions)}
                for t in beat.active_tasks
            ]
            if len(tasks) == 2:
                break
        await asyncio.sleep(0.1)
    owning = {"active_tasks": tasks, "standby_tasks": [], "warmup_tasks": []}
    await r.call("heartbeat", 88, 0, **_streams_beat(group, member, epoch, **owning))
    await r.call("heartbeat, fenced epoch", 88, 0, **_streams_beat(group, member, epoch + 5))
    await r.call(
        "heartbeat, unknown member", 88, 0, **_streams_beat(group, "stranger-stranger-stra", 1)
    )
    missing = _streams_topology(r.topic("nowhere"), other)
    await r.call(
        "join, missing source topic",
        88,
        0,
        **_streams_beat(other, member, 0, topology=missing),
    )
    await r.call(
        "describe", 89, 0, group_ids=[group, r.topic("nobody")],
        include_authorized_operations=False,
    )  # fmt: skip
    for v in r.versions(16):
        await r.call(
            "listed",
            16,
            v,
            keep=lambda a: {
                **a,
                "groups": sorted(
                    (g for g in a["groups"] if g["group_id"] in (group, other)),
                    key=lambda g: g["group_id"],
                ),
            },
            states_filter=[],
            types_filter=["streams"],
        )
    await r.call("leave", 88, 0, **_streams_beat(group, member, -1))
    await r.call("leave, other", 88, 0, **_streams_beat(other, member, -1))
    await r.call(
        "described after leaving", 89, 0, group_ids=[group], include_authorized_operations=False
    )
    await r.call(
        "group deleted",
        42,
        2,
        keep=lambda a: {**a, "results": sorted(a["results"], key=lambda g: g["group_id"])},
        groups_names=[group, other],
    )


@scenario
async def unsupported_versions(r: Run) -> None:
    # Below the versions served: Kafka 4 serves Produce from 3 and Fetch from 4.
    await r.raw("produce v2", 0, 2, 0, b"")
    await r.raw("fetch v3", 1, 3, 4, b"")


# The differences that remain, by `scenario/step/vVERSION/path` pattern (fnmatch), with their
# reasons. `docs/pages/conformance.md` is made from the run and these.
_GROUP_EPOCHS = (
    "Epoch numbering: Kafka's group epoch also rises when it first resolves the subscribed "
    "topics (2 after one join); the listener's counts membership and assignment changes only "
    "(1). Clients compare an epoch only with the last one they were given."
)
_FIRST_ASSIGNMENT = (
    "Kafka computes a new member's assignment beside its first heartbeat and gives it in that "
    "answer or in a later one, as the race goes; the listener assigns in the first answer."
)
_SHARE_START = (
    "The listener answers a share partition's start offset as its store holds it, moved on by "
    "every acknowledgement; Kafka answers the one its share coordinator last persisted, which "
    "trails it (here the start after the first acknowledgements), and -1 for a partition whose "
    "share state holds nothing yet, where the listener has its initial offset. The lag agrees."
)
_STREAMS_EPOCHS = (
    "Epoch numbering: Kafka's streams group epoch also rises when it configures the topology "
    "and again once the internal topics it asked for exist (3 after one join); the listener "
    "makes the internal topics within the joining heartbeat and counts membership and "
    "assignment changes only (1). Clients compare an epoch only with the last one they were "
    "given."
)
KNOWN: list[tuple[str, str]] = [
    ("streams-group/*/member_epoch", _STREAMS_EPOCHS),
    ("streams-group/*/group_epoch", _STREAMS_EPOCHS),
    ("streams-group/*/assignment_epoch", _STREAMS_EPOCHS),
    (
        "streams-group/join, subtopology ids repeat/v0/error_code",
        "Kafka's coordinator fails on a topology whose subtopology ids repeat "
        "(UNKNOWN_SERVER_ERROR); the listener refuses it as STREAMS_INVALID_TOPOLOGY.",
    ),
    ("share-group/offsets, described/v*/groups/0/topics/0/partitions/*/start_offset", _SHARE_START),
    ("share-group/offsets, described/v1/groups/0/topics/0/partitions/1/lag", _SHARE_START),
    (
        "client-telemetry/subscribed/v0/delta_temporality",
        "Clients are asked for cumulative values, which `GET /metrics` serves to Prometheus as "
        "they come; Kafka's broker asks for deltas, for the OTLP backends its receiver plugins "
        "feed.",
    ),
    (
        "client-telemetry/not metrics/v0/error_code",
        "The listener decodes a push as OpenTelemetry's MetricsData to show it in `GET /metrics`, "
        "and answers one that does not decode INVALID_RECORD, as Kafka answers a receiver "
        "plugin's failure; Kafka's broker without a receiver plugin reads no push at all.",
    ),
    (
        "api-versions/supported/v*/api_keys",
        "The listener serves a subset of Kafka 4.4's APIs and versions (kafka.md lists the "
        "unserved ones: inter-broker, KRaft-controller, streams groups, and others).",
    ),
    (
        "api-versions/supported/v3/*_features",
        "The listener advertises the features it implements, group.version 1 (KIP-848), "
        "share.version 1 (KIP-932) and transaction.version 2 (KIP-890), finalized at Kafka 4's "
        "levels; metadata.version, streams.version and eligible.leader.replicas.version are "
        "KRaft's and groups' the listener does not serve.",
    ),
    (
        "api-versions/unknown version/v127/api_keys/0/max_version",
        "ApiVersions is served up to version 3 (Kafka 4.4: 5); the answer names ApiVersions's own "
        "versions only, as Kafka's does.",
    ),
    (
        "metadata/auto-created/v*/topics/0/*",
        "Auto-creation is synchronous here: the first Metadata answer already has the topic. "
        "Kafka's broker asks its controller to make it and answers UNKNOWN_TOPIC_OR_PARTITION "
        "until it exists; clients retry.",
    ),
    (
        "create-topics/validate only/v7/topics/0/topic_id",
        "A validate-only CreateTopics makes no topic, so it has no id to answer (zero); Kafka "
        "makes one up.",
    ),
    (
        "produce-idempotent/duplicate/v*/responses/0/partition_responses/0/log_append_time",
        "A duplicate is answered with its original offsets; Kafka adds the time from its dedup "
        "cache as the log append time, the listener -1 (the topic's CreateTime).",
    ),
    (
        "produce-idempotent/*/log_start_offset",
        "Beside a sequence or epoch refusal Kafka gives the partition's log start offset; the "
        "listener -1, its refusal decided before it reads the partition's bounds.",
    ),
    (
        "transactions/describe/v0/*",
        "A completed transaction's start time: Kafka keeps the last one; the listener keeps none "
        "and answers -1, which kio (the corpus's codec) cannot read as a time.",
    ),
    ("consumer-group/*/member_epoch", _GROUP_EPOCHS),
    ("static-consumer-group/*/member_epoch", _GROUP_EPOCHS),
    ("consumer-group/*/group_epoch", _GROUP_EPOCHS),
    ("consumer-group/*/assignment_epoch", _GROUP_EPOCHS),
    ("consumer-group/join/v0/assignment/topic_partitions", _FIRST_ASSIGNMENT),
    (
        "consumer-group/describe/v0/groups/*/members/0/*assignment/topic_partitions",
        _FIRST_ASSIGNMENT,
    ),
    (
        "one-broker/log dirs/v4/results/0/*_bytes",
        "The store's size and free space are the database's: the listener reports -1 (unknown).",
    ),
    (
        "client-quotas/a byte rate/v*/entries/0/error_*",
        "Only the quota enforced here, controller_mutation_rate, is kept; a byte-rate or request "
        "quota that nothing enforces is refused (INVALID_REQUEST, saying so) where Kafka keeps it.",
    ),
    (
        "client-quotas/a client id/v*/entries/0/error_*",
        "Quotas are kept per user here (the mutation rate is per principal): a client id's or an "
        "IP's is refused (INVALID_REQUEST, saying so) where Kafka keeps it.",
    ),
    (
        "one-broker/client quotas/v*/entries",
        "The listener's limit on topic creation is a default quota (controller_mutation_rate for "
        "every user); Kafka has none set.",
    ),
    (
        "one-broker/topic partitions/v0/topics/1/topic_authorized_operations",
        "Beside a topic that does not exist Kafka still gives the operations the client could "
        "perform on it; the listener answers them for existing topics only.",
    ),
    (
        "create-topics/*/v*/topics/0/configs/*/value",
        "max.message.bytes defaults to COORDINATOR_MAX_REQUEST_BYTES (8 MiB) here, one setting "
        "bounding a batch on both doors; Kafka's default is 1048588.",
    ),
    (
        "configs/every config/v*/results/0/configs/*/value",
        "max.message.bytes defaults to COORDINATOR_MAX_REQUEST_BYTES (8 MiB) here, one setting "
        "bounding a batch on both doors; Kafka's default is 1048588.",
    ),
    (
        "*/configs/*/config_source",
        "min.insync.replicas: Kafka 4's storage format sets it as a cluster-wide dynamic default "
        "(source 3); here it is a plain topic default (5), which replication does not read.",
    ),
    (
        "one-broker/sasl handshake/*",
        "The listener takes SASL on its one listener whenever a client starts it (and requires "
        "it when a tokens file is set); Kafka's PLAINTEXT listener refuses a handshake with "
        "ILLEGAL_SASL_STATE.",
    ),
]

# Patterns of KNOWN where Kafka's own answer varies from run to run (a race inside the broker):
# a run of `bench/conformance.py` in which they explain nothing does not call them stale.
RACY = {
    "consumer-group/join/v0/assignment/topic_partitions",
    "consumer-group/describe/v0/groups/*/members/0/*assignment/topic_partitions",
}
