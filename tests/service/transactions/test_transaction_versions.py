"""Kafka's two transaction versions, on SQLite and on Postgres.

Version 2 (KIP-890 part 2, the HTTP API's and Kafka 4's): a transactional batch adds its
partition itself, and the epoch that rises with every ended transaction fences every late batch
of an ended one, in either format, so it can never join a later transaction.

Version 1 (Kafka's clients before KIP-890, as the Kafka listener serves them): EndTxn keeps the
epoch, the next transaction runs at it, and a retried EndTxn is recognised only while no
transaction is open. And a running producer's own epoch bump (KIP-360's InitProducerId), which
only the current instance may make."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from coordinator.transactions import aborts, service
from coordinator.transactions import producer_ids as producers
from coordinator.transactions.errors import InvalidTxnState, ProducerFenced
from coordinator.transactions.inputs import Caller, InitPid
from sdk import recordbatch as rb
from tests.support.api import assert_problem, create_topic, produce_batch, read_all
from tests.support.txn import Instance, partition_state, started

# -- version 2 ------------------------------------------------------------------------------------


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
    aborted = await aborts.abort_timed_out(app.state.db, now=2**62)  # type: ignore[attr-defined]
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


# -- version 1 ------------------------------------------------------------------------------------


async def end_v1(app: Any, producer: Instance, *, commit: bool) -> tuple[str, int, int]:
    answer = await service.end(
        app.state.db,
        producer.tid,
        Caller(producer.pid, producer.epoch),
        commit,
        version=1,
    )
    return answer.state, answer.producer_id, answer.producer_epoch


async def writing(client: httpx.AsyncClient, tid: str, value: str) -> Instance:
    """A new instance of `tid` with a transaction open on t-0 that holds `value`."""
    producer = await started(client, tid)
    await producer.add(("t", 0))
    await producer.produce("t", 0, value)
    return producer


async def values(client: httpx.AsyncClient) -> list[str]:
    return [r["value"] for r in await read_all(client, "t")]


async def test_end_keeps_the_epoch_and_a_retry_is_answered_without_a_second_marker(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = await writing(client, "p", "a")
    first = await end_v1(app, producer, commit=True)
    assert first == ("CompleteCommit", producer.pid, producer.epoch)
    assert await end_v1(app, producer, commit=True) == first  # the retry of a lost answer
    assert (await partition_state(client, "t", 0))["high_watermark"] == 2  # one marker
    with pytest.raises(InvalidTxnState):
        await end_v1(app, producer, commit=False)  # not the end that happened
    assert (await producer.describe())["producer_epoch"] == producer.epoch


async def test_the_next_transaction_runs_at_the_same_epoch_and_its_sequences_go_on(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = await writing(client, "p", "a")
    await end_v1(app, producer, commit=True)
    await producer.add(("t", 0))
    assert (await producer.produce("t", 0, "b")).status_code == 200  # sequence 1, same epoch
    # Once a transaction is open, the same EndTxn again is that transaction's, not a retry of
    # the last one.
    assert await end_v1(app, producer, commit=True) == (
        "CompleteCommit",
        producer.pid,
        producer.epoch,
    )
    assert await values(client) == ["a", "b"]
    assert (await producer.describe())["state"] == "CompleteCommit"


async def test_a_new_instance_still_fences_the_old_epoch(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    zombie = await writing(client, "p", "z")
    successor = await started(client, "p")  # aborts the zombie's transaction, raises the epoch
    assert successor.epoch > zombie.epoch
    with pytest.raises(ProducerFenced):
        await end_v1(app, zombie, commit=True)
    await successor.add(("t", 0))
    await successor.produce("t", 0, "s")
    assert (await end_v1(app, successor, commit=True))[2] == successor.epoch
    assert await values(client) == ["s"]


async def recover(app: Any, producer: Instance, given: tuple[int, int]) -> tuple[int, int]:
    answer = await producers.init_pid(
        app.state.db, app.state.settings, InitPid(producer.tid), given
    )
    return answer.producer_id, answer.producer_epoch


async def test_a_producer_bumps_its_own_epoch_and_a_retry_gets_the_same_answer(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = await writing(client, "p", "lost")
    mine = (producer.pid, producer.epoch)
    bumped = await recover(app, producer, mine)
    assert bumped == (producer.pid, producer.epoch + 1)
    assert await recover(app, producer, mine) == bumped  # its answer was lost: no second bump
    described = await producer.describe()
    assert (described["state"], described["producer_epoch"]) == ("Empty", bumped[1])
    assert await values(client) == []  # its open transaction was aborted
    assert (await partition_state(client, "t", 0))["high_watermark"] == 2  # one marker


async def test_a_zombie_bumping_its_epoch_is_fenced_and_fences_nobody(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    zombie = await started(client, "p")
    successor = await writing(client, "p", "s")
    for stale in ((zombie.pid, zombie.epoch), (zombie.pid + 1000, successor.epoch)):
        with pytest.raises(ProducerFenced):
            await recover(app, zombie, stale)
    # The successor's epoch and open transaction are untouched.
    assert await end_v1(app, successor, commit=True) == (
        "CompleteCommit",
        successor.pid,
        successor.epoch,
    )
    assert await values(client) == ["s"]


async def test_a_retried_bump_is_fenced_once_a_new_instance_raised_the_epoch(
    client: httpx.AsyncClient, app: Any
) -> None:
    first = await started(client, "p")
    mine = (first.pid, first.epoch)
    await recover(app, first, mine)
    successor = await started(client, "p")
    with pytest.raises(ProducerFenced):
        await recover(app, first, mine)
    assert (await successor.describe())["producer_epoch"] == successor.epoch
