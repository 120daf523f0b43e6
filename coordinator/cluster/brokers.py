"""The cluster in the store: brokers registered under leases, and each partition's leader.

Every process with a Kafka listener registers as a broker (`register`) and renews its lease
(`renew`) every heartbeat; a process that shuts down cleanly gives its lease up (`leave`), so its
partitions move at once rather than when the lease runs out. One process at a time, under the
store's claim, applies `placement.moves` to the partitions (`place`): each move names the new
leader and raises the partition's leader epoch, in the row whose lock every append takes, so an
append taken under the old leader and epoch can no longer be written (the fence,
`log.epochs.leads`). A partition's first leader keeps epoch 0, as a new Kafka partition's does.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, and_, bindparam, case, or_, select, update

from coordinator.cluster.errors import DuplicateBroker
from coordinator.cluster.models import BrokerRow
from coordinator.cluster.placement import Broker, Key, moves
from coordinator.log.models import Partition
from coordinator.store import Store
from coordinator.store.sql import pairs_in

brokers = cast(Table, BrokerRow.__table__)
partitions = cast(Table, Partition.__table__)
_PLACEMENT = "placement"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The live brokers (by id) and every partition's (leader, leader epoch)."""

    live: tuple[Broker, ...]
    leaders: dict[Key, tuple[int | None, int]]


def advertised_host(host: str) -> str:
    """The host a listener bound to tells other processes' clients: a wildcard address names
    this machine instead."""
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


async def register(
    db: Store, node_id: int | None, host: str, port: int, rack: str | None, lease_ms: int, now: int
) -> int | None:
    """Register this listener as a broker under a lease, and answer its id: `node_id` when
    given (refused while a live broker of another address holds it), else the id this address
    had before, else the lowest id never used. The processes of one listener (`--workers`)
    share its id. Nothing is deleted: a row is taken over only where it is this address's or
    its lease has lapsed, and a new one is inserted only where none is; None when another
    process took the id meanwhile (`view.Cluster.join` registers again)."""
    async with db.write() as session:
        rows = (await session.execute(select(BrokerRow))).scalars().all()
        if node_id is None:
            same = [r.broker_id for r in rows if (r.host, r.port) == (host, port)]
            used = {r.broker_id for r in rows}
            node_id = same[0] if same else next(i for i in range(len(used) + 1) if i not in used)
        held = next((r for r in rows if r.broker_id == node_id), None)
        moved = held is not None and (held.host, held.port) != (host, port)
        if held is not None and moved and held.lease_expires_ms > now:
            raise DuplicateBroker(
                f"broker {node_id} is registered at {held.host}:{held.port} and live; "
                "give this process another COORDINATOR_KAFKA_NODE_ID"
            )
        row = {
            "broker_id": node_id,
            "host": host,
            "port": port,
            "rack": rack,
            "lease_expires_ms": now + lease_ms,
            "registered_ms": now,
        }
        mine_or_lapsed = or_(
            and_(BrokerRow.host == host, BrokerRow.port == port),
            BrokerRow.lease_expires_ms <= now,
        )
        taken = await session.execute(
            update(BrokerRow)
            .where(BrokerRow.broker_id == node_id, mine_or_lapsed)
            .values(**row)
            .execution_options(preserve_rowcount=True)
        )
        if getattr(taken, "rowcount", 0) == 1:
            return node_id
        if await db.insert_ignore(session, brokers, [row], ["broker_id"]) == 1:
            return node_id
        return None


async def renew(db: Store, broker: Broker, lease_ms: int, now: int) -> bool:
    """Renew the broker's lease; False when its row is another address's now (its lease
    lapsed and another process took the id) or gone and taken again meanwhile."""
    async with db.write() as session:
        renewed = await session.execute(
            update(BrokerRow)
            .where(
                BrokerRow.broker_id == broker.broker_id,
                BrokerRow.host == broker.host,
                BrokerRow.port == broker.port,
            )
            .values(lease_expires_ms=now + lease_ms)
            .execution_options(preserve_rowcount=True)
        )
        if getattr(renewed, "rowcount", 0) == 1:
            return True
        row = {
            "broker_id": broker.broker_id,
            "host": broker.host,
            "port": broker.port,
            "rack": broker.rack,
            "lease_expires_ms": now + lease_ms,
            "registered_ms": now,
        }
        return await db.insert_ignore(session, brokers, [row], ["broker_id"]) == 1


async def leave(db: Store, broker_id: int) -> None:
    """Give the lease up: the broker is no longer live, and the next placement moves its
    partitions."""
    async with db.write() as session:
        await session.execute(
            update(BrokerRow).where(BrokerRow.broker_id == broker_id).values(lease_expires_ms=0)
        )


async def snapshot(db: Store, now: int) -> Snapshot:
    async with db.read() as session:
        live = (
            await session.execute(
                select(BrokerRow.broker_id, BrokerRow.host, BrokerRow.port, BrokerRow.rack)
                .where(BrokerRow.lease_expires_ms > now)
                .order_by(BrokerRow.broker_id)
            )
        ).all()
        led = await session.execute(
            select(
                partitions.c.topic,
                partitions.c.partition,
                partitions.c.leader_id,
                partitions.c.leader_epoch,
            )
        )
        return Snapshot(
            tuple(Broker(*row) for row in live), {(t, p): (lid, e) for t, p, lid, e in led}
        )


_MOVE = (
    update(partitions)
    .where(
        and_(
            partitions.c.topic == bindparam("t"),
            partitions.c.partition == bindparam("p"),
            partitions.c.leader_id.is_not_distinct_from(bindparam("was")),
        )
    )
    .values(
        leader_id=bindparam("to"),
        leader_epoch=case(
            (partitions.c.leader_id.is_(None), partitions.c.leader_epoch),
            else_=partitions.c.leader_epoch + 1,
        ),
    )
)


async def place(db: Store, now: int) -> int:
    """Apply `placement.moves` to the store's partitions, unless another process is placing
    them now: how many moved."""
    async with db.write() as session:
        if not await db.claim(session, _PLACEMENT):
            return 0
        live = (
            await session.scalars(
                select(BrokerRow.broker_id).where(BrokerRow.lease_expires_ms > now)
            )
        ).all()
        led = await session.execute(
            select(partitions.c.topic, partitions.c.partition, partitions.c.leader_id)
        )
        leaders = {(t, p): lid for t, p, lid in led}
        moved = moves(leaders, live)
        if not moved:
            return 0
        # Only the rows no append holds now: a process paused in an append (SIGSTOP, a long
        # GC) keeps its partition until it wakes, and its append, taken at the current epoch,
        # stands; the others move now, and that one at a later beat.
        free = await session.execute(
            select(partitions.c.topic, partitions.c.partition)
            .where(pairs_in(partitions.c.topic, partitions.c.partition, sorted(moved)))
            .order_by(partitions.c.topic, partitions.c.partition)
            .with_for_update(skip_locked=True)
        )
        moving = [(t, p) for t, p in free]
        if moving:
            connection = await session.connection()
            await connection.execute(
                _MOVE,
                [{"t": t, "p": p, "was": leaders[(t, p)], "to": moved[(t, p)]} for t, p in moving],
            )
        return len(moving)
