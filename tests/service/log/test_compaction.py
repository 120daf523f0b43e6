"""The HTTP API's compaction (`cleanup.policy=compact`, Topic configs): the newest record of every
key below the LSO stays with its offset unchanged; aborted records, old tombstones and markers no
record refers to go; `min.compaction.lag.ms` protects young records; keyless records are refused.

A hypothesis test drives random produce / commit / abort / tombstone / compact steps against a
model. Rounds are driven with `clean_once` and a chosen clock. Run on SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from coordinator.app import create_app
from coordinator.core.clock import now_ms
from coordinator.core.settings import Settings
from coordinator.log.cleaner import clean_once
from coordinator.log.models import Batch
from sdk import recordbatch
from tests.support.api import assert_problem, produce, produce_batch, read_all
from tests.support.services import Backend, empty_tables, make_settings
from tests.support.txn import Instance

DAY = 86_400_000


async def compacted_topic(client: httpx.AsyncClient, name: str = "t", **configs: str) -> None:
    body = {"name": name, "partitions": 1, "configs": {"cleanup.policy": "compact", **configs}}
    response = await client.post("/v1/topics", json=body)
    assert response.status_code == 201, response.text


async def put(client: httpx.AsyncClient, *pairs: tuple[str, str | None]) -> list[int]:
    """Plain appends of (key, value) records in one batch; their offsets."""
    body = {"records": [{"key": k, "value": v} for k, v in pairs]}
    response = await produce(client, "t", 0, body)
    assert response.status_code == 200, response.text
    first, last = response.json()["base_offset"], response.json()["last_offset"]
    return list(range(first, last + 1))


async def view(client: httpx.AsyncClient, isolation: str = "read_committed") -> list[Any]:
    start = (await client.get("/v1/topics/t")).json()["partitions"][0]["log_start_offset"]
    records: list[dict[str, Any]] = []
    offset = start
    while True:
        page = (
            await client.get(
                "/v1/topics/t/partitions/0/records",
                params={"offset": offset, "max_records": 10_000, "isolation_level": isolation},
            )
        ).json()
        records.extend(page["records"])
        if page["next_offset"] == offset:
            return [(r["offset"], r["key"], r["value"]) for r in records]
        offset = page["next_offset"]


async def stored_rows(app: Any) -> list[tuple[int, int | None]]:
    async with app.state.db.read() as session:
        rows = await session.execute(
            select(Batch.base_offset, Batch.control)
            .where(Batch.topic == "t")
            .order_by("base_offset")
        )
        return [(b, c) for b, c in rows]


async def test_the_newest_record_of_each_key_stays_at_its_offset(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client)
    await put(client, ("a", "1"), ("b", "1"), ("a", "2"))  # 0-2: one batch, partly superseded
    await put(client, ("c", "1"))  # 3: superseded whole
    await put(client, ("c", "2"), ("b", "2"))  # 4-5
    done = await clean_once(app.state.db, app.state.settings)
    assert await view(client) == [(2, "a", "2"), (4, "c", "2"), (5, "b", "2")]
    assert done.compaction.batches == 1  # the batch at 3; the one at 0 was rebuilt
    assert done.compaction.bytes > 0
    # Binary readers get the rebuilt batch, well formed, offsets as they were.
    body = (
        await client.get(
            "/v1/topics/t/partitions/0/records",
            params={"offset": 0},
            headers={"accept": "application/vnd.kafka.record-batch"},
        )
    ).content
    offsets = [
        r.offset
        for pos, header in recordbatch.iter_batches(body, verify=True)
        for r in recordbatch.records(body, pos, header)
    ]
    assert offsets == [2, 4, 5]
    # Reading from inside a gap starts at the next record kept.
    page = (await client.get("/v1/topics/t/partitions/0/records", params={"offset": 3})).json()
    assert [r["offset"] for r in page["records"]] == [4, 5]
    # A second round with nothing new does nothing.
    again = await clean_once(app.state.db, app.state.settings)
    assert (again.compaction.batches, again.compaction.bytes) == (0, 0)


async def test_compressed_batches_are_rebuilt_with_their_codec(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client)
    data = recordbatch.build(
        [(1, b"k", b"old", ()), (2, b"j", b"x", ()), (3, b"k", b"new", ())],
        compression=recordbatch.COMPRESSION_ZSTD,
    )
    assert (await produce_batch(client, "t", 0, data)).status_code == 200
    await clean_once(app.state.db, app.state.settings)
    async with app.state.db.read() as session:
        payload = await session.scalar(select(Batch.payload).where(Batch.topic == "t"))
    [(_, header)] = list(recordbatch.iter_batches(payload, verify=True))
    assert header.compression == recordbatch.COMPRESSION_ZSTD
    assert (header.record_count, header.last_offset_delta) == (2, 2)
    assert await view(client) == [(1, "j", "x"), (2, "k", "new")]


async def test_aborted_records_and_their_markers_go_and_commit_markers_stay_while_needed(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client)
    producer = Instance(client, "tx")
    await producer.init()
    await keyed(producer, ("z", "aborted"))
    assert (await producer.end(commit=False)).status_code == 200  # 0 aborted, 1 marker
    await put(client, ("a", "1"))  # 2
    rows_before = await stored_rows(app)
    assert rows_before == [(0, None), (1, 0), (2, None)]
    await clean_once(app.state.db, app.state.settings)
    assert await stored_rows(app) == [(2, None)]
    assert await view(client, "read_uncommitted") == [(2, "a", "1")]


async def test_a_commit_marker_goes_once_no_record_of_its_transaction_is_left(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client)
    producer = Instance(client, "tx")
    await producer.init()
    await keyed(producer, ("a", "1"))  # 0
    assert (await producer.end(commit=True)).status_code == 200  # 1: commit marker
    await clean_once(app.state.db, app.state.settings)
    assert await stored_rows(app) == [(0, None), (1, 1)]  # the marker's record is still there
    await put(client, ("a", "2"))  # 2 supersedes 0
    await clean_once(app.state.db, app.state.settings)
    assert await stored_rows(app) == [(2, None)]
    assert await view(client) == [(2, "a", "2")]


async def test_an_open_transaction_and_everything_after_it_is_left_alone(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client)
    await put(client, ("a", "1"))  # 0
    producer = Instance(client, "tx")
    await producer.init()
    await keyed(producer, ("a", "2"))  # 1, open
    await put(client, ("a", "3"))  # 2, above the LSO
    await clean_once(app.state.db, app.state.settings)
    assert [o for o, _ in await stored_rows(app)] == [0, 1, 2]
    assert (await producer.end(commit=False)).status_code == 200  # 3
    await clean_once(app.state.db, app.state.settings)
    assert await view(client) == [(2, "a", "3")]


async def test_tombstones_stay_for_delete_retention_ms_then_go(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client, **{"delete.retention.ms": "60000"})
    await put(client, ("a", "1"), ("b", "1"))
    await put(client, ("a", None))  # 2: tombstone
    await clean_once(app.state.db, app.state.settings)
    assert await view(client) == [(1, "b", "1"), (2, "a", None)]
    await clean_once(app.state.db, app.state.settings, now=now_ms() + 61_000)
    assert await view(client) == [(1, "b", "1")]


async def test_min_compaction_lag_protects_young_records(
    client: httpx.AsyncClient, app: Any
) -> None:
    await compacted_topic(client, **{"min.compaction.lag.ms": "60000"})
    await put(client, ("a", "1"))
    await put(client, ("a", "2"))
    await clean_once(app.state.db, app.state.settings)
    assert [o for o, _, _ in await view(client)] == [0, 1]
    await clean_once(app.state.db, app.state.settings, now=now_ms() + 61_000)
    assert await view(client) == [(1, "a", "2")]


async def test_compact_and_delete_applies_both(client: httpx.AsyncClient, app: Any) -> None:
    await compacted_topic(client, **{"cleanup.policy": "compact,delete", "retention.ms": "60000"})
    await put(client, ("a", "1"), ("a", "2"))
    await put(client, ("b", "1"))
    await clean_once(app.state.db, app.state.settings)
    assert await view(client) == [(1, "a", "2"), (2, "b", "1")]
    await clean_once(app.state.db, app.state.settings, now=now_ms() + 61_000)
    state = (await client.get("/v1/topics/t")).json()["partitions"][0]
    assert state["log_start_offset"] == state["high_watermark"] == 3


async def test_keyless_records_are_refused_on_a_compacted_topic(
    client: httpx.AsyncClient,
) -> None:
    await compacted_topic(client)
    body = {"records": [{"key": "a", "value": "1"}, {"value": "no key"}]}
    assert_problem(await produce(client, "t", 0, body), 400, "INVALID_RECORD")
    assert await read_all(client, "t") == []


async def keyed(producer: Instance, *pairs: tuple[str, str | None]) -> None:
    sequence = producer.sequences.get(("t", 0), 0)
    response = await producer.client.post(
        "/v1/topics/t/partitions/0/records",
        json={
            **producer.caller(),
            "base_sequence": sequence,
            "transactional_id": producer.tid,
            "records": [{"key": k, "value": v} for k, v in pairs],
        },
    )
    assert response.status_code == 200, response.text
    producer.sequences[("t", 0)] = sequence + len(pairs)


# -- the model ----------------------------------------------------------------------------------

KEYS = ["a", "b", "c"]
_pair = st.tuples(st.sampled_from(KEYS), st.none() | st.sampled_from(["x", "y", "z"]))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(_pair, min_size=1, max_size=3)),
        st.tuples(st.just("txn"), st.lists(_pair, min_size=1, max_size=3)),
        st.tuples(st.just("end"), st.booleans()),
        st.tuples(st.just("compact"), st.booleans()),
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_compaction_keeps_the_newest_value_of_every_key_against_a_model(
    store: Backend, steps: list[tuple[str, Any]]
) -> None:
    """After every compaction, the read_committed view maps every key to the model's newest
    value (a key whose newest record is a tombstone shows it or nothing), and every record that
    survives has the key, value and offset it was written with."""
    asyncio.run(play(make_settings(store), steps))


async def play(app_settings: Settings, steps: list[tuple[str, Any]]) -> None:
    application = create_app(app_settings)
    await empty_tables(application.state.db)
    transport = httpx.ASGITransport(app=application)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            await compacted_topic(client, **{"delete.retention.ms": "1000"})
            producer = Instance(client, "tx")
            await producer.init()
            written: dict[int, tuple[str, str | None]] = {}
            # key -> (offset, value) of its newest committed record, by offset as in the log
            committed: dict[str, tuple[int, str | None]] = {}

            def commit(offset: int, key: str, value: str | None) -> None:
                if key not in committed or committed[key][0] < offset:
                    committed[key] = (offset, value)

            pending: list[tuple[int, str, str | None]] = []
            open_txn = False
            clock = now_ms()
            for step, arg in steps:
                if step == "put":
                    for offset, pair in zip(await put(client, *arg), arg, strict=True):
                        written[offset] = pair
                        commit(offset, *pair)
                elif step == "txn":
                    first = (await client.get("/v1/topics/t")).json()["partitions"][0]
                    await keyed(producer, *arg)
                    base = first["high_watermark"]
                    for i, pair in enumerate(arg):
                        written[base + i] = pair
                        pending.append((base + i, *pair))
                    open_txn = True
                elif step == "end" and open_txn:
                    response = await producer.end(commit=arg)
                    assert response.status_code == 200, response.text
                    if arg:
                        for offset, key, value in pending:
                            commit(offset, key, value)
                    pending.clear()
                    open_txn = False
                elif step == "compact":
                    if arg:
                        clock += 2000  # past delete.retention.ms: tombstones may go
                    await clean_once(application.state.db, application.state.settings, now=clock)
                    if not open_txn:  # else the LSO hides the model's newest plain records
                        await check(client, written, committed)
            if open_txn:
                assert (await producer.end(commit=True)).status_code == 200
                for offset, key, value in pending:
                    commit(offset, key, value)
            await clean_once(application.state.db, application.state.settings, now=clock)
            await check(client, written, committed)
    finally:
        await application.state.db.dispose()


async def check(
    client: httpx.AsyncClient,
    written: dict[int, tuple[str, str | None]],
    committed: dict[str, tuple[int, str | None]],
) -> None:
    seen = await view(client)
    for offset, key, value in seen:
        assert written[offset] == (key, value), (offset, key, value)
    newest: dict[str, str | None] = {}
    for _, key, value in seen:
        newest[key] = value
    for key, (_, value) in committed.items():
        if value is None:
            assert newest.get(key) is None, (key, newest)
        else:
            assert newest.get(key) == value, (key, newest, committed)
    assert set(newest) <= set(committed)
