"""Kafka's Fetch as the log fills it (issue 49, item 1): every partition of a request read in one
statement on Postgres, and long polls that sleep in the purgatory on the partitions they read,
woken by what moves those partitions (an append, a transaction's end), from this process or
another on the store; never by a timer. On SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from coordinator.core.settings import Settings
from coordinator.kafka import versions
from coordinator.kafka.server import KafkaListener
from coordinator.kafka.wire import Reply, Spliced, encode, encode_parts
from coordinator.log import produce
from coordinator.log import topics as log_topics
from coordinator.log.purgatory import PURGATORY
from coordinator.log.topics import TopicSpec
from coordinator.store.engines import open_store
from coordinator.transactions import service as transactions
from coordinator.transactions.inputs import Caller, InitPid
from coordinator.transactions.producer_ids import init_pid
from sdk import recordbatch
from tests.support.kafka_listener import connect, listener
from tests.support.kafka_wire import fetch_request
from tests.support.services import Backend

__all__ = ["listener"]

# Longer than any test here may take: a long poll that answers did so because it was woken.
LONG_POLL_MS = 120_000


async def _append(listener: KafkaListener, topic: str, partition: int, value: bytes) -> None:
    batch = recordbatch.build([(1, None, value, [])])
    await produce.produce_batch(listener.db, listener.settings, topic, partition, batch, None)


async def _waiting_on(*partitions: tuple[str, int]) -> None:
    """Until a fetch sleeps in the purgatory on each of `partitions` (a poll with a deadline)."""
    for _ in range(3000):
        if set(partitions) <= set(PURGATORY.watched()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no fetch waits on {partitions}")


async def test_a_long_poll_wakes_when_its_partition_moves_not_when_another_does(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("polled", 2))
    first, second = await connect(listener), await connect(listener)
    on_0 = asyncio.create_task(
        first.request(fetch_request("polled", (0,), max_wait_ms=LONG_POLL_MS))
    )
    on_1 = asyncio.create_task(
        second.request(fetch_request("polled", (1,), max_wait_ms=LONG_POLL_MS))
    )
    await _waiting_on(("polled", 0), ("polled", 1))

    await _append(listener, "polled", 1, b"for one")
    answered = await on_1
    assert answered.responses[0].partitions[0].records
    assert not on_0.done()  # the append to partition 1 woke nobody else

    await _append(listener, "polled", 0, b"for zero")
    records = (await on_0).responses[0].partitions[0].records
    assert [r.value for r in recordbatch.records(bytes(records))] == [b"for zero"]


async def test_a_transactions_end_wakes_a_read_committed_long_poll(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("committed", 1))
    started = await init_pid(listener.db, listener.settings, InitPid("writer"))
    pid, epoch = started.producer_id, started.producer_epoch
    batch = recordbatch.build(
        [(1, None, b"paid", [])],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional=True,
    )
    await produce.produce_batch(listener.db, listener.settings, "committed", 0, batch, "writer")
    connection = await connect(listener)
    polled = asyncio.create_task(
        connection.request(
            fetch_request("committed", (0,), isolation_level=1, max_wait_ms=LONG_POLL_MS)
        )
    )
    await _waiting_on(("committed", 0))
    assert not polled.done()  # the open transaction holds the LSO below its record

    await transactions.end(listener.db, "writer", Caller(pid, epoch), True)
    partition = (await polled).responses[0].partitions[0]
    assert partition.last_stable_offset == 2  # the record and its marker
    values = [r.value for r in recordbatch.records(bytes(partition.records))]
    assert values == [b"paid"]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_fetch_of_many_partitions_is_one_statement(
    listener: KafkaListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator.store.postgres import fetch as engine

    await log_topics.create_topic(listener.db, TopicSpec("many", 4))
    for partition in range(4):
        await _append(listener, "many", partition, b"x" * 100)
    statements: list[str] = []
    on_driver = engine.on_driver

    async def counting(connection: Any, sql: str, *args: Any) -> Any:
        statements.append(sql)
        return await on_driver(connection, sql, *args)

    monkeypatch.setattr(engine, "on_driver", counting)
    answer = await (await connect(listener)).fetch("many", (0, 1, 2, 3))

    assert len(statements) == 1
    assert [len(p.records or b"") > 0 for p in answer.responses[0].partitions] == [True] * 4


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_another_process_on_the_store_hears_which_partitions_moved(
    store: Backend,
) -> None:
    """What one process's appends move wakes the fetches of another (NOTIFY and LISTEN)."""
    here, there = (open_store(Settings(database_url=store.url)) for _ in range(2))
    heard: asyncio.Queue[Any] = asyncio.Queue()
    listening = asyncio.create_task(there.listen_moves(heard.put_nowait))
    try:
        # Until the listener listens: each round asks again, and the first heard ends it.
        while heard.empty():
            here.moved([("ready", 0)])
            await asyncio.sleep(0.05)
        while (await heard.get()) != [("ready", 0)]:
            pass
        here.moved([("t", 0), ("t", 3), ("other", 1)])
        moved: set[tuple[str, int]] = set()
        while moved != {("t", 0), ("t", 3), ("other", 1)}:
            got = await asyncio.wait_for(heard.get(), 30)
            moved |= {tp for tp in got if tp != ("ready", 0)}
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await here.dispose()
        await there.dispose()


