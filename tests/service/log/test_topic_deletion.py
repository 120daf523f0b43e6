"""The HTTP API's delete-records and topic deletion (Topics): the log start moves up and never down,
fetches below it are 416 in both formats, and a deleted topic takes its records, producer state
and group offsets with it, aborting (and fencing) open transactions that include it.

Run on SQLite and on Postgres.
"""

from __future__ import annotations

import httpx

from coordinator.log.schemas import MAX_PARTITIONS
from tests.support.api import (
    assert_problem,
    batch,
    create_topic,
    fetch,
    init_pid,
    produce,
    read_all,
)
from tests.support.txn import partition_state, started

RECORD_BATCH = "application/vnd.kafka.record-batch"


async def fill(client: httpx.AsyncClient, topic: str, partition: int, *batches: int) -> None:
    """Append batches of the given sizes (values "p<partition>-<n>")."""
    n = 0
    for size in batches:
        values = [f"p{partition}-{n + i}" for i in range(size)]
        response = await produce(client, topic, partition, batch(values))
        assert response.status_code == 200, response.text
        n += size


async def delete_records(
    client: httpx.AsyncClient, topic: str, *offsets: tuple[int, int]
) -> httpx.Response:
    body = {"partitions": [{"partition": p, "offset": o} for p, o in offsets]}
    return await client.post(f"/v1/topics/{topic}/delete-records", json=body)


