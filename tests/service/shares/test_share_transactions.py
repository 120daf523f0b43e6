"""Share-group acknowledgements inside a transaction (docs/pages/http-api.md, Share groups), on
SQLite and on Postgres: a consume-process-produce over a queue is exactly once. The output
commits and the records become Acknowledged together; an abort (the producer's, a newer epoch
fencing it, a timeout) releases them for delivery again; while the transaction is open, nobody
else gets them, their lock does not run out, and the member cannot acknowledge them itself;
fencing is by the producer's epoch, as for offsets."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coordinator.store.postgres import PostgresStore
from coordinator.transactions import service as transactions
from coordinator.transactions.aborts import abort_timed_out
from coordinator.transactions.states import State
from tests.service.shares.test_shares import ShareMember, expire_all_locks, filled, offsets_of
from tests.support.api import assert_problem, read_all
from tests.support.txn import Instance, started


@pytest.fixture
def one_statement_ends(monkeypatch: pytest.MonkeyPatch) -> list[State | None]:
    """What each EndTxn's one statement returned (Postgres): its state, or None."""
    seen: list[State | None] = []
    real = transactions.end_in_one_statement

    async def spy(*args: Any, **kwargs: Any) -> State | None:
        state = await real(*args, **kwargs)
        seen.append(state)
        return state

    monkeypatch.setattr(transactions, "end_in_one_statement", spy)
    return seen


async def consumed(client: httpx.AsyncClient) -> tuple[ShareMember, ShareMember, Instance]:
    """Member a of share group s holds records 0-4 of t; b is in the group too; a transactional
    producer has written their output to `out` and taken a's acceptance of them."""
    await filled(client)
    response = await client.post("/v1/topics", json={"name": "out", "partitions": 1})
    assert response.status_code == 201
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    records = await a.fetch()
    producer = await started(client, "loop")
    produced = await producer.produce("out", 0, *(r["value"].upper() for r in records))
    assert produced.status_code == 200, produced.text
    held = await producer.share_acks("s", "a", *(("t", 0, r["offset"], "accept") for r in records))
    assert held.status_code == 200, held.text
    assert held.json() == {"state": "Ongoing"}
    return a, b, producer


async def share_offsets(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    offsets: list[dict[str, Any]] = (await client.get("/v1/share-groups/s")).json()["offsets"]
    return offsets


async def test_a_commit_applies_the_acknowledgements_with_the_output(
    client: httpx.AsyncClient, app: Any, one_statement_ends: list[State | None]
) -> None:
    a, b, producer = await consumed(client)
    # Held by the transaction: not the member's to acknowledge, nobody else's to get, and no
    # lock runs out under it.
    assert (
        "held by transaction 'loop'"
        in assert_problem(await a.ack("accept", 0), 409, "INVALID_RECORD_STATE")["detail"]
    )
    await expire_all_locks(app)
    assert await b.fetch() == []
    assert await share_offsets(client) == [
        {"topic": "t", "partition": 0, "start_offset": 0, "lag": 5}
    ]
    ended = await producer.end(commit=True)
    assert ended.status_code == 200, ended.text
    assert [r["value"] for r in await read_all(client, "out")] == [f"V0-{i}" for i in range(5)]
    assert await share_offsets(client) == [
        {"topic": "t", "partition": 0, "start_offset": 5, "lag": 0}
    ]
    assert await b.fetch() == [] and await a.fetch() == []
    # The transaction held share acknowledgements: its end took the locking path.
    assert one_statement_ends == [None]


async def test_an_abort_releases_the_records_for_delivery_again(client: httpx.AsyncClient) -> None:
    _, b, producer = await consumed(client)
    ended = await producer.end(commit=False)
    assert ended.status_code == 200, ended.text
    assert await read_all(client, "out") == []
    again = await b.fetch()
    assert offsets_of(again) == [0, 1, 2, 3, 4] and {r["delivery_count"] for r in again} == {2}


async def test_a_newer_epoch_fences_the_zombie_and_releases_its_records(
    client: httpx.AsyncClient,
) -> None:
    _, b, zombie = await consumed(client)
    successor = Instance(client, "loop")
    assert (await successor.init()).status_code == 200  # aborts the zombie's transaction
    assert offsets_of(await b.fetch()) == [0, 1, 2, 3, 4]
    late = await zombie.share_acks("s", "a", ("t", 0, 0, "accept"))
    assert_problem(late, 409, "PRODUCER_FENCED")
    assert_problem(await zombie.end(commit=True), 409, "PRODUCER_FENCED")
    assert await read_all(client, "out") == []


async def test_a_timed_out_transaction_releases_its_records(
    client: httpx.AsyncClient, app: Any
) -> None:
    _, b, producer = await consumed(client)
    assert await abort_timed_out(app.state.db, now=2**62) == ["loop"]
    assert offsets_of(await b.fetch()) == [0, 1, 2, 3, 4]
    assert_problem(await producer.end(commit=True), 409, "TRANSACTION_TIMED_OUT")


async def test_acknowledging_records_the_member_does_not_hold_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    await filled(client)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    await a.fetch()
    producer = await started(client, "loop")
    refused = await producer.share_acks("s", "b", ("t", 0, 0, "accept"))  # a holds 0, not b
    assert (
        "not acquired by member 'b'"
        in assert_problem(refused, 409, "INVALID_RECORD_STATE")["detail"]
    )
    assert (await producer.describe())["state"] == "Empty"  # nothing began
    not_yet = await producer.share_acks("s", "a", ("t", 0, 7, "accept"))
    assert_problem(not_yet, 409, "INVALID_RECORD_STATE")
    unknown = await producer.share_acks("nope", "a", ("t", 0, 0, "accept"))
    assert_problem(unknown, 404, "GROUP_ID_NOT_FOUND")
    assert (await a.ack("accept", 0)).status_code == 200  # still a's to acknowledge


async def test_a_transaction_without_share_acknowledgements_still_ends_in_one_statement(
    client: httpx.AsyncClient, app: Any, one_statement_ends: list[State | None]
) -> None:
    await filled(client)
    producer = await started(client, "plain")
    assert (await producer.produce("t", 0, "x")).status_code == 200
    assert (await producer.end(commit=True)).status_code == 200
    one_statement = isinstance(app.state.db, PostgresStore)
    assert one_statement_ends == ([State.COMPLETE_COMMIT] if one_statement else [None])
