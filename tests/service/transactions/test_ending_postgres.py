"""EndTxn in one statement on Postgres (coordinator.transactions.ending): the end of a transaction
as its producer says it is goes in one round trip and leaves what the locking path leaves; a
transaction whose rows changed while the statement waited for their locks (offsets added, a
partition appended to) is ended by the locking path, which reads after the locks, so nothing
added meanwhile is missed. Retries, fencing and the other refusals are the locking path's and
run on both stores in test_transactions.

Postgres only: SQLite always takes the locking path.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from coordinator.store.postgres import PostgresStore
from coordinator.transactions import service
from coordinator.transactions.inputs import Caller
from coordinator.transactions.states import State
from tests.support.api import create_topic, read_all
from tests.support.locks import Blocking, waiting_for_a_lock
from tests.support.services import Backend
from tests.support.txn import included, partition_state, started


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def one_statement_ends(monkeypatch: pytest.MonkeyPatch) -> list[State | None]:
    """What each end's one statement returned: its state, or None for the locking path."""
    seen: list[State | None] = []
    real = service.end_in_one_statement

    async def spy(*args: Any, **kwargs: Any) -> State | None:
        state = await real(*args, **kwargs)
        seen.append(state)
        return state

    monkeypatch.setattr(service, "end_in_one_statement", spy)
    return seen


async def committed(client: httpx.AsyncClient, partition: int) -> list[str]:
    return [r["value"] for r in await read_all(client, "t", partition)]


async def group_offsets(client: httpx.AsyncClient) -> list[tuple[str, int, int]]:
    answer = (await client.get("/v1/groups/g/offsets")).json()["offsets"]
    return [(o["topic"], o["partition"], o["offset"]) for o in answer]


@pytest.mark.parametrize("commit", [True, False])
async def test_an_end_goes_in_one_statement_and_leaves_what_the_locking_path_leaves(
    client: httpx.AsyncClient, one_statement_ends: list[State | None], commit: bool
) -> None:
    await create_topic(client, "t", partitions=3)
    producer = await started(client, "a")
    await producer.produce("t", 0, "a", "b")
    await producer.produce("t", 1, "c")
    await producer.add(("t", 2))  # joined, nothing written there
    await producer.offsets("g", ("t", 0, 2), ("t", 1, 1))
    epoch = producer.epoch

    answer = await producer.end(commit=commit)

    wanted = State.COMPLETE_COMMIT if commit else State.COMPLETE_ABORT
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "state": str(wanted),
        "producer_id": producer.pid,
        "producer_epoch": epoch + 1,
    }
    assert one_statement_ends == [wanted]
    described = await producer.describe()
    assert (described["state"], described["producer_epoch"]) == (str(wanted), epoch + 1)
    assert described["partitions"] == []
    # A marker on every partition, each at its high watermark; the LSO released everywhere.
    for partition, written in ((0, 2), (1, 1), (2, 0)):
        state = await partition_state(client, "t", partition)
        assert state["high_watermark"] == state["last_stable_offset"] == written + 1
    assert await committed(client, 0) == (["a", "b"] if commit else [])
    assert await committed(client, 1) == (["c"] if commit else [])
    assert await group_offsets(client) == ([("t", 0, 2), ("t", 1, 1)] if commit else [])
    # The next transaction runs at the raised epoch, and its end goes in one statement too.
    assert (await producer.produce("t", 0, "d")).status_code == 200
    assert (await producer.end(commit=True)).status_code == 200
    assert one_statement_ends == [wanted, State.COMPLETE_COMMIT]
    assert (await committed(client, 0))[-1:] == ["d"]


