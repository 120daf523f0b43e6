"""Brokers in the store (coordinator.cluster.brokers), on both stores: ids by address, leases,
leadership placed and moved with its epoch, and appends fenced by the leader and epoch they were
taken under, on the locking path and on Postgres's one-statement path alike."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from coordinator.cluster import brokers
from coordinator.cluster.errors import DuplicateBroker
from coordinator.cluster.placement import Broker
from coordinator.core.clock import now_ms
from coordinator.log import produce
from coordinator.log.errors import NotLeaderOrFollower
from coordinator.log.models import Partition
from coordinator.log.produce import Append, Appended
from coordinator.store.engines import open_store
from sdk import recordbatch
from tests.support.api import create_topic, init_pid

LEASE = 60_000


async def _leaders(db: Any, topic: str) -> dict[int, tuple[int | None, int]]:
    async with db.read() as session:
        rows = await session.execute(
            select(Partition.partition, Partition.leader_id, Partition.leader_epoch).where(
                Partition.topic == topic
            )
        )
        return {p: (leader, epoch) for p, leader, epoch in rows}


async def _high_watermark(db: Any, topic: str, partition: int) -> int:
    async with db.read() as session:
        found = await session.scalar(
            select(Partition.high_watermark).where(
                Partition.topic == topic, Partition.partition == partition
            )
        )
        assert found is not None
        return found


async def test_ids_come_from_addresses_and_a_live_id_is_not_taken_twice(app: Any) -> None:
    db, now = app.state.db, now_ms()
    first = await brokers.register(db, None, "h", 1, None, LEASE, now)
    second = await brokers.register(db, None, "h", 2, "r2", LEASE, now)
    assert (first, second) == (0, 1)
    assert await brokers.register(db, None, "h", 1, None, LEASE, now) == 0  # the same listener
    with pytest.raises(DuplicateBroker):
        await brokers.register(db, 1, "h", 3, None, LEASE, now)
    await brokers.leave(db, 1)
    assert await brokers.register(db, 1, "h", 3, None, LEASE, now) == 1  # a lapsed id is free
    seen = await brokers.snapshot(db, now)
    assert seen.live == (Broker(0, "h", 1), Broker(1, "h", 3))


async def test_leadership_is_placed_then_moved_with_a_new_epoch(
    app: Any, client: httpx.AsyncClient
) -> None:
    db, now = app.state.db, now_ms()
    await create_topic(client, "t", partitions=4)
    assert set((await _leaders(db, "t")).values()) == {(None, 0)}
    await brokers.register(db, None, "h", 1, None, LEASE, now)
    await brokers.register(db, None, "h", 2, None, LEASE, now)
    assert await brokers.place(db, now) == 4
    placed = await _leaders(db, "t")
    assert sorted(leader for leader, _ in placed.values()) == [0, 0, 1, 1]
    assert {epoch for _, epoch in placed.values()} == {0}  # a first leader keeps epoch 0
    assert await brokers.place(db, now) == 0  # settled
    await brokers.leave(db, 1)
    assert await brokers.place(db, now) == 2
    moved = await _leaders(db, "t")
    for partition, (leader, epoch) in moved.items():
        assert leader == 0
        assert epoch == (1 if placed[partition][0] == 1 else 0)
    # Broker 1 comes back (its lease renewed): it takes its share again, at a newer epoch.
    await brokers.renew(db, Broker(1, "h", 2), LEASE, now)
    assert await brokers.place(db, now) == 2
    back = await _leaders(db, "t")
    assert sorted(e for lid, e in back.values() if lid == 1) in ([1, 1], [1, 2], [2, 2])


async def _append(app: Any, pid: int, sequence: int, leader: tuple[int, int] | None) -> Any:
    data = recordbatch.build(
        [(1, None, b"v", [])], producer_id=pid, producer_epoch=0, base_sequence=sequence
    )
    settings = app.state.settings
    checked = await produce.check_batch(settings, data, None)
    append = Append("t", 0, data, checked, None, len(data), leader)
    (result,) = await produce.append_all(app.state.db, settings, [append])
    return result


async def test_an_append_taken_under_a_lost_leadership_is_not_written(
    app: Any, client: httpx.AsyncClient
) -> None:
    db, now = app.state.db, now_ms()
    await create_topic(client, "t")
    pid = await init_pid(client)
    # Any broker may write a partition not placed yet, at epoch 0.
    assert isinstance(await _append(app, pid, 0, (7, 0)), Appended)
    await brokers.register(db, None, "h", 1, None, LEASE, now)
    await brokers.register(db, None, "h", 2, None, LEASE, now)
    await brokers.place(db, now)
    ((leader, epoch),) = (await _leaders(db, "t")).values()
    other = 1 - leader
    refused = await _append(app, pid, 1, (other, epoch))  # never its leader
    assert isinstance(refused, NotLeaderOrFollower)
    # Its leader writes (and the process has now seen the producer: Postgres's next append of
    # it goes in one statement, which checks the fence itself).
    assert isinstance(await _append(app, pid, 1, (leader, epoch)), Appended)
    await brokers.leave(db, leader)
    await brokers.place(db, now)
    assert (await _leaders(db, "t"))[0] == (other, epoch + 1)
    before = await _high_watermark(db, "t", 0)
    stale = await _append(app, pid, 2, (leader, epoch))  # a paused leader wakes
    assert isinstance(stale, NotLeaderOrFollower)
    assert await _high_watermark(db, "t", 0) == before  # nothing written
    assert isinstance(await _append(app, pid, 2, (other, epoch + 1)), Appended)
    # The HTTP door names no leader: its appends are not fenced.
    assert isinstance(await _append(app, pid, 3, None), Appended)
    assert await _high_watermark(db, "t", 0) == before + 2


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_partition_held_by_an_append_moves_at_a_later_beat(
    client: httpx.AsyncClient, app: Any
) -> None:
    """Postgres: a process paused in an append holds its partition's row; placement moves the
    others at once and that one once it is free, instead of waiting for it (on SQLite a writer
    holds the store's one write lock, which excludes every other writer anyway)."""
    db, now = app.state.db, now_ms()
    await create_topic(client, "held", partitions=2)
    await brokers.register(db, None, "h", 1, None, LEASE, now)
    await brokers.place(db, now)
    await brokers.register(db, None, "h", 2, None, LEASE, now)
    await brokers.leave(db, 0)
    other = open_store(app.state.settings)
    try:
        async with other.write() as session:  # the paused append's lock
            await session.execute(
                select(Partition.partition)
                .where(Partition.topic == "held", Partition.partition == 0)
                .with_for_update()
            )
            assert await brokers.place(db, now) == 1
            assert (await _leaders(db, "held"))[0] == (0, 0)
            assert (await _leaders(db, "held"))[1] == (1, 1)
        assert await brokers.place(db, now) == 1
        assert (await _leaders(db, "held"))[0] == (1, 1)
    finally:
        await other.dispose()


async def test_processes_registering_at_once_get_ids_of_their_own(app: Any) -> None:
    """Three listeners starting together (as a cluster's processes do) end with three ids, and
    each one's row is its own: none takes or removes another's (what let a starting process's
    first renewal fail before)."""
    db, now = app.state.db, now_ms()
    stores = [open_store(app.state.settings) for _ in range(3)]

    async def start(store: Any, port: int) -> int:
        for _ in range(5):
            found = await brokers.register(store, None, "h", port, None, LEASE, now)
            if found is not None:
                assert await brokers.renew(store, Broker(found, "h", port), LEASE, now)
                return found
        raise AssertionError("never registered")

    try:
        ids = await asyncio.gather(
            *(start(s, port) for s, port in zip(stores, (1, 2, 3), strict=True))
        )
    finally:
        for store in stores:
            await store.dispose()
    assert sorted(ids) == [0, 1, 2]
    seen = await brokers.snapshot(db, now)
    assert {(b.broker_id, b.port) for b in seen.live} == set(zip(ids, (1, 2, 3), strict=True))