async def test_delete_records_moves_the_log_start_and_removes_whole_batches_below_it(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    await fill(client, "t", 0, 3, 3, 3)  # batches at 0-2, 3-5, 6-8
    await fill(client, "t", 1, 2)
    response = await delete_records(client, "t", (0, 4))
    assert response.status_code == 200, response.text
    assert response.json() == {"partitions": [{"partition": 0, "log_start_offset": 4}]}
    assert (await partition_state(client, "t", 0))["log_start_offset"] == 4
    assert (await partition_state(client, "t", 1))["log_start_offset"] == 0
    # Offset 4 sits inside the batch 3-5: that batch stays, the reader starts at 4.
    records = (await fetch(client, "t", 0, offset=4))["records"]
    assert [(r["offset"], r["value"]) for r in records] == [(o, f"p0-{o}") for o in range(4, 9)]
    binary = await client.get(
        "/v1/topics/t/partitions/0/records", params={"offset": 4}, headers={"accept": RECORD_BATCH}
    )
    assert binary.status_code == 200
    assert binary.headers["Log-Start-Offset"] == "4"
    # Below the log start: 416 in both formats.
    assert_problem(
        await client.get("/v1/topics/t/partitions/0/records", params={"offset": 3}),
        416,
        "OFFSET_OUT_OF_RANGE",
    )
    assert_problem(
        await client.get(
            "/v1/topics/t/partitions/0/records",
            params={"offset": 0},
            headers={"accept": RECORD_BATCH},
        ),
        416,
        "OFFSET_OUT_OF_RANGE",
    )
    assert [r["value"] for r in await read_all(client, "t", 1)] == ["p1-0", "p1-1"]


async def test_offset_minus_one_means_the_high_watermark_and_the_start_never_moves_down(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", 0, 2, 2)
    response = await delete_records(client, "t", (0, -1))
    assert response.json() == {"partitions": [{"partition": 0, "log_start_offset": 4}]}
    assert (await fetch(client, "t", 0, offset=4))["records"] == []
    again = await delete_records(client, "t", (0, 1))
    assert again.status_code == 200, again.text
    assert again.json() == {"partitions": [{"partition": 0, "log_start_offset": 4}]}
    # The log goes on from the high watermark.
    await fill(client, "t", 0, 1)
    records = (await fetch(client, "t", 0, offset=4))["records"]
    assert [r["offset"] for r in records] == [4]


async def test_bad_delete_records_change_nothing(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    await fill(client, "t", 0, 2)
    await fill(client, "t", 1, 2)
    # One partition above its high watermark: 416, and the other is not moved either.
    assert_problem(await delete_records(client, "t", (1, 1), (0, 3)), 416, "OFFSET_OUT_OF_RANGE")
    assert_problem(await delete_records(client, "t", (0, 1), (0, 1)), 422, "INVALID_REQUEST")
    assert_problem(await delete_records(client, "t", (2, 0)), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(await delete_records(client, "nope", (0, 0)), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    for body in ({"partitions": []}, {"partitions": [{"partition": 0, "offset": -2}]}, {}):
        response = await client.post("/v1/topics/t/delete-records", json=body)
        assert response.status_code in (400, 422), response.text
    for p in (0, 1):
        assert (await partition_state(client, "t", p))["log_start_offset"] == 0
        assert len(await read_all(client, "t", p)) == 2


async def test_deleting_a_topic_removes_its_records_state_and_group_offsets(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    await create_topic(client, "kept")
    pid = await init_pid(client)
    response = await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))
    assert response.status_code == 200, response.text
    await fill(client, "kept", 0, 1)
    offsets = [
        {"topic": "t", "partition": 0, "offset": 2},
        {"topic": "kept", "partition": 0, "offset": 1},
    ]
    committed = await client.post("/v1/groups/g/offsets", json={"offsets": offsets})
    assert committed.status_code == 200, committed.text

    deleted = await client.delete("/v1/topics/t")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"name": "t"}
    assert_problem(await client.get("/v1/topics/t"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(await client.delete("/v1/topics/t"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert [t["name"] for t in (await client.get("/v1/topics")).json()["topics"]] == ["kept"]
    group = (await client.get("/v1/groups/g/offsets")).json()
    assert [(o["topic"], o["offset"]) for o in group["offsets"]] == [("kept", 1)]
    # A topic of the same name starts empty, and the producer's state there is gone: its next
    # batch must start a new sequence.
    await create_topic(client, "t", partitions=2)
    assert await read_all(client, "t", 0) == []
    assert_problem(
        await produce(client, "t", 0, batch(["c"], pid, 0, 2)), 409, "UNKNOWN_PRODUCER_ID"
    )
    again = await produce(client, "t", 0, batch(["c"], pid, 0, 0))
    assert again.json()["base_offset"] == 0


async def test_deleting_a_topic_aborts_the_open_transactions_including_it_and_fences_them(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await create_topic(client, "other")
    writer = await started(client, "w")
    assert (await writer.produce("t", 0, "gone")).status_code == 200
    assert (await writer.produce("other", 0, "never-committed")).status_code == 200
    bystander = await started(client, "b")
    assert (await bystander.produce("other", 0, "committed")).status_code == 200

    assert (await client.delete("/v1/topics/t")).status_code == 200
    described = await writer.describe()
    assert described["state"] == "CompleteAbort"
    assert described["producer_epoch"] == writer.epoch + 1
    assert_problem(await writer.end(commit=True), 409, "PRODUCER_FENCED")
    assert (await bystander.end(commit=True)).status_code == 200
    # The aborted transaction's records elsewhere are never read as committed.
    assert [r["value"] for r in await read_all(client, "other", 0)] == ["committed"]
    state = await partition_state(client, "other", 0)
    assert state["last_stable_offset"] == state["high_watermark"]


async def test_the_largest_topic_a_transaction_spans_is_deleted_whole(
    client: httpx.AsyncClient,
) -> None:
    # Every partition a topic may have, all in one transaction: the deletion locks and aborts
    # them in one step (a row-value IN list this long once overflowed Postgres's stack: a 500).
    await create_topic(client, "wide", partitions=MAX_PARTITIONS)
    producer = await started(client, "p")
    added = await producer.add(*(("wide", p) for p in range(MAX_PARTITIONS)))
    assert added.status_code == 200, added.text
    deleted = await client.delete("/v1/topics/wide")
    assert deleted.status_code == 200, deleted.text
    assert (await producer.describe())["partitions"] == []
    assert_problem(await client.get("/v1/topics/wide"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
