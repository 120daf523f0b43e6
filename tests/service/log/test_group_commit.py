"""Group commit (coordinator.log.produce): appends that wait while a unit of work writes go
together in the next one, and each is still answered on its own, as if it had gone alone.

The domain's calls on the app's store (both stores); the race of one batch's retries across
service processes is in test_concurrency.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from coordinator.core.errors import UnstorableText
from coordinator.core.schemas import INT32_MAX
from coordinator.log import group_commit, produce, sequences
from coordinator.log.errors import OutOfOrderSequenceNumber, UnknownTopicOrPartition
from coordinator.log.produce import Append, Appended
from sdk import recordbatch
from tests.support.api import create_topic, init_pid, read_all


async def append_of(
    app: Any, topic: str, partition: int, pid: int, sequence: int, values: list[bytes]
) -> Append:
    data = recordbatch.build(
        [(1, None, v, []) for v in values],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=sequence,
    )
    checked = await produce.check_batch(app.state.settings, data, None)
    return Append(topic, partition, data, checked, None)


@pytest.fixture
def group_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batches each unit of work wrote."""
    sizes: list[int] = []
    write_group, write_optimistic = group_commit.write_group, group_commit.write_optimistic

    async def locking(db: Any, settings: Any, batch: Any, seen: Any = None) -> Any:
        sizes.append(len(batch))
        return await write_group(db, settings, batch, seen)

    async def optimistic(db: Any, settings: Any, batch: Any, seen: Any) -> Any:
        written = await write_optimistic(db, settings, batch, seen)
        if written is not None:
            sizes.append(len(batch))
        return written

    monkeypatch.setattr(group_commit, "write_group", locking)
    monkeypatch.setattr(group_commit, "write_optimistic", optimistic)
    return sizes


async def values_of(client: httpx.AsyncClient, partition: int) -> list[str]:
    return [r["value"] for r in await read_all(client, "t", partition)]


async def test_a_group_answers_each_batch_as_if_it_went_alone(
    app: Any, client: httpx.AsyncClient, group_sizes: list[int]
) -> None:
    await create_topic(client, "t", 2)
    pid = await init_pid(client)
    first = await append_of(app, "t", 0, pid, 0, [b"a", b"b"])
    batch = [
        first,
        first,  # its retry, racing it in the same group
        await append_of(app, "t", 0, pid, 2, [b"c"]),  # the next
        await append_of(app, "t", 0, pid, 9, [b"x"]),  # a gap: fails alone
        await append_of(app, "t", 1, pid, 0, [b"d"]),  # another partition
        await append_of(app, "t", 7, pid, 0, [b"y"]),  # no such partition: fails alone
    ]

    results = await produce.append_all(app.state.db, app.state.settings, batch)

    assert group_sizes == [6]
    assert results[0] == Appended(0, 1, False, -1, 0)
    assert results[1] == Appended(0, 1, True, -1, 0)
    assert results[2] == Appended(2, 2, False, -1, 0)
    assert isinstance(results[3], OutOfOrderSequenceNumber)
    assert "expected sequence 3, got 9" in str(results[3])
    assert results[4] == Appended(0, 0, False, -1, 0)
    assert isinstance(results[5], UnknownTopicOrPartition)
    assert await values_of(client, 0) == ["a", "b", "c"]
    assert await values_of(client, 1) == ["d"]
    # The producer's state is where the group left it: the gap's sequence follows "c".
    follows = await append_of(app, "t", 0, pid, 3, [b"e"])
    assert (await produce.append_all(app.state.db, app.state.settings, [follows]))[0] == Appended(
        3, 3, False, -1, 0
    )


