"""The Postgres statements of an append group run on asyncpg under SQLAlchemy's unit of work
(coordinator.log.appends): a connection the store cuts between them is an outage, retriable, the
pool does not hand that connection out again, and nothing of the unit was written; batches are
stored without Postgres compressing them again.

A group planned on what its process saw written goes in one statement (`write_optimistic`), and
takes the locking path whenever the rows say otherwise: another process appended, the topic's
configs or the producer's epoch changed. Each case is answered as the locking path answers it.

A transaction's later batches on a partition go in one statement as well, the transaction
checked Ongoing for its producer in it; so does its first batch there, which joins it (the
transaction checked in a state that takes it, and unchanged while the statement waited for it).

A fetch within one chunk is one statement too: its bounds, batches and aborted transactions.

Postgres only: SQLite runs every statement through SQLAlchemy, whose outage handling the store
outage tests cover on both stores.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text

from coordinator.core.errors import StoreUnavailable
from coordinator.log import appends, produce
from coordinator.log.errors import InvalidProducerEpoch, RecordListTooLarge
from coordinator.log.produce import Append, Appended
from coordinator.store import Store
from coordinator.store.engines import open_store
from coordinator.transactions import service as transactions
from coordinator.transactions.inputs import Caller
from sdk import recordbatch
from tests.support.api import assert_problem, create_topic, init_pid, read_all
from tests.support.locks import Blocking, waiting_for_a_lock
from tests.support.services import Backend, postgres_base_url
from tests.support.txn import partition_state, started


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


async def test_a_connection_cut_between_the_lock_and_the_writes_is_an_outage_and_writes_nothing(
    app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    lock = appends.lock_partitions
    cut: list[int] = []

    async def lock_then_cut(connection: Any, keys: Any) -> Any:
        locked = await lock(connection, keys)
        if not cut:
            backend = (await connection.get_raw_connection()).driver_connection.get_server_pid()
            admin = await asyncpg.connect(postgres_base_url())
            try:
                await admin.execute("SELECT pg_terminate_backend($1)", backend)
            finally:
                await admin.close()
            cut.append(backend)
        return locked

    monkeypatch.setattr(appends, "lock_partitions", lock_then_cut)
    data = recordbatch.build(
        [(1, None, b"a", [])], producer_id=pid, producer_epoch=0, base_sequence=0
    )
    db, settings = app.state.db, app.state.settings

    with pytest.raises(StoreUnavailable):
        await produce.produce_batch(db, settings, "t", 0, data, None)
    assert await read_all(client, "t") == []

    # The producer's retry is the batch's first write, on a connection the store did not cut.
    appended = await produce.produce_batch(db, settings, "t", 0, data, None)
    assert (appended.base_offset, appended.duplicate) == (0, False)
    assert [r["value"] for r in await read_all(client, "t")] == ["a"]
    assert len(cut) == 1


async def test_batch_payloads_are_stored_as_they_come(app: Any) -> None:
    """Postgres does not try to compress a stored batch again (EXTERNAL storage): producers'
    batches are compressed already or do not compress, and trying costs more than the write."""
    async with app.state.db.read() as session:
        storage = await session.scalar(
            text(
                "SELECT attstorage FROM pg_attribute "
                "WHERE attrelid = 'batches'::regclass AND attname = 'payload'"
            )
        )
    assert storage in ("e", b"e")  # "char": asyncpg answers it as bytes


async def append(
    db: Store, settings: Any, pid: int, sequence: int, values: list[bytes], epoch: int = 0
) -> Appended:
    data = recordbatch.build(
        [(1, None, v, []) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    checked = await produce.check_batch(settings, data, None)
    (result,) = await produce.append_all(db, settings, [Append("t", 0, data, checked, None)])
    if isinstance(result, BaseException):
        raise result
    return result


async def test_a_producers_appends_after_its_first_go_in_one_statement(
    app: Any, client: httpx.AsyncClient, paths: list[str]
) -> None:
    await create_topic(client, "t")
    await client.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "z"}]})
    pid = await init_pid(client)
    db, settings = app.state.db, app.state.settings

    first = await append(db, settings, pid, 0, [b"a", b"b"])
    second = await append(db, settings, pid, 2, [b"c"])
    third = await append(db, settings, pid, 3, [b"d", b"e"])
    retry = await append(db, settings, pid, 3, [b"d", b"e"])  # its original is in the log

    assert paths == ["locks", "locks", "one statement", "one statement", "locks"]
    assert first == Appended(1, 2, False, -1, 0)
    assert second == Appended(3, 3, False, -1, 0)
    assert third == Appended(4, 5, False, -1, 0)
    assert retry == Appended(4, 5, True, -1, 0)
    assert [r["value"] for r in await read_all(client, "t")] == ["z", "a", "b", "c", "d", "e"]
    # Each stored batch carries its own base offset, which the statement wrote into it.
    assert [r["offset"] for r in await read_all(client, "t")] == [0, 1, 2, 3, 4, 5]
    state = (await client.get("/v1/admin/producers", params={"topic": "t", "partition": 0})).json()
    assert [(p["producer_id"], p["last_sequence"]) for p in state["producers"]] == [(pid, 4)]


@pytest.fixture
async def other_process(app: Any) -> Any:
    """A second service process on the same store: its own pool and its own appends' memory."""
    db = open_store(app.state.settings)
    try:
        yield db
    finally:
        await db.dispose()


