"""One process's view of the cluster (coordinator.cluster.view), on both stores: a refusal the
view may owe to being behind the store is checked again on the store's cluster."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coordinator.cluster import brokers, view
from coordinator.cluster.placement import Broker
from coordinator.core.clock import now_ms
from coordinator.log.errors import NotLeaderOrFollower, UnknownLeaderEpoch
from tests.support.api import create_topic

LEASE = 60_000


async def test_a_view_behind_the_store_reads_it_again_before_it_refuses_to_lead(
    app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process the store made leader after its view was read leads when a client comes (sent
    by a process that read the store since); one the store did not make leader still refuses,
    and so does a client whose epoch is ahead of the store's too."""
    monkeypatch.setattr(view, "_REFRESH_AT_MOST_EVERY_S", 0.0)  # each ask reads the store
    db, now = app.state.db, now_ms()
    await create_topic(client, "t", partitions=1)
    ids = [await brokers.register(db, None, "h", port, None, LEASE, now) for port in (1, 2)]
    await brokers.place(db, now)
    store = await brokers.snapshot(db, now)
    leader, epoch = store.leaders[("t", 0)]
    (other,) = (i for i in ids if i != leader)
    leading, following = (view.Cluster(Broker(i, "h", 1 + i), advertised=False) for i in ids)
    behind = brokers.Snapshot(store.live, {("t", 0): (other, epoch)})
    leading.apply(behind)
    with pytest.raises(NotLeaderOrFollower):
        leading.lead("t", 0, -1)  # as the view says
    assert await leading.lead_as_read(db, "t", 0, -1) == (leader, epoch)
    assert leading.lead("t", 0, -1) == (leader, epoch)  # the view, read again
    following.apply(store)
    with pytest.raises(NotLeaderOrFollower):
        await following.lead_as_read(db, "t", 0, -1)
    with pytest.raises(UnknownLeaderEpoch):
        await leading.lead_as_read(db, "t", 0, epoch + 1)
