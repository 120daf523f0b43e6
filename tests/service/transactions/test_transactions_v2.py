"""Transaction version 2 (KIP-890 part 2), on SQLite and on Postgres: a transactional batch adds
its partition itself, and the epoch that rises with every ended transaction fences every late
batch of an ended one, in either format, so it can never join a later transaction."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from coordinator.log import recordbatch as rb
from coordinator.transactions import service
from tests.support.api import assert_problem, create_topic, produce_batch, read_all
from tests.support.txn import Instance, partition_state, started


def txn_batch(instance: Instance, sequence: int, *values: bytes) -> bytes:
    return rb.build(
        [(1, b"k", v, []) for v in values],
        producer_id=instance.pid,
        producer_epoch=instance.epoch,
        base_sequence=sequence,
        transactional=True,
    )


@pytest.mark.parametrize("commit", [True, False])
async def test_late_batch_of_an_ended_transaction_is_fenced_and_joins_nothing(
    client: httpx.AsyncClient, commit: bool
) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "p")
    late = txn_batch(producer, 1, b"late")  # built at the epoch of the first transaction
    assert (
        await produce_batch(client, "t", 0, txn_batch(producer, 0, b"a"), "p")
    ).status_code == 200
    assert (await producer.end(commit=commit)).status_code == 200
    # The next transaction is open at the new epoch when the late batch arrives.
    assert (await producer.produce("t", 1, "b")).status_code == 200
    for partition in (0, 1):
        assert_problem(
            await produce_batch(client, "t", partition, late, "p"), 409, "PRODUCER_FENCED"
        )
    assert (await producer.describe())["partitions"] == [{"topic": "t", "partition": 1}]
    assert (await producer.end(commit=True)).status_code == 200
    values = [r["value"] for p in (0, 1) for r in await read_all(client, "t", p)]
    assert values == (["a", "b"] if commit else ["b"])


async def test_zombie_batch_after_a_new_instance_is_fenced(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    zombie = await started(client, "p")
    assert (await zombie.produce("t", 0, "z")).status_code == 200
    await started(client, "p")  # InitPid: the zombie's transaction is aborted, its epoch fenced
    response = await produce_batch(client, "t", 0, txn_batch(zombie, 1, b"again"), "p")
    assert_problem(response, 409, "PRODUCER_FENCED")
    everything = await read_all(client, "t", isolation_level="read_uncommitted")
    assert [r["value"] for r in everything] == ["z"]
    assert await read_all(client, "t") == []  # aborted
    assert (await partition_state(client, "t", 0))["high_watermark"] == 2  # record and marker


async def test_late_batch_of_a_timed_out_transaction_is_told_so(
    client: httpx.AsyncClient, app: object
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "p")
    assert (await producer.produce("t", 0, "a")).status_code == 200
    aborted = await service.abort_timed_out(app.state.db, now=2**62)  # type: ignore[attr-defined]
    assert aborted == ["p"]
    response = await produce_batch(client, "t", 0, txn_batch(producer, 1, b"b"), "p")
    assert_problem(response, 409, "TRANSACTION_TIMED_OUT")


async def test_end_racing_a_batch_that_joins_a_new_partition_leaves_nothing_hanging(
    client: httpx.AsyncClient,
) -> None:
    # The batch locks the transactional id before the partition, as EndTxn does: either it
    # joins before the end (and gets a marker) or it is fenced after it. Never in between.
    await create_topic(client, "t", partitions=4)
    producer = await started(client, "p")
    for round_ in range(6):
        assert (await producer.produce("t", 0, f"first-{round_}")).status_code == 200
        partition = 1 + round_ % 3
        batch = txn_batch(producer, 0, f"racer-{round_}".encode())
        produced, ended = await asyncio.gather(
            produce_batch(client, "t", partition, batch, "p"), producer.end(commit=True)
        )
        assert ended.status_code == 200, ended.text
        assert produced.status_code in (200, 409), produced.text
        if produced.status_code == 409:
            assert produced.json()["code"] == "PRODUCER_FENCED"
    for partition in range(4):
        state = await partition_state(client, "t", partition)
        assert state["last_stable_offset"] == state["high_watermark"], state
    assert (await producer.describe())["state"] == "CompleteCommit"