async def test_a_batch_the_store_refuses_fails_alone(
    app: Any, client: httpx.AsyncClient, group_sizes: list[int]
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    good = await append_of(app, "t", 0, pid, 0, [b"a"])
    refused = await append_of(app, "t\0", 0, pid, 0, [b"x"])  # no store takes a NUL

    results = await produce.append_all(app.state.db, app.state.settings, [good, refused])

    # The group's unit of work failed on the refused name; each batch then went alone.
    assert group_sizes == [2, 1, 1]
    assert results[0] == Appended(0, 0, False, -1, 0)
    assert isinstance(results[1], UnstorableText)
    assert await values_of(client, 0) == ["a"]


async def test_retries_of_one_batch_racing_with_other_producers_append_it_once(
    app: Any, client: httpx.AsyncClient, group_sizes: list[int]
) -> None:
    await create_topic(client, "t")
    racer, other = await init_pid(client), await init_pid(client)
    db, settings = app.state.db, app.state.settings
    copies = [await append_of(app, "t", 0, racer, 0, [b"r1", b"r2"]) for _ in range(12)]
    others = [await append_of(app, "t", 0, other, i, [f"o{i}".encode()]) for i in range(4)]

    answers = await asyncio.gather(
        *(produce.append_all(db, settings, [a]) for a in [*copies[:6], *others, *copies[6:]])
    )

    assert max(group_sizes) > 1  # they went together
    racing = [result for (result,) in answers[:6] + answers[10:]]
    assert all(isinstance(r, Appended) for r in racing)
    assert sum(not r.duplicate for r in racing) == 1
    assert len({(r.base_offset, r.last_offset) for r in racing}) == 1
    values = await values_of(client, 0)
    assert values.count("r1") == 1 and values.count("r2") == 1
    assert [v for v in values if v.startswith("o")] == ["o0", "o1", "o2", "o3"]
    assert values.index("r1") == racing[0].base_offset


async def test_a_producers_batches_waiting_together_are_appended_in_sequence_order(
    app: Any, client: httpx.AsyncClient, group_sizes: list[int]
) -> None:
    """Pipelined requests race on their connections: the later may be read first."""
    await create_topic(client, "t")
    pid = await init_pid(client)
    batch = [
        await append_of(app, "t", 0, pid, 3, [b"d"]),
        await append_of(app, "t", 0, pid, 0, [b"a", b"b"]),
        await append_of(app, "t", 0, pid, 2, [b"c"]),
    ]

    results = await produce.append_all(app.state.db, app.state.settings, batch)

    assert group_sizes == [3]
    assert results == [
        Appended(3, 3, False, -1, 0),
        Appended(0, 1, False, -1, 0),
        Appended(2, 2, False, -1, 0),
    ]
    assert await values_of(client, 0) == ["a", "b", "c", "d"]


def test_sequence_order_keeps_other_batches_in_place_and_runs_past_the_wrap() -> None:
    def append(partition: int, pid: int, epoch: int, sequence: int) -> Append:
        header = recordbatch.read_header(
            recordbatch.build(
                [(1, None, b"v", [])],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=sequence,
            )
        )
        return Append("t", partition, b"", recordbatch.Checked(header, 1, False), None)

    top = INT32_MAX - 1
    batch = [
        append(0, 7, 0, 5),  # 0
        append(0, -1, -1, -1),  # 1: no producer: stays
        append(0, 7, 0, 2),  # 2
        append(1, 7, 0, 1),  # 3: another partition: stays
        append(0, 7, 1, 0),  # 4: another epoch: stays
        append(0, 8, 0, 0),  # 5: past the wrap, after the large one
        append(0, 8, 0, top),  # 6
    ]

    assert sequences.in_sequence_order(batch) == [2, 1, 0, 3, 4, 6, 5]


@dataclass
class Units:
    """The partitions of every unit of work, in the order they started, and an event set
    when the first starts."""

    partitions: list[set[tuple[str, int]]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
def units(monkeypatch: pytest.MonkeyPatch) -> Units:
    """Fails an append whose unit of work starts on a partition another unit is writing."""
    seen = Units()
    writing: set[tuple[str, int]] = set()
    write_group, write_optimistic = group_commit.write_group, group_commit.write_optimistic

    def wrapped(write: Any) -> Any:
        async def unit(db: Any, settings: Any, batch: Any, seen_views: Any = None) -> Any:
            partitions = {(a.topic, a.partition) for a in batch}
            assert writing.isdisjoint(partitions), f"{partitions} already being written"
            seen.partitions.append(partitions)
            seen.started.set()
            writing.update(partitions)
            try:
                return await write(db, settings, batch, seen_views)
            finally:
                writing.difference_update(partitions)

        return unit

    monkeypatch.setattr(group_commit, "write_group", wrapped(write_group))
    monkeypatch.setattr(group_commit, "write_optimistic", wrapped(write_optimistic))
    return seen


async def test_appends_to_a_partition_being_written_wait_for_it_in_the_order_they_came(
    app: Any, client: httpx.AsyncClient, units: Units
) -> None:
    await create_topic(client, "t", 2)
    one, two = await init_pid(client), await init_pid(client)
    db, settings = app.state.db, app.state.settings
    pipelined = [await append_of(app, "t", 0, one, i, [f"a{i}".encode()]) for i in range(8)]
    beside = [await append_of(app, "t", 1, two, i, [f"b{i}".encode()]) for i in range(8)]
    interleaved = [a for pair in zip(pipelined[1:], beside, strict=False) for a in pair]

    first = asyncio.create_task(produce.append_all(db, settings, pipelined[:1]))
    await units.started.wait()  # the first batch's unit is writing partition 0
    rest = asyncio.gather(*(produce.append_all(db, settings, [a]) for a in interleaved))
    answers = [await first, *await rest]

    assert all(isinstance(result, Appended) for (result,) in answers)
    assert await values_of(client, 0) == [f"a{i}" for i in range(8)]
    assert await values_of(client, 1) == [f"b{i}" for i in range(7)]
    assert units.partitions[0] == {("t", 0)}
    assert len(units.partitions) > 1
