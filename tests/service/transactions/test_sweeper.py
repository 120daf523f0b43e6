"""The timeout sweep stays correct with several coordinator processes on one store: every
timed-out transaction is aborted exactly once, its epoch raised by exactly one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from coordinator.core.clock import now_ms
from coordinator.store.engines import open_store
from coordinator.transactions import aborts
from tests.support.api import create_topic, read_all
from tests.support.services import Backend, make_settings
from tests.support.txn import Instance


@pytest.mark.parametrize("per_unit", [1, 5, aborts.ABORTS_PER_UNIT])
async def test_concurrent_sweeps_abort_each_timed_out_transaction_once(
    client: httpx.AsyncClient, store: Backend, app: Any, per_unit: int
) -> None:
    """`per_unit` transactions per unit of work: one, several units of several, all in one."""
    await create_topic(client, "t", partitions=4)
    producers = []
    for i in range(12):
        producer = Instance(client, f"tx-{i}")
        await producer.init(transaction_timeout_ms=1000)
        await producer.add(("t", i % 4))
        await producer.produce("t", i % 4, f"v{i}")
        producers.append(producer)

    # Two more coordinators' worth of connections on the same store, sweeping at once.
    others = [open_store(make_settings(store)) for _ in range(2)]
    later = now_ms() + 5000
    try:
        results = await asyncio.gather(
            aborts.abort_timed_out(app.state.db, now=later, per_unit=per_unit),
            *(aborts.abort_timed_out(db, now=later, per_unit=per_unit) for db in others),
        )
    finally:
        for db in others:
            await db.dispose()

    swept = [tid for result in results for tid in result]
    assert sorted(swept) == sorted(p.tid for p in producers)  # each exactly once
    for producer in producers:
        described = await producer.describe()
        assert described["state"] == "CompleteAbort"
        assert described["producer_epoch"] == producer.epoch + 1
    for partition in range(4):
        assert await read_all(client, "t", partition) == []
        page = await client.get(f"/v1/topics/t/partitions/{partition}/records")
        # Three producers per partition: three records, three abort markers.
        assert page.json()["high_watermark"] == 6
        assert page.json()["last_stable_offset"] == 6
