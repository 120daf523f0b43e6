"""Each rule of the HTTP API's Transactions section, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from coordinator.core.clock import now_ms
from coordinator.producers.models import ProducerId
from coordinator.transactions import aborts, finishing, service
from tests.support.api import assert_problem, create_topic, read_all
from tests.support.txn import Instance, partition_state, started

DAY_MS = 86_400_000


def values(records: list[dict[str, Any]]) -> list[str]:
    return [r["value"] for r in records]


async def committed_values(client: httpx.AsyncClient, topic: str, partition: int = 0) -> list[str]:
    return values(await read_all(client, topic, partition))


async def all_values(client: httpx.AsyncClient, topic: str, partition: int = 0) -> list[str]:
    return values(await read_all(client, topic, partition, isolation_level="read_uncommitted"))


# -- InitPid ------------------------------------------------------------------------------------


async def test_new_transactional_id_gets_fresh_producer_id_at_epoch_zero(
    client: httpx.AsyncClient,
) -> None:
    first = await started(client, "a")
    second = await started(client, "b")
    assert first.epoch == 0 and second.epoch == 0
    assert first.pid != second.pid
    described = await first.describe()
    assert described["state"] == "Empty"
    assert described["producer_id"] == first.pid and described["producer_epoch"] == 0
    assert described["started_at"] is None and described["partitions"] == []


async def test_known_transactional_id_keeps_producer_id_and_raises_epoch_by_one(
    client: httpx.AsyncClient,
) -> None:
    first = await started(client, "a")
    second = await started(client, "a")
    third = await started(client, "a")
    assert (second.pid, second.epoch) == (first.pid, 1)
    assert (third.pid, third.epoch) == (first.pid, 2)


async def test_init_pid_aborts_open_transaction_of_older_epoch(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    zombie = await started(client, "a")
    await zombie.add(("t", 0), ("t", 1))
    await zombie.produce("t", 0, "z1", "z2")
    await zombie.produce("t", 1, "z3")
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 0

    fresh = await started(client, "a")

    # Abort markers on both partitions (one offset each), LSO released, records hidden.
    for partition, written in ((0, 2), (1, 1)):
        state = await partition_state(client, "t", partition)
        assert state["high_watermark"] == written + 1
        assert state["last_stable_offset"] == written + 1
    assert await committed_values(client, "t", 0) == []
    assert await committed_values(client, "t", 1) == []
    assert (await fresh.describe())["state"] == "Empty"


async def test_older_epoch_is_fenced_after_init_pid(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    zombie = await started(client, "a")
    await zombie.add(("t", 0))
    await zombie.produce("t", 0, "before")
    await started(client, "a")
    assert_problem(await zombie.produce("t", 0, "late"), 409, "PRODUCER_FENCED")
    assert_problem(await zombie.add(("t", 0)), 409, "PRODUCER_FENCED")
    assert_problem(await zombie.offsets("g", ("t", 0, 1)), 409, "PRODUCER_FENCED")
    assert_problem(await zombie.prepare(), 409, "PRODUCER_FENCED")
    assert_problem(await zombie.end(commit=True), 409, "PRODUCER_FENCED")
    assert "late" not in await all_values(client, "t")
    assert await committed_values(client, "t") == []


async def test_keep_prepared_hands_prepared_transaction_to_new_epoch(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    old = await started(client, "a")
    await old.add(("t", 0))
    await old.produce("t", 0, "kept")
    assert (await old.prepare()).json() == {"state": "Prepared"}

    new = Instance(client, "a")
    await new.init(keep_prepared=True)
    assert new.epoch == old.epoch + 1
    assert (await new.describe())["state"] == "Prepared"
    assert_problem(await old.end(commit=True), 409, "PRODUCER_FENCED")
    answer = await new.end(commit=True)
    assert answer.json()["state"] == "CompleteCommit"
    assert await committed_values(client, "t") == ["kept"]


async def test_without_keep_prepared_init_pid_aborts_prepared_transaction(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    old = await started(client, "a")
    await old.add(("t", 0))
    await old.produce("t", 0, "dropped")
    await old.prepare()
    new = await started(client, "a")
    assert (await new.describe())["state"] == "Empty"
    assert_problem(await new.end(commit=True), 409, "INVALID_TXN_STATE")
    assert await committed_values(client, "t") == []


async def exhaust_epochs(app: Any, producer_id: int) -> None:
    async with app.state.db.write() as session:
        await session.execute(
            update(ProducerId)
            .where(ProducerId.producer_id == producer_id)
            .values(producer_epoch=32766)
        )


async def test_init_pid_past_epoch_32766_issues_new_producer_id(
    client: httpx.AsyncClient, app: Any
) -> None:
    old = await started(client, "a")
    await exhaust_epochs(app, old.pid)
    old.epoch = 32766
    new = await started(client, "a")
    assert new.pid != old.pid and new.epoch == 0
    assert (await new.describe())["producer_id"] == new.pid
    # The replaced producer id is fenced, not mistaken for a stranger's.
    assert_problem(await old.add(("t", 0)), 409, "PRODUCER_FENCED")


async def test_end_txn_past_epoch_32766_issues_new_producer_id(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await exhaust_epochs(app, producer.pid)
    producer.epoch = 32766
    old_pid = producer.pid
    await producer.add(("t", 0))
    await producer.produce("t", 0, "last of the old id")
    answer = await producer.end(commit=True)
    assert answer.status_code == 200, answer.text
    assert producer.pid != old_pid and producer.epoch == 0
    await producer.add(("t", 0))
    await producer.produce("t", 0, "first of the new id")
    await producer.end(commit=True)
    assert await committed_values(client, "t") == ["last of the old id", "first of the new id"]


async def test_transaction_timeout_above_maximum_is_invalid_transaction_timeout(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/init-pid", json={"transactional_id": "a", "transaction_timeout_ms": 900_001}
    )
    assert_problem(response, 400, "INVALID_TRANSACTION_TIMEOUT")
    assert_problem(await client.get("/v1/transactions/a"), 404, "TRANSACTIONAL_ID_NOT_FOUND")
    ok = await client.post(
        "/v1/init-pid", json={"transactional_id": "a", "transaction_timeout_ms": 900_000}
    )
    assert ok.status_code == 200


async def test_concurrent_init_pid_calls_on_one_id_each_get_a_distinct_epoch(
    client: httpx.AsyncClient,
) -> None:
    answers = await asyncio.gather(
        *(client.post("/v1/init-pid", json={"transactional_id": "a"}) for _ in range(8))
    )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    epochs = sorted(a.json()["producer_epoch"] for a in answers)
    assert epochs == list(range(8))
    assert len({a.json()["producer_id"] for a in answers}) == 1


# -- the checks every call makes, in the HTTP API's order
# ---------------------------------------------


async def test_unknown_transactional_id_is_404(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    ghost = Instance(client, "ghost", pid=1, epoch=0)
    for response in (
        await ghost.add(("t", 0)),
        await ghost.offsets("g", ("t", 0, 1)),
        await ghost.prepare(),
        await ghost.end(commit=True),
        await ghost.produce("t", 0, "x"),
        await client.get("/v1/transactions/ghost"),
    ):
        assert_problem(response, 404, "TRANSACTIONAL_ID_NOT_FOUND")


async def test_producer_id_of_another_transactional_id_is_invalid_mapping(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    a = await started(client, "a")
    b = await started(client, "b")
    impostor = Instance(client, "a", pid=b.pid, epoch=b.epoch)
    assert_problem(await impostor.add(("t", 0)), 409, "INVALID_PRODUCER_ID_MAPPING")
    await a.add(("t", 0))
    # On produce too, and a never-issued producer id is a mapping error there.
    assert_problem(await impostor.produce("t", 0, "x"), 409, "INVALID_PRODUCER_ID_MAPPING")
    never = Instance(client, "a", pid=999_999, epoch=0)
    assert_problem(await never.produce("t", 0, "x"), 409, "INVALID_PRODUCER_ID_MAPPING")
    assert await all_values(client, "t") == []


async def test_epoch_newer_than_stored_is_invalid_producer_epoch(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    ahead = Instance(client, "a", pid=producer.pid, epoch=producer.epoch + 1)
    assert_problem(await ahead.add(("t", 0)), 409, "INVALID_PRODUCER_EPOCH")
    assert_problem(await ahead.end(commit=True), 409, "INVALID_PRODUCER_EPOCH")


# -- AddPartitions, AddOffsets, Prepare ----------------------------------------------------------


async def test_add_partitions_makes_transaction_ongoing_and_twice_is_harmless(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    assert (await producer.add(("t", 1), ("t", 0))).json() == {"state": "Ongoing"}
    assert (await producer.add(("t", 0))).json() == {"state": "Ongoing"}
    described = await producer.describe()
    assert described["state"] == "Ongoing"
    assert described["partitions"] == [
        {"topic": "t", "partition": 0},
        {"topic": "t", "partition": 1},
    ]
    assert described["started_at"].endswith("Z")


async def test_adding_unknown_partition_is_404_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    response = await producer.add(("t", 0), ("t", 5))
    assert_problem(response, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    described = await producer.describe()
    assert described["state"] == "Empty" and described["partitions"] == []


async def test_offsets_become_the_groups_committed_offsets_only_if_transaction_commits(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    assert (await producer.offsets("g", ("t", 0, 7))).json() == {"state": "Ongoing"}
    assert (await producer.describe())["groups"] == ["g"]
    assert (await client.get("/v1/groups/g/offsets")).json() == {"offsets": []}
    await producer.end(commit=False)
    assert (await client.get("/v1/groups/g/offsets")).json() == {"offsets": []}

    await producer.offsets("g", ("t", 0, 9))
    await producer.end(commit=True)
    assert (await client.get("/v1/groups/g/offsets")).json() == {
        "offsets": [{"topic": "t", "partition": 0, "offset": 9, "metadata": None}]
    }


async def test_prepare_from_ongoing_or_with_nothing_open(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    # A task with no output prepares an empty transaction, and it commits without markers.
    assert (await producer.prepare()).json() == {"state": "Prepared"}
    assert (await producer.end(commit=True)).json()["state"] == "CompleteCommit"
    assert (await partition_state(client, "t", 0))["high_watermark"] == 0
    # From a complete state too.
    assert (await producer.prepare()).json() == {"state": "Prepared"}
    await producer.end(commit=False)
    await producer.add(("t", 0))
    assert (await producer.prepare()).json() == {"state": "Prepared"}


async def test_prepared_transaction_accepts_no_more_records_or_partitions(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "in")
    await producer.prepare()
    assert_problem(await producer.produce("t", 0, "late"), 409, "INVALID_TXN_STATE")
    assert_problem(await producer.add(("t", 1)), 409, "INVALID_TXN_STATE")
    assert_problem(await producer.offsets("g", ("t", 0, 1)), 409, "INVALID_TXN_STATE")
    await producer.end(commit=True)
    assert await all_values(client, "t") == ["in"]


# -- EndTxn -------------------------------------------------------------------------------------


async def test_commit_writes_a_marker_on_every_partition_and_reveals_the_records(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=3)
    producer = await started(client, "a")
    await producer.add(("t", 0), ("t", 1), ("t", 2))
    await producer.produce("t", 0, "a", "b")
    await producer.produce("t", 1, "c")
    assert await committed_values(client, "t", 0) == []
    answer = await producer.end(commit=True)
    assert answer.json()["state"] == "CompleteCommit"
    assert await committed_values(client, "t", 0) == ["a", "b"]
    assert await committed_values(client, "t", 1) == ["c"]
    # A partition that joined without records still gets its marker, which takes one offset.
    for partition, hw in ((0, 3), (1, 2), (2, 1)):
        state = await partition_state(client, "t", partition)
        assert state["high_watermark"] == hw and state["last_stable_offset"] == hw


async def test_end_txn_raises_the_epoch_and_answers_it(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    pid, epoch = producer.pid, producer.epoch
    await producer.add(("t", 0))
    answer = await producer.end(commit=False)
    assert answer.json() == {"state": "CompleteAbort", "producer_id": pid, "producer_epoch": 1}
    assert (await producer.describe())["producer_epoch"] == epoch + 1
    # The next transaction runs at the new epoch, its sequences from 0.
    await producer.add(("t", 0))
    assert (await producer.produce("t", 0, "next")).status_code == 200


async def test_end_txn_retried_with_ending_epoch_and_same_outcome_gets_same_answer(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "once")
    first = await producer.end(commit=True, adopt=False)
    retry = await producer.end(commit=True, adopt=False)
    assert retry.status_code == 200 and retry.json() == first.json()
    # The other outcome is not a retry: the old epoch is fenced.
    assert_problem(await producer.end(commit=False), 409, "PRODUCER_FENCED")
    assert await committed_values(client, "t") == ["once"]
    assert (await partition_state(client, "t", 0))["high_watermark"] == 2  # one marker


async def test_late_produce_with_epoch_of_finished_transaction_is_fenced(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "first")
    late = Instance(client, "a", pid=producer.pid, epoch=producer.epoch)
    late.sequences = dict(producer.sequences)
    await producer.end(commit=True)
    await producer.add(("t", 0))  # a later transaction is open on the same partition
    assert_problem(await late.produce("t", 0, "late"), 409, "PRODUCER_FENCED")
    await producer.produce("t", 0, "second")
    await producer.end(commit=True)
    assert await all_values(client, "t") == ["first", "second"]


async def test_end_txn_with_nothing_open_is_invalid_txn_state(client: httpx.AsyncClient) -> None:
    producer = await started(client, "a")
    assert_problem(await producer.end(commit=True), 409, "INVALID_TXN_STATE")
    await producer.offsets("g")
    await producer.end(commit=True)
    assert_problem(await producer.end(commit=True), 409, "INVALID_TXN_STATE")


async def test_commit_after_coordinator_timed_it_out_is_transaction_timed_out(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = Instance(client, "a")
    await producer.init(transaction_timeout_ms=1000)
    await producer.add(("t", 0))
    await producer.produce("t", 0, "too slow")
    # Not yet past the timeout: nothing happens.
    assert await aborts.abort_timed_out(app.state.db, now=now_ms()) == []
    assert await aborts.abort_timed_out(app.state.db, now=now_ms() + 2000) == ["a"]
    assert_problem(await producer.end(commit=True), 409, "TRANSACTION_TIMED_OUT")
    assert_problem(await producer.produce("t", 0, "more"), 409, "TRANSACTION_TIMED_OUT")
    described = await producer.describe()
    assert described["state"] == "CompleteAbort"
    assert described["producer_epoch"] == producer.epoch + 1
    assert await committed_values(client, "t") == []
    # Starting again with InitPid works.
    await producer.init()
    await producer.add(("t", 0))
    await producer.produce("t", 0, "again")
    await producer.end(commit=True)
    assert await committed_values(client, "t") == ["again"]


async def test_end_txn_is_atomic_nothing_is_written_when_it_fails_midway(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Starlette re-raises an unexpected error after answering 500 (for the server's log);
    # this client hands the 500 back instead, as a real one would see it.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
        await _end_txn_fails_midway(client, monkeypatch)


async def _end_txn_fails_midway(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    await producer.add(("t", 0), ("t", 1))
    await producer.produce("t", 0, "a")
    await producer.produce("t", 1, "b")
    await producer.offsets("g", ("t", 0, 1))

    async def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("the store failed after the markers were written")

    async def locking_path(*_: Any, **__: Any) -> None:
        return None

    # The group offsets are applied after every marker: fail there, on the path that takes the
    # locks (Postgres's one-statement end is one statement: it cannot stop midway).
    monkeypatch.setattr(service, "end_in_one_statement", locking_path)
    monkeypatch.setattr(finishing, "commit_offsets", broken)
    failed = await producer.end(commit=True, adopt=False)
    assert_problem(failed, 500, "INTERNAL_ERROR")
    monkeypatch.undo()

    for partition in (0, 1):
        state = await partition_state(client, "t", partition)
        assert state["high_watermark"] == 1 and state["last_stable_offset"] == 0
    described = await producer.describe()
    assert described["state"] == "Ongoing" and described["producer_epoch"] == producer.epoch
    assert (await client.get("/v1/groups/g/offsets")).json() == {"offsets": []}
    # And the retry completes it.
    assert (await producer.end(commit=True)).json()["state"] == "CompleteCommit"
    assert await committed_values(client, "t", 0) == ["a"]
    assert await committed_values(client, "t", 1) == ["b"]


# -- transactional produce -------------------------------------------------------------------


async def test_transactional_batch_adds_its_partition_and_starts_the_transaction(
    client: httpx.AsyncClient,
) -> None:
    # Transaction version 2 (KIP-890 part 2): no AddPartitions needed before a produce.
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    assert (await producer.produce("t", 1, "x")).status_code == 200  # from Empty
    described = await producer.describe()
    assert described["state"] == "Ongoing"
    assert described["partitions"] == [{"topic": "t", "partition": 1}]
    await producer.add(("t", 0))  # AddPartitions stays available, and joining twice is harmless
    assert (await producer.produce("t", 0, "y")).status_code == 200
    assert (await producer.produce("t", 1, "z")).status_code == 200
    assert (await producer.describe())["partitions"] == [
        {"topic": "t", "partition": 0},
        {"topic": "t", "partition": 1},
    ]
    assert (await producer.end(commit=True)).status_code == 200
    assert (await partition_state(client, "t", 1))["high_watermark"] == 3  # 2 records, 1 marker


async def test_prepared_transaction_takes_no_records_and_nothing_is_written(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    assert (await producer.produce("t", 0, "x")).status_code == 200
    assert (await producer.prepare()).status_code == 200
    for partition in (0, 1):  # joined already, or not
        assert_problem(await producer.produce("t", partition, "late"), 409, "INVALID_TXN_STATE")
    assert (await partition_state(client, "t", 1))["high_watermark"] == 0
    assert (await partition_state(client, "t", 0))["high_watermark"] == 1
    assert (await producer.describe())["partitions"] == [{"topic": "t", "partition": 0}]


async def test_non_transactional_batch_from_producer_with_open_transaction_is_refused(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "in txn")
    response = await client.post(
        "/v1/topics/t/partitions/0/records",
        json={**producer.caller(), "base_sequence": 1, "records": [{"value": "outside"}]},
    )
    assert_problem(response, 409, "INVALID_TXN_STATE")
    assert await all_values(client, "t") == ["in txn"]


async def test_transactional_batch_retry_is_deduplicated(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    first = await producer.produce("t", 0, "a", "b")
    producer.sequences[("t", 0)] = 0
    retry = await producer.produce("t", 0, "a", "b")
    assert retry.json() == {**first.json(), "duplicate": True}
    await producer.end(commit=True)
    assert await committed_values(client, "t") == ["a", "b"]


# -- read_committed -----------------------------------------------------------------------------


async def test_lso_is_first_offset_of_oldest_open_transaction(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    await client.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "p"}]})
    a = await started(client, "a")
    b = await started(client, "b")
    await a.add(("t", 0))
    await b.add(("t", 0))
    # Joining alone does not pin the LSO; the first record does.
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 1
    await a.produce("t", 0, "a1")  # offset 1
    await b.produce("t", 0, "b1")  # offset 2
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 1
    await a.end(commit=True)  # marker at 3
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 2
    await b.end(commit=False)  # marker at 4
    assert (await partition_state(client, "t", 0))["last_stable_offset"] == 5


async def test_read_committed_skips_aborted_records_and_markers_and_stops_at_lso(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "aborted-1", "aborted-2")
    await producer.end(commit=False)  # offsets 0-1, marker 2
    await producer.add(("t", 0))
    await producer.produce("t", 0, "kept")  # 3
    await producer.end(commit=True)  # marker 4
    await producer.add(("t", 0))
    await producer.produce("t", 0, "open")  # 5, still open

    page = (await client.get("/v1/topics/t/partitions/0/records", params={"offset": 0})).json()
    assert [(r["offset"], r["value"]) for r in page["records"]] == [(3, "kept")]
    assert page["last_stable_offset"] == 5 and page["high_watermark"] == 6
    assert page["next_offset"] == 5  # past the markers and the aborted batch, up to the LSO
    uncommitted = await all_values(client, "t")
    assert uncommitted == ["aborted-1", "aborted-2", "kept", "open"]


async def test_next_offset_skips_aborted_records_even_with_nothing_to_return(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "x", "y")
    await producer.end(commit=False)
    page = (await client.get("/v1/topics/t/partitions/0/records")).json()
    assert page["records"] == [] and page["next_offset"] == 3


async def test_interleaved_transactions_come_back_in_offset_order_once_lso_passes(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    a = await started(client, "a")
    b = await started(client, "b")
    await a.add(("t", 0))
    await b.add(("t", 0))
    await a.produce("t", 0, "a1")
    await b.produce("t", 0, "b1")
    await a.produce("t", 0, "a2")
    await b.end(commit=True)
    # b committed, but a (older) is open: nothing is stable yet.
    assert await committed_values(client, "t") == []
    await a.end(commit=True)
    assert await committed_values(client, "t") == ["a1", "b1", "a2"]


# -- commit-group -------------------------------------------------------------------------------


async def commit_group(
    client: httpx.AsyncClient, members: list[Instance], prefix: str | None = None
) -> httpx.Response:
    return await client.post(
        "/v1/transactions/commit-group",
        json={
            "transactions": [{"transactional_id": m.tid, **m.caller()} for m in members],
            "abort_others_with_prefix": prefix,
        },
    )


async def test_commit_group_commits_every_listed_transaction_and_raises_epochs(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    tasks = [await started(client, f"job-{i}") for i in range(2)]
    for i, task in enumerate(tasks):
        await task.add(("t", i))
        await task.produce("t", i, f"out-{i}")
        await task.prepare()
    answer = await commit_group(client, tasks)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "committed": [
            {"transactional_id": t.tid, "producer_id": t.pid, "producer_epoch": t.epoch + 1}
            for t in tasks
        ],
        "aborted": [],
    }
    assert await committed_values(client, "t", 0) == ["out-0"]
    assert await committed_values(client, "t", 1) == ["out-1"]


async def test_commit_group_is_all_or_none_and_names_the_first_offender(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    good = await started(client, "job-good")
    zombie = await started(client, "job-zombie")
    for task in (good, zombie):
        await task.add(("t", 0))
        await task.produce("t", 0, task.tid)
    await started(client, "job-zombie")  # fences the zombie
    answer = await commit_group(client, [good, zombie])
    body = assert_problem(answer, 409, "PRODUCER_FENCED")
    assert "job-zombie" in body["detail"]
    assert (await good.describe())["state"] == "Ongoing"
    assert await committed_values(client, "t") == []

    ghost = Instance(client, "job-ghost", pid=1, epoch=0)
    body = assert_problem(
        await commit_group(client, [good, ghost]), 404, "TRANSACTIONAL_ID_NOT_FOUND"
    )
    assert "job-ghost" in body["detail"]
    assert (await good.describe())["state"] == "Ongoing"


async def test_commit_group_aborts_other_open_transactions_with_the_prefix(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    winner = await started(client, "job1-p0-a1")
    loser = await started(client, "job1-p0-a0")  # a retried or speculative attempt
    bystander = await started(client, "job2-p0-a0")
    for task in (winner, loser, bystander):
        await task.add(("t", 0))
        await task.produce("t", 0, task.tid)
    await winner.prepare()
    answer = await commit_group(client, [winner], prefix="job1-")
    assert answer.json()["aborted"] == ["job1-p0-a0"]
    assert (await loser.describe())["producer_epoch"] == loser.epoch + 1
    assert_problem(await loser.end(commit=True), 409, "PRODUCER_FENCED")
    assert (await bystander.describe())["state"] == "Ongoing"
    await bystander.end(commit=True)
    assert await committed_values(client, "t") == ["job1-p0-a1", "job2-p0-a0"]


async def test_commit_group_retried_after_success_gets_the_same_answer(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    winner = await started(client, "job-a1")
    loser = await started(client, "job-a0")
    for task in (winner, loser):
        await task.add(("t", 0))
        await task.produce("t", 0, task.tid)
    first = await commit_group(client, [winner], prefix="job-")
    retry = await commit_group(client, [winner], prefix="job-")
    assert first.status_code == 200 and retry.json() == first.json()
    assert first.json()["aborted"] == ["job-a0"]
    assert await committed_values(client, "t") == ["job-a1"]


async def test_commit_group_retry_does_not_abort_transactions_opened_since(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    winner = await started(client, "job-a1")
    await winner.add(("t", 0))
    await winner.produce("t", 0, "out")
    first = await commit_group(client, [winner], prefix="job-")
    later = await started(client, "job-b0")  # opened after the commit, same prefix
    await later.add(("t", 0))
    retry = await commit_group(client, [winner], prefix="job-")
    assert retry.json() == first.json()
    assert (await later.describe())["state"] == "Ongoing"


async def test_commit_group_prefix_is_literal_not_a_pattern(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    winner = await started(client, "a%_1")
    other = await started(client, "abc")
    for task in (winner, other):
        await task.add(("t", 0))
    answer = await commit_group(client, [winner], prefix="a%_")
    assert answer.json()["aborted"] == []
    assert (await other.describe())["state"] == "Ongoing"


# -- timeouts and expiry -----------------------------------------------------------------------


async def test_prepared_survives_its_timeout_but_not_the_prepared_timeout(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = Instance(client, "a")
    await producer.init(transaction_timeout_ms=1000)
    await producer.add(("t", 0))
    await producer.produce("t", 0, "prepared")
    await producer.prepare()
    assert await aborts.abort_timed_out(app.state.db, now=now_ms() + 60_000) == []
    assert (await producer.describe())["state"] == "Prepared"
    assert await aborts.abort_timed_out(app.state.db, now=now_ms() + DAY_MS + 60_000) == ["a"]
    assert_problem(await producer.end(commit=True), 409, "TRANSACTION_TIMED_OUT")
    assert await committed_values(client, "t") == []


async def test_idle_transactional_ids_expire(client: httpx.AsyncClient, app: Any) -> None:
    await create_topic(client, "t")
    idle = await started(client, "idle")
    busy = await started(client, "busy")
    await busy.add(("t", 0))
    week = 604_800_000
    assert await aborts.expire_idle(app.state.db, week, now=now_ms() + 1000) == 0
    assert await aborts.expire_idle(app.state.db, week, now=now_ms() + week + 1000) == 1
    assert_problem(await client.get("/v1/transactions/idle"), 404, "TRANSACTIONAL_ID_NOT_FOUND")
    assert (await busy.describe())["state"] == "Ongoing"
    # The id can be used again from scratch; the old producer id is fenced out of it.
    again = await started(client, "idle")
    assert again.epoch == 0 and again.pid != idle.pid


# -- consumer group offsets ---------------------------------------------------------------------


async def test_group_offsets_commit_and_read_back(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    await create_topic(client, "u")
    body = {
        "offsets": [
            {"topic": "t", "partition": 1, "offset": 10, "metadata": "m"},
            {"topic": "t", "partition": 0, "offset": 5},
            {"topic": "u", "partition": 0, "offset": 1},
        ]
    }
    assert (await client.post("/v1/groups/g/offsets", json=body)).status_code == 200
    everything = (await client.get("/v1/groups/g/offsets")).json()["offsets"]
    assert everything == [
        {"topic": "t", "partition": 0, "offset": 5, "metadata": None},
        {"topic": "t", "partition": 1, "offset": 10, "metadata": "m"},
        {"topic": "u", "partition": 0, "offset": 1, "metadata": None},
    ]
    only_u = (await client.get("/v1/groups/g/offsets", params={"topic": "u"})).json()
    assert only_u == {"offsets": [{"topic": "u", "partition": 0, "offset": 1, "metadata": None}]}
    unknown = await client.post(
        "/v1/groups/g/offsets", json={"offsets": [{"topic": "x", "partition": 0, "offset": 1}]}
    )
    assert_problem(unknown, 404, "UNKNOWN_TOPIC_OR_PARTITION")


async def test_require_stable_refuses_while_a_transaction_holds_pending_offsets(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await create_topic(client, "u")
    producer = await started(client, "a")
    await producer.offsets("g", ("t", 0, 3))
    stable = {"require_stable": "true"}
    body = assert_problem(
        await client.get("/v1/groups/g/offsets", params=stable), 409, "UNSTABLE_OFFSET_COMMIT"
    )
    assert body["retriable"] is True
    # Another topic is not held; without require_stable the committed offsets are answered.
    assert (
        await client.get("/v1/groups/g/offsets", params={**stable, "topic": "u"})
    ).status_code == 200
    assert (await client.get("/v1/groups/g/offsets")).status_code == 200
    await producer.end(commit=True)
    assert (await client.get("/v1/groups/g/offsets", params=stable)).json()["offsets"] == [
        {"topic": "t", "partition": 0, "offset": 3, "metadata": None}
    ]


async def test_ids_may_hold_any_printable_character_even_a_slash(
    client: httpx.AsyncClient,
) -> None:
    from urllib.parse import quote

    await create_topic(client, "t")
    for tid in ("job/7/attempt 1", "x/partitions", "commit-group/2", "50%?#"):
        producer = await started(client, tid)  # paths carry it percent-encoded
        assert (await producer.add(("t", 0))).json() == {"state": "Ongoing"}
        assert (await producer.describe())["transactional_id"] == tid
        assert (await producer.end(commit=True)).json()["state"] == "CompleteCommit"
    group = quote("team/billing", safe="")
    body = {"offsets": [{"topic": "t", "partition": 0, "offset": 3}]}
    assert (await client.post(f"/v1/groups/{group}/offsets", json=body)).status_code == 200
    read = await client.get(f"/v1/groups/{group}/offsets")
    assert read.json()["offsets"][0]["offset"] == 3


async def test_timed_out_epoch_is_told_so_even_after_later_transactions(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    slow = Instance(client, "a")
    await slow.init(transaction_timeout_ms=1000)
    await slow.add(("t", 0))
    await aborts.abort_timed_out(app.state.db, now=now_ms() + 5000)
    fresh = await started(client, "a")
    await fresh.add(("t", 0))
    await fresh.end(commit=True)  # a later transaction ends after the timed-out one
    assert_problem(await slow.end(commit=True), 409, "TRANSACTION_TIMED_OUT")
    assert_problem(await slow.produce("t", 0, "late"), 409, "TRANSACTION_TIMED_OUT")