async def test_a_retry_of_what_another_process_appended_is_a_duplicate(
    app: Any, client: httpx.AsyncClient, paths: list[str], other_process: Store
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    db, settings = app.state.db, app.state.settings
    await append(db, settings, pid, 0, [b"a"])
    await append(db, settings, pid, 1, [b"b"])  # this process has seen sequence 1
    elsewhere = await append(other_process, settings, pid, 2, [b"c", b"d"])
    paths.clear()

    # To this process, sequence 2 is the next one; the locked state says it is written.
    retry = await append(db, settings, pid, 2, [b"c", b"d"])

    assert paths == ["locks"]
    assert retry == Appended(elsewhere.base_offset, elsewhere.last_offset, True, -1, 0)
    assert [r["value"] for r in await read_all(client, "t")] == ["a", "b", "c", "d"]
    # What the locking path read is this process's memory now: the next goes in one statement.
    assert await append(db, settings, pid, 4, [b"e"]) == Appended(4, 4, False, -1, 0)
    assert paths == ["locks", "one statement"]


async def appended_then_changed_elsewhere(
    app: Any, client: httpx.AsyncClient, other_process: Store, change: str, **params: Any
) -> int:
    """A producer id whose batch "a" this process appended (so it saw its state), after which
    another process ran `change`."""
    await create_topic(client, "t")
    pid = await init_pid(client)
    await append(app.state.db, app.state.settings, pid, 0, [b"a"])
    async with other_process.write() as session:
        await session.execute(text(change), {"p": pid, **params})
    return pid


async def test_a_topic_config_changed_elsewhere_is_the_one_applied(
    app: Any, client: httpx.AsyncClient, paths: list[str], other_process: Store
) -> None:
    db, settings = app.state.db, app.state.settings
    change = "UPDATE topics SET configs = :c WHERE name = 't'"
    pid = await appended_then_changed_elsewhere(
        app, client, other_process, change, c='{"max.message.bytes": "100"}'
    )
    paths.clear()

    with pytest.raises(RecordListTooLarge, match=r"max\.message\.bytes is 100"):
        await append(db, settings, pid, 1, [b"x" * 200])

    assert paths == ["locks"]
    assert [r["value"] for r in await read_all(client, "t")] == ["a"]


async def test_an_epoch_raised_elsewhere_fences_the_next_append(
    app: Any, client: httpx.AsyncClient, paths: list[str], other_process: Store
) -> None:
    db, settings = app.state.db, app.state.settings
    change = "UPDATE producer_ids SET producer_epoch = 1 WHERE producer_id = :p"
    pid = await appended_then_changed_elsewhere(app, client, other_process, change)
    paths.clear()

    with pytest.raises(InvalidProducerEpoch, match=r"older than its current epoch 1"):
        await append(db, settings, pid, 1, [b"b"])

    assert paths == ["locks"]
    assert [r["value"] for r in await read_all(client, "t")] == ["a"]


async def test_a_fetch_within_a_chunk_is_one_statement(
    app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator.log import fetch as log_fetch
    from coordinator.store.postgres import fetch as engine

    await create_topic(client, "t")
    for value in "abc":
        await client.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": value}]})
    statements: list[str] = []
    on_driver = engine.on_driver

    async def counting(connection: Any, sql: str, *args: Any) -> Any:
        statements.append(sql)
        return await on_driver(connection, sql, *args)

    def no_transaction() -> Any:
        raise AssertionError("a fetch within one chunk opens no transaction")

    monkeypatch.setattr(engine, "on_driver", counting)
    monkeypatch.setattr(app.state.db, "read", no_transaction)
    fetched = await log_fetch.fetch_batches(
        app.state.db, "t", 0, 1, max_bytes=10**6, read_committed=True, aborted_list=True
    )

    assert len(statements) == 1
    assert [recordbatch.read_header(b).base_offset for b in fetched.batches] == [1, 2]
    assert (fetched.next_offset, fetched.high_watermark, fetched.aborted) == (3, 3, [])


async def test_a_kafka_fetch_reads_no_payload_its_rules_cannot_take(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of 600 KB against budgets of 1 MB: the statement sends a partition's first batch
    # (even past the budget, as the rules take it), and never the one after it that would pass
    # its partition's budget or starts past the request's; the answer is the rules' all the same.
    import random

    from coordinator.log import fetch as log_fetch
    from coordinator.log import topics as log_topics
    from coordinator.log.topics import TopicSpec
    from coordinator.store.postgres import fetch as engine

    db, settings = app.state.db, app.state.settings
    await log_topics.create_topic(db, TopicSpec("big", 3))
    noise = random.Random(0).randbytes(600_000)
    for partition, batches in ((0, 3), (1, 2), (2, 1)):
        for _ in range(batches):
            batch = recordbatch.build([(1, b"k", noise, [])], producer_id=-1, producer_epoch=-1)
            await produce.produce_batch(db, settings, "big", partition, batch, None)
    sent: list[int] = []  # the payloads' sizes the statement answered with
    on_driver = engine.on_driver

    async def measuring(connection: Any, sql: str, *args: Any) -> Any:
        rows = await on_driver(connection, sql, *args)
        sent.extend(len(row[-1]) for row in rows if row[0] == 1 and row[-1] is not None)
        return rows

    monkeypatch.setattr(engine, "on_driver", measuring)

    async def fetch(partitions: list[int], max_bytes: int) -> list[list[bytes]]:
        sent.clear()
        asks = [log_fetch.PartitionAsk("big", p, 0, 1_000_000) for p in partitions]
        answers = await log_fetch.fetch_partitions(
            db, asks, max_bytes, 50 * 2**20, read_committed=True
        )
        return [answer.batches for answer in answers if isinstance(answer, log_fetch.Fetched)]

    # One partition: its first batch alone fits; the second would pass the partition's budget.
    answered = await fetch([0], 10**7)
    assert [len(batches) for batches in answered] == [1]
    assert sent == [len(answered[0][0])]
    # Three partitions within a request's budget of 1 MB: the first partition's batch, past it
    # for the second's, none sent for the third.
    answered = await fetch([0, 1, 2], 1_000_000)
    assert [len(batches) for batches in answered] == [1, 0, 0]
    assert sent == [len(answered[0][0])]
    # A budget under one batch: the first partition's first batch still comes, whole.
    answered = await fetch([1, 0], 100_000)
    assert [len(batches) for batches in answered] == [1, 0]
    assert sent == [len(answered[0][0])]


async def test_a_transactions_later_batches_on_a_partition_go_in_one_statement(
    client: httpx.AsyncClient, paths: list[str]
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "tx")

    assert (await producer.produce("t", 0, "a")).status_code == 200  # joins the partition
    assert (await producer.produce("t", 0, "b", "c")).status_code == 200
    assert (await producer.produce("t", 0, "d")).status_code == 200
    assert paths == ["locks", "one statement", "one statement"]
    assert await read_all(client, "t", isolation_level="read_committed") == []
    assert (await producer.end(commit=True)).status_code == 200

    committed = await read_all(client, "t", isolation_level="read_committed")
    assert [r["value"] for r in committed] == ["a", "b", "c", "d"]


async def test_a_transaction_no_longer_ongoing_refuses_the_batch_as_the_locks_do(
    client: httpx.AsyncClient, paths: list[str]
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "tx")
    assert (await producer.produce("t", 0, "a")).status_code == 200
    assert (await producer.produce("t", 0, "b")).status_code == 200
    # Prepared: same producer, same epoch, the partition's transaction still open there.
    assert (await producer.prepare()).status_code == 200
    paths.clear()

    refused = await producer.produce("t", 0, "c")

    assert paths == ["locks"]
    assert_problem(refused, 409, "INVALID_TXN_STATE")
    assert (await producer.end(commit=True)).status_code == 200
    committed = await read_all(client, "t", isolation_level="read_committed")
    assert [r["value"] for r in committed] == ["a", "b"]


async def test_a_batch_of_a_transaction_that_ended_is_fenced(
    client: httpx.AsyncClient, paths: list[str]
) -> None:
    await create_topic(client, "t")
    zombie = await started(client, "tx")
    assert (await zombie.produce("t", 0, "a")).status_code == 200
    assert (await zombie.produce("t", 0, "b")).status_code == 200
    # The transaction ends (its marker clears the open transaction on the partition); the
    # zombie keeps its epoch and sends its next batch.
    assert (await zombie.end(commit=False, adopt=False)).status_code == 200
    paths.clear()

    fenced = await zombie.produce("t", 0, "c")

    assert paths == ["locks"]
    assert_problem(fenced, 409, "PRODUCER_FENCED")
    assert await read_all(client, "t", isolation_level="read_committed") == []


@pytest.mark.parametrize("commit", [True, False])
async def test_a_transactions_first_batch_on_a_partition_it_wrote_before_joins_in_one_statement(
    client: httpx.AsyncClient, paths: list[str], commit: bool
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "tx")
    assert (await producer.produce("t", 0, "a")).status_code == 200  # never seen here: locks
    assert (await producer.end(commit=True)).status_code == 200  # marker at 1
    paths.clear()

    # The next transaction, at the epoch the end raised: its first batch joins and starts it.
    assert (await producer.produce("t", 0, "b")).json()["base_offset"] == 2
    assert (await producer.produce("t", 0, "c")).status_code == 200

    assert paths == ["one statement", "one statement"]
    described = await producer.describe()
    assert described["state"] == "Ongoing"
    assert [(p["topic"], p["partition"]) for p in described["partitions"]] == [("t", 0)]
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 2  # pinned at b
    assert (await producer.end(commit=commit)).status_code == 200
    committed = await read_all(client, "t", isolation_level="read_committed")
    assert [r["value"] for r in committed] == (["a", "b", "c"] if commit else ["a"])
    state = await partition_state(client, "t", 0)
    assert state["last_stable_offset"] == state["high_watermark"] == 5


async def test_a_join_fenced_while_it_waited_for_its_transaction_is_refused_as_the_locks_do(
    app: Any, client: httpx.AsyncClient, paths: list[str]
) -> None:
    await create_topic(client, "t")
    zombie = await started(client, "tx")
    assert (await zombie.produce("t", 0, "a")).status_code == 200
    assert (await zombie.end(commit=True)).status_code == 200
    paths.clear()
    # A new instance's InitPid, as the database sees it: the transaction's row rewritten and the
    # epoch raised, committed while the zombie's join waits for that row.
    fencing = (
        "UPDATE transactions SET updated_ms = updated_ms + 1 WHERE transactional_id = 'tx'",
        "UPDATE producer_ids SET producer_epoch = producer_epoch + 1 "
        f"WHERE producer_id = {zombie.pid}",
    )
    async with Blocking(app, *fencing) as done:
        joining = asyncio.create_task(zombie.produce("t", 0, "late"))
        await waiting_for_a_lock(app)
        done()

    assert_problem(await joining, 409, "PRODUCER_FENCED")
    assert paths == ["locks"]
    written = await read_all(client, "t", isolation_level="read_uncommitted")
    assert [r["value"] for r in written] == ["a"]


async def test_a_later_batch_fenced_while_it_waited_for_its_transaction_is_refused(
    app: Any, client: httpx.AsyncClient, paths: list[str]
) -> None:
    """A batch of a transaction already open on its partition, fenced while its statement waited
    for the transaction's row: a new instance's InitPid raised the epoch, and that instance's
    own transaction is Ongoing by the time the row is free. The statement's snapshot still shows
    the old epoch; the epoch it checks must be the one the lock freed (found by a fault run, in
    which such a zombie's batch joined the new instance's transaction and committed with it)."""
    await create_topic(client, "t")
    zombie = await started(client, "tx")
    assert (await zombie.produce("t", 0, "a")).status_code == 200
    paths.clear()
    fencing = (
        "UPDATE transactions SET updated_ms = updated_ms + 1 WHERE transactional_id = 'tx'",
        "UPDATE producer_ids SET producer_epoch = producer_epoch + 1 "
        f"WHERE producer_id = {zombie.pid}",
    )
    async with Blocking(app, *fencing) as done:
        later = asyncio.create_task(zombie.produce("t", 0, "late"))
        await waiting_for_a_lock(app)
        done()

    assert_problem(await later, 409, "PRODUCER_FENCED")
    assert paths == ["locks"]
    written = await read_all(client, "t", isolation_level="read_uncommitted")
    assert [r["value"] for r in written] == ["a"]


@pytest.mark.parametrize("added", [("t", 0), ("t", 1)], ids=["its-partition", "another"])
@pytest.mark.parametrize("commit", [True, False])
async def test_a_transaction_ended_by_another_process_is_started_again_in_one_statement(
    client: httpx.AsyncClient,
    paths: list[str],
    other_process: Store,
    added: tuple[str, int],
    commit: bool,
) -> None:
    """Kafka's clients of transaction version 1 (librdkafka's) keep their epoch across an end,
    and send EndTxn and AddPartitions to the coordinator's connection, which may be another
    process than the one their Produce reaches. This process still sees the transaction open on
    the partition; the rows show it ended and the next one begun. The batch starts that one
    there, joining it to the partition if the AddPartitions named another."""
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "tx")
    assert (await producer.produce("t", 0, "a")).status_code == 200
    assert (await producer.produce("t", 0, "b")).status_code == 200  # this process sees it open
    caller = Caller(producer.pid, producer.epoch)
    await transactions.end(other_process, "tx", caller, commit=True, version=1)  # marker at 2
    await transactions.add_partitions(other_process, "tx", caller, [added])
    paths.clear()

    assert (await producer.produce("t", 0, "c")).json()["base_offset"] == 3
    assert (await producer.produce("t", 0, "d")).json()["base_offset"] == 4

    assert paths == ["one statement", "one statement"]
    described = await producer.describe()
    assert described["state"] == "Ongoing"
    assert {(p["topic"], p["partition"]) for p in described["partitions"]} == {added, ("t", 0)}
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 3  # pinned at c
    await transactions.end(other_process, "tx", caller, commit=commit, version=1)
    committed = await read_all(client, "t", isolation_level="read_committed")
    assert [r["value"] for r in committed] == (["a", "b", "c", "d"] if commit else ["a", "b"])
    state = await partition_state(client, "t", 0)
    assert state["last_stable_offset"] == state["high_watermark"] == 6


async def test_a_transaction_ended_elsewhere_and_not_begun_again_takes_the_locks(
    client: httpx.AsyncClient, paths: list[str], other_process: Store
) -> None:
    """The same, with no AddPartitions since the end: the transaction is not Ongoing, so the
    statement does not start it; the locking path does, as for any batch that joins."""
    await create_topic(client, "t")
    producer = await started(client, "tx")
    assert (await producer.produce("t", 0, "a")).status_code == 200
    assert (await producer.produce("t", 0, "b")).status_code == 200
    caller = Caller(producer.pid, producer.epoch)
    await transactions.end(other_process, "tx", caller, commit=False, version=1)
    paths.clear()

    assert (await producer.produce("t", 0, "c")).json()["base_offset"] == 3

    assert paths == ["locks"]
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 3
    await transactions.end(other_process, "tx", caller, commit=True, version=1)
    committed = await read_all(client, "t", isolation_level="read_committed")
    assert [r["value"] for r in committed] == ["c"]
