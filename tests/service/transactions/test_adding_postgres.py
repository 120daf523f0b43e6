"""AddPartitions in one statement on Postgres (coordinator.transactions.adding): a producer adding
partitions to its own transaction goes in one round trip and leaves what the locking path
leaves; every refusal writes nothing there and is the locking path's, which answers it as on
SQLite (test_transactions runs those on both stores).

Postgres only: SQLite always takes the locking path.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select, text, update

from coordinator.groups.inputs import CommittedOffset
from coordinator.store.postgres import PostgresStore
from coordinator.store.postgres import transactions as pg_transactions
from coordinator.transactions import service as transactions
from coordinator.transactions.errors import ProducerFenced
from coordinator.transactions.inputs import AddOffsets, Caller
from coordinator.transactions.models import Transaction, TransactionPartition
from tests.support.api import assert_problem, create_topic, read_all
from tests.support.services import Backend
from tests.support.txn import Instance, included, started


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def one_statement_adds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each AddPartitions' one statement returned: True when it added them."""
    seen: list[bool] = []
    real = PostgresStore.add_partitions_at_once

    async def spy(*args: Any, **kwargs: Any) -> bool:
        added = await real(*args, **kwargs)
        seen.append(added)
        return added

    monkeypatch.setattr(PostgresStore, "add_partitions_at_once", spy)
    return seen


async def started_ms(app: Any, tid: str) -> int | None:
    async with app.state.db.read() as session:
        found: int | None = await session.scalar(
            select(Transaction.started_ms).where(Transaction.transactional_id == tid)
        )
        return found


async def test_partitions_are_added_in_one_statement_and_the_end_marks_them(
    app: Any, client: httpx.AsyncClient, one_statement_adds: list[bool]
) -> None:
    await create_topic(client, "t", partitions=3)
    producer = await started(client, "a")

    answer = await producer.add(("t", 1), ("t", 0))

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"state": "Ongoing"}
    assert one_statement_adds == [True]
    assert await included(producer) == ("Ongoing", [("t", 0), ("t", 1)])
    started_at = await started_ms(app, "a")
    assert started_at is not None
    # Into the open transaction: one more partition, and one it holds already (kept once); the
    # transaction keeps its start.
    assert (await producer.add(("t", 2), ("t", 0))).status_code == 200
    assert one_statement_adds == [True, True]
    assert await included(producer) == ("Ongoing", [("t", 0), ("t", 1), ("t", 2)])
    assert await started_ms(app, "a") == started_at
    assert (await producer.produce("t", 1, "x")).status_code == 200
    # The end writes a marker on each partition added, written to or not.
    assert (await producer.end(commit=True)).status_code == 200
    for partition, records in ((0, 0), (1, 1), (2, 0)):
        answer = (await client.get("/v1/topics/t")).json()["partitions"][partition]
        assert answer["high_watermark"] == answer["last_stable_offset"] == records + 1
    assert [r["value"] for r in await read_all(client, "t", 1)] == ["x"]
    # The next transaction (a new epoch) starts with an add in one statement too.
    assert (await producer.add(("t", 0))).status_code == 200
    assert one_statement_adds == [True, True, True]
    assert await included(producer) == ("Ongoing", [("t", 0)])