@pytest.mark.parametrize("commit", [True, False])
async def test_an_end_of_transaction_version_1_goes_in_one_statement_and_keeps_the_epoch(
    app: Any,
    client: httpx.AsyncClient,
    one_statement_ends: list[State | None],
    paths: list[str],
    commit: bool,
) -> None:
    """Kafka's EndTxn before version 5 (librdkafka's, and every client of transaction version
    1): the same end, with the producer's epoch left as it was for its next transaction."""
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    await producer.produce("t", 0, "a")
    await producer.add(("t", 1))
    await producer.offsets("g", ("t", 0, 1))
    epoch = producer.epoch
    request = (Caller(producer.pid, epoch), commit)

    answer = await service.end(app.state.db, "a", *request, version=1)

    wanted = State.COMPLETE_COMMIT if commit else State.COMPLETE_ABORT
    assert (answer.state, answer.producer_id) == (wanted, producer.pid)
    assert answer.producer_epoch == epoch
    assert one_statement_ends == [wanted]
    described = await producer.describe()
    assert (described["state"], described["producer_epoch"]) == (str(wanted), epoch)
    assert described["partitions"] == []
    for partition, written in ((0, 1), (1, 0)):
        state = await partition_state(client, "t", partition)
        assert state["high_watermark"] == state["last_stable_offset"] == written + 1
    assert await committed(client, 0) == (["a"] if commit else [])
    assert await group_offsets(client) == ([("t", 0, 1)] if commit else [])
    # Its retry finds the transaction ended: the locking path answers it, as the same end.
    again = await service.end(app.state.db, "a", *request, version=1)
    assert (again.state, again.producer_epoch) == (wanted, epoch)
    assert one_statement_ends == [wanted, None]
    # The next transaction runs at the same epoch. The process saw its end, so the first batch
    # of the next one joins it in one statement, as after an end that raised the epoch; and its
    # end goes in one statement too.
    paths.clear()
    assert (await producer.produce("t", 0, "b")).status_code == 200
    assert (await producer.produce("t", 0, "c")).status_code == 200
    assert paths == ["one statement", "one statement"]
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 2  # pinned at b
    assert (await service.end(app.state.db, "a", *request, version=1)).state == wanted
    assert one_statement_ends == [wanted, None, wanted]
    committed_now = await committed(client, 0)
    assert committed_now == (["a", "b", "c"] if commit else [])


async def test_a_batch_planned_before_a_version_1_end_is_not_written_as_if_it_joined(
    app: Any,
    client: httpx.AsyncClient,
    paths: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of the same producer and epoch racing the end (a zombie of transaction version
    1): planned while the process saw the transaction open, so not to join; the end commits
    before its statement runs. Its statement must not take the end's news for its own plan: it
    finds the rows changed and the locking path starts a new transaction with it."""
    await create_topic(client, "t")
    producer = await started(client, "a")
    assert (await producer.produce("t", 0, "a")).status_code == 200
    assert (await producer.produce("t", 0, "b")).status_code == 200  # the process saw it open
    request = (Caller(producer.pid, producer.epoch), True)
    written = PostgresStore.write_appends_if_unchanged
    ended: list[State] = []

    async def end_first(*args: Any, **kwargs: Any) -> Any:
        if not ended:
            ended.append((await service.end(app.state.db, "a", *request, version=1)).state)
        return await written(*args, **kwargs)

    monkeypatch.setattr(PostgresStore, "write_appends_if_unchanged", end_first)
    paths.clear()

    assert (await producer.produce("t", 0, "c")).status_code == 200

    assert ended == [State.COMPLETE_COMMIT]
    assert paths == ["locks"]
    state, partitions = await included(producer)
    assert (state, partitions) == ("Ongoing", [("t", 0)])
    assert await committed(client, 0) == ["a", "b"]  # c waits for its own transaction's end
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 3  # pinned at c


async def test_offsets_added_while_the_end_waits_for_its_lock_are_committed_with_it(
    app: Any,
    client: httpx.AsyncClient,
    one_statement_ends: list[State | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.produce("t", 0, "a")
    # AddOffsets, held after its write and before its commit, the transaction's row locked.
    written, release = asyncio.Event(), asyncio.Event()
    hold_offsets = service.hold_offsets

    async def held(*args: Any, **kwargs: Any) -> None:
        await hold_offsets(*args, **kwargs)
        if not written.is_set():
            written.set()
            await release.wait()

    monkeypatch.setattr(service, "hold_offsets", held)
    adding = asyncio.create_task(producer.offsets("g", ("t", 0, 1)))
    await written.wait()
    ending = asyncio.create_task(producer.end(commit=True))
    await waiting_for_a_lock(app)
    release.set()

    assert (await adding).status_code == 200
    assert (await ending).json()["state"] == "CompleteCommit"
    assert one_statement_ends == [None]  # its rows changed while it waited: the locking path
    assert await group_offsets(client) == [("t", 0, 1)]
    assert await committed(client, 0) == ["a"]


async def test_a_partition_changed_while_the_end_waits_for_its_lock_is_ended_by_the_locks(
    app: Any, client: httpx.AsyncClient, one_statement_ends: list[State | None]
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.produce("t", 0, "a")
    blocked = Blocking(app, "UPDATE partitions SET clean_again_at = clean_again_at")
    async with blocked as done:
        ending = asyncio.create_task(producer.end(commit=False))
        await waiting_for_a_lock(app)
        done()
    assert (await ending).json()["state"] == "CompleteAbort"
    assert one_statement_ends == [None]
    state = await partition_state(client, "t", 0)
    assert state["high_watermark"] == state["last_stable_offset"] == 2
    assert await committed(client, 0) == []
