"""A Kafka fetch read ahead (`log.fetch.ReadAhead`), on SQLite and on Postgres: the fetch that
asks from where the last one stopped is served by what was read meanwhile, any other reads
afresh, nothing is read past the bounds, what came after a read ahead comes in the fetch after
it, and a read ahead is held under the request memory and given back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from coordinator.core import memory
from coordinator.log import read_ahead
from coordinator.log.fetch import Fetched, PartitionAsk
from coordinator.log.read_ahead import ReadAhead
from sdk import recordbatch
from tests.support.api import batch, create_topic, produce
from tests.support.txn import started

LIMIT = 16 * 2**20


class Reads:
    """The store's fetches (each one's offsets), which may be held at a gate."""

    def __init__(self, db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offsets: list[int] = []
        self.gate: asyncio.Event | None = None  # the next read waits for it
        fetch_partitions = db.fetch_partitions

        async def counted(asks: Sequence[PartitionAsk], rules: Any) -> Any:
            self.offsets.append(asks[0].offset)
            gate, self.gate = self.gate, None
            if gate is not None:
                await gate.wait()
            return await fetch_partitions(asks, rules)

        monkeypatch.setattr(db, "fetch_partitions", counted)


@pytest.fixture
def reads(app: Any, monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(app.state.db, monkeypatch)


async def fill(client: httpx.AsyncClient, count: int) -> None:
    await create_topic(client, "t")
    for i in range(count):
        assert (await produce(client, "t", 0, batch([f"v{i}"]))).status_code == 200


async def one_batch_from(
    ahead: ReadAhead, app: Any, offset: int, *, read_committed: bool = False, min_bytes: int = 1
) -> Fetched:
    """A fetch whose budget takes one batch (the first always comes)."""
    [answer] = await ahead.fetch_partitions(
        app.state.db,
        [PartitionAsk("t", 0, offset, 1)],
        None,
        LIMIT,
        read_committed=read_committed,
        min_bytes=min_bytes,
    )
    assert isinstance(answer, Fetched)
    return answer


def values(answer: Fetched) -> list[bytes | None]:
    return [r.value for b in answer.batches for r in recordbatch.records(b)]


async def read_aheads() -> None:
    """Until the read aheads under way are done."""
    await asyncio.gather(
        *(t for t in asyncio.all_tasks() if t.get_name() == "coordinator-read-ahead")
    )


async def test_the_fetch_from_where_the_last_stopped_is_served_by_the_read_ahead(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 4)
    ahead = ReadAhead()
    answered, read = [], []
    for offset in range(4):
        answered.append(values(await one_batch_from(ahead, app, offset)))
        await read_aheads()
        read.append(list(reads.offsets))
    assert answered == [[b"v0"], [b"v1"], [b"v2"], [b"v3"]]
    # The first read afresh; each later one read once the fetch before it answered, before it
    # was asked; nothing past the high watermark.
    assert read == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3]]
    ahead.close()


async def test_a_fetch_that_asks_otherwise_reads_afresh(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 3)
    ahead = ReadAhead()
    assert values(await one_batch_from(ahead, app, 0)) == [b"v0"]
    assert values(await one_batch_from(ahead, app, 0)) == [b"v0"]  # a consumer that sought
    assert values(await one_batch_from(ahead, app, 1, read_committed=True)) == [b"v1"]
    await read_aheads()
    # Each fetch read afresh (0, 0, 1), and each read the one after it ahead (1, 1, 2).
    assert sorted(reads.offsets) == [0, 0, 1, 1, 1, 2]
    ahead.close()


async def test_nothing_is_read_ahead_past_the_lso_under_read_committed(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 1)
    producer = await started(client, "tx")
    assert (await producer.produce("t", 0, "open")).status_code == 200
    ahead = ReadAhead()
    answer = await one_batch_from(ahead, app, 0, read_committed=True)
    assert (values(answer), answer.last_stable_offset, answer.high_watermark) == ([b"v0"], 1, 2)
    assert reads.offsets == [0]
    # Read uncommitted, the open transaction's batch lies below the high watermark.
    assert values(await one_batch_from(ahead, app, 0)) == [b"v0"]
    assert values(await one_batch_from(ahead, app, 1)) == [b"open"]
    assert reads.offsets == [0, 0, 1]


async def test_what_was_appended_after_a_read_ahead_comes_in_the_fetch_after_it(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 2)
    ahead = ReadAhead()
    assert values(await one_batch_from(ahead, app, 0)) == [b"v0"]
    await read_aheads()  # offset 1 was read, with the high watermark at 2
    assert (await produce(client, "t", 0, batch(["v2"]))).status_code == 200
    second = await one_batch_from(ahead, app, 1)
    assert (values(second), second.high_watermark) == ([b"v1"], 2)  # as the log was then
    third = await one_batch_from(ahead, app, 2)
    assert (values(third), third.high_watermark) == ([b"v2"], 3)
    assert reads.offsets == [0, 1, 2]


async def test_a_read_ahead_under_the_fetchs_min_bytes_is_not_taken(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 3)
    ahead = ReadAhead()
    await one_batch_from(ahead, app, 0)
    answer = await one_batch_from(ahead, app, 1, min_bytes=10**6)
    assert values(answer) == [b"v1"]
    # Read afresh; and under its min_bytes it is no answer yet, so nothing is read ahead.
    assert reads.offsets == [0, 1, 1]


async def test_a_read_ahead_is_held_under_the_request_memory_and_given_back(
    app: Any, client: httpx.AsyncClient, reads: Reads
) -> None:
    await fill(client, 3)
    held = memory.request_memory()
    before = held.used
    ahead = ReadAhead()
    await one_batch_from(ahead, app, 0)
    await read_aheads()
    assert held.used > before  # offset 1's batch, read ahead
    size = len((await one_batch_from(ahead, app, 1)).batches[0])
    assert held.used == before  # taken, so given back; offset 2's is being read
    await read_aheads()
    assert held.used > before
    ahead.close()
    assert held.used == before

    # A read ahead that another fetch made unwanted is given back once it is done.
    await one_batch_from(ahead, app, 0)
    reads.gate = gate = asyncio.Event()
    await asyncio.sleep(0)  # the read ahead of offset 1 starts, and waits at the gate
    assert reads.offsets[-2:] == [0, 1]
    await one_batch_from(ahead, app, 0)  # a consumer that sought: offset 1 is read again
    gate.set()
    await read_aheads()
    assert held.used == before + size  # the last fetch's read ahead alone
    ahead.close()
    assert held.used == before


async def test_a_read_ahead_that_does_not_fit_the_request_memory_is_read_afresh(
    app: Any, client: httpx.AsyncClient, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(client, 3)
    monkeypatch.setattr(memory, "_memory", memory.RequestMemory(10, 1.0))
    ahead = ReadAhead()
    await one_batch_from(ahead, app, 0)
    await read_aheads()
    assert memory.request_memory().used == 0
    assert values(await one_batch_from(ahead, app, 1)) == [b"v1"]
    assert reads.offsets[:3] == [0, 1, 1]
    ahead.close()


async def test_a_read_ahead_left_unasked_is_dropped(
    app: Any, client: httpx.AsyncClient, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(client, 3)
    monkeypatch.setattr(read_ahead, "READ_AHEAD_TTL_S", 0.0)
    held = memory.request_memory()
    before = held.used
    ahead = ReadAhead()
    await one_batch_from(ahead, app, 0)
    await read_aheads()
    assert held.used == before
    assert values(await one_batch_from(ahead, app, 1)) == [b"v1"]
    assert reads.offsets[:3] == [0, 1, 1]
    ahead.close()