async def test_refusals_write_nothing_and_are_the_locking_paths(
    client: httpx.AsyncClient, one_statement_adds: list[bool]
) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    assert (await producer.add(("t", 0))).status_code == 200

    # A partition that does not exist, beside one that does: neither is added.
    assert_problem(await producer.add(("t", 1), ("t", 7)), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(await producer.add(("u", 0)), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    # An epoch ahead of the producer's.
    ahead = Instance(client, "a", pid=producer.pid, epoch=producer.epoch + 1)
    assert_problem(await ahead.add(("t", 1)), 409, "INVALID_PRODUCER_EPOCH")
    # A producer id that is not the transaction's.
    stranger = Instance(client, "a", pid=producer.pid + 1000, epoch=producer.epoch)
    assert_problem(await stranger.add(("t", 1)), 409, "INVALID_PRODUCER_ID_MAPPING")
    # A prepared transaction takes no more partitions.
    assert (await producer.prepare()).status_code == 200
    assert_problem(await producer.add(("t", 1)), 409, "INVALID_TXN_STATE")
    # Fenced by a new instance.
    newer = await started(client, "a")
    assert_problem(await producer.add(("t", 1)), 409, "PRODUCER_FENCED")
    # An id nobody initialised.
    unknown = Instance(client, "nobody", pid=producer.pid, epoch=0)
    assert_problem(await unknown.add(("t", 1)), 404, "TRANSACTIONAL_ID_NOT_FOUND")

    assert one_statement_adds == [True, False, False, False, False, False, False, False]
    assert await included(newer) == ("Empty", [])


async def test_kafkas_add_offsets_goes_in_the_one_statement_of_an_add_of_no_partitions(
    app: Any, client: httpx.AsyncClient, one_statement_adds: list[bool]
) -> None:
    """Kafka's AddOffsetsToTxn (a group, no offsets yet) starts the transaction and writes
    nothing else: one round trip, as an AddPartitions; a refusal is the locking path's."""
    await create_topic(client, "t")
    producer = await started(client, "a")
    caller = Caller(producer.pid, producer.epoch)

    answer = await transactions.add_offsets(app.state.db, "a", AddOffsets(caller, "g"))

    assert answer.state == "Ongoing"
    assert one_statement_adds == [True]
    assert await included(producer) == ("Ongoing", [])
    assert await started_ms(app, "a") is not None
    # Its offsets come with TxnOffsetCommit, and commit with the transaction.
    offsets = AddOffsets(caller, "g", [CommittedOffset("t", 0, 5)])
    assert (await transactions.add_offsets(app.state.db, "a", offsets)).state == "Ongoing"
    assert (await producer.end(commit=True)).status_code == 200
    committed = (await client.get("/v1/groups/g/offsets")).json()
    assert [(o["topic"], o["partition"], o["offset"]) for o in committed["offsets"]] == [
        ("t", 0, 5)
    ]
    # A fenced producer's: nothing written, the locking path refuses it.
    with pytest.raises(ProducerFenced):
        await transactions.add_offsets(
            app.state.db, "a", AddOffsets(Caller(producer.pid, producer.epoch - 1), "g")
        )
    assert one_statement_adds == [True, False]


async def test_the_statement_leaves_its_connection_flushing_every_commit(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The add's commit alone is not flushed on its own: the connection it ran on, back in the
    pool, flushes the next unit's commit (an EndTxn's, say) as before."""
    await create_topic(client, "t")
    producer = await started(client, "a")
    async with app.state.db.autocommit() as connection:
        added = await pg_transactions.add_partitions(
            connection, "a", producer.pid, producer.epoch, [("t", 0)], 1
        )
        assert added
        assert await connection.scalar(text("SHOW synchronous_commit")) == "on"
    assert await included(producer) == ("Ongoing", [("t", 0)])


async def transaction_as_stored(app: Any, tid: str) -> dict[str, Any]:
    async with app.state.db.read() as session:
        txn = await session.get(Transaction, tid)
        assert txn is not None
        return {c.key: getattr(txn, c.key) for c in Transaction.__table__.columns}


async def lose_the_add(app: Any, tid: str, before: dict[str, Any]) -> None:
    """The rows as a crash of the store leaves them when the add's commit never reached its
    disk: as they were before it."""
    async with app.state.db.write() as session:
        await session.execute(
            delete(TransactionPartition).where(TransactionPartition.transactional_id == tid)
        )
        await session.execute(
            update(Transaction).where(Transaction.transactional_id == tid).values(**before)
        )


async def test_an_add_lost_with_its_commit_leaves_nothing_wrong_behind(
    app: Any, client: httpx.AsyncClient, one_statement_adds: list[bool]
) -> None:
    """What a crash of the store can lose of an add, whose commit is not flushed on its own, is
    the add alone (what rests on it is written by later commits, which flush it along): the
    producer's batch joins and starts the transaction itself, and commits once."""
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    assert (await producer.add(("t", 0))).status_code == 200
    assert (await producer.produce("t", 0, "x")).status_code == 200
    assert (await producer.end(commit=True)).status_code == 200
    ended = await transaction_as_stored(app, "a")

    assert (await producer.add(("t", 1))).status_code == 200
    await lose_the_add(app, "a", ended)
    assert await included(producer) == ("CompleteCommit", [])
    assert (await producer.produce("t", 1, "y")).status_code == 200
    assert await included(producer) == ("Ongoing", [("t", 1)])
    assert (await producer.end(commit=True)).status_code == 200

    assert [r["value"] for r in await read_all(client, "t", 1)] == ["y"]
    state = (await client.get("/v1/topics/t")).json()["partitions"][1]
    assert state["high_watermark"] == state["last_stable_offset"] == 2
    assert one_statement_adds == [True, True]

    # Lost with nothing written on it, the add leaves an end nothing to end: a commit is
    # refused as it would be without the add, and nothing is written.
    ended = await transaction_as_stored(app, "a")
    assert (await producer.add(("t", 0))).status_code == 200
    await lose_the_add(app, "a", ended)
    assert_problem(await producer.end(commit=True), 409, "INVALID_TXN_STATE")
    assert await transaction_as_stored(app, "a") == ended
    state = (await client.get("/v1/topics/t")).json()["partitions"][0]
    assert state["high_watermark"] == state["last_stable_offset"] == 2