@pytest.mark.parametrize("version", [4, 11, 12, 17])
def test_spliced_batches_make_the_frame_kio_would_encode(version: int) -> None:
    """A Fetch answer's batches go out as slices of their stored bytes, the leader epoch
    written over them: the frame is byte for byte the one with the batches joined in."""
    reply = Reply(1, version)
    batches = [
        recordbatch.build([(1, b"k", b"v" * size, [])], producer_id=-1, producer_epoch=-1)
        for size in (10, 300, 70_000)
    ]
    spliced = [Spliced(batches[:2], 7), Spliced(batches[2:], 7)]

    def answer(records: list[bytes]) -> Any:
        partitions = tuple(
            reply(
                "PartitionData",
                partition_index=i,
                error_code=ErrorCode.none,
                high_watermark=3,
                last_stable_offset=3,
                log_start_offset=0,
                aborted_transactions=None,
                records=r,
            )
            for i, r in enumerate(records)
        )
        topic = reply("FetchableTopicResponse", topic="t", topic_id=None, partitions=partitions)
        body = reply.body(error_code=ErrorCode.none, session_id=0, responses=(topic,))
        return versions.for_version(1, version, body)

    joined = [bytes(recordbatch.joined_with_leader_epoch(s.batches, 7)) for s in spliced]
    expected = encode(5, answer(joined))
    parts = encode_parts(5, answer([s.placeholder for s in spliced]), spliced)
    assert b"".join(parts) == expected
    # The stored batches themselves were not copied: their slices are views of them.
    assert any(isinstance(p, memoryview) and p.obj is batches[2] for p in parts)


async def test_a_name_no_topic_can_have_is_unknown_and_the_rest_of_the_fetch_is_read(
    listener: KafkaListener,
) -> None:
    # A NUL, which no store keeps, in one topic's name refuses that topic alone.
    await log_topics.create_topic(listener.db, TopicSpec("readable", 1))
    await _append(listener, "readable", 0, b"here")
    request = fetch_request("readable")
    request = dataclasses.replace(
        request, topics=request.topics + fetch_request("bad\0name").topics
    )
    answer = await (await connect(listener)).request(request)
    good, bad = answer.responses
    assert good.partitions[0].error_code == ErrorCode.none
    assert [r.value for r in recordbatch.records(bytes(good.partitions[0].records))] == [b"here"]
    assert bad.partitions[0].error_code == ErrorCode.unknown_topic_or_partition
