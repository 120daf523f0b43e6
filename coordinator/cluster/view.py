"""The cluster as one process sees it: itself as a broker, the live brokers, each partition's
leader and epoch, kept fresh from the store; what the Kafka door asks before it answers.

A process renews its broker's lease, places leadership (`brokers.place`, one process at a time)
and reads the cluster back every heartbeat, and at once when a request shows its view is behind
(an append fenced, a client with a newer epoch). A view may be a heartbeat old: what it says
decides where clients are sent, never what is written, which the store fences."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from coordinator.cluster import brokers, placement
from coordinator.cluster.errors import NotCoordinator
from coordinator.cluster.placement import Broker, Key
from coordinator.core.clock import now_ms
from coordinator.core.errors import StoreUnavailable
from coordinator.log import epochs
from coordinator.log.errors import NotLeaderOrFollower, UnknownLeaderEpoch
from coordinator.store import Store

log = logging.getLogger("coordinator.cluster")

NO_LEADER = -1
_REGISTER_ATTEMPTS = 5
# A view is read again on demand at most this often (seconds), however many requests ask.
_REFRESH_AT_MOST_EVERY_S = 0.05


class Cluster:
    """One process's view. `Cluster.alone()` is a broker that is the whole cluster, as a
    process is until it registers (and as tests that build a connection by hand use)."""

    def __init__(self, me: Broker, advertised: bool) -> None:
        self.me = me
        # An address set by `--advertised-listener` is told as it is; without one, this broker
        # is told as the address each client reached.
        self.advertised = advertised
        self.live: tuple[Broker, ...] = (me,)
        self._live_ids: tuple[int, ...] = (me.broker_id,)
        self._leaders: dict[Key, tuple[int | None, int]] = {}
        self._placed: dict[Key, int] = {}  # where the next placement puts unled partitions
        self._refreshed = 0.0
        self._refreshing: asyncio.Lock | None = None
        self._alone = True  # not registered: the whole cluster, with no store to read

    @classmethod
    def alone(cls, broker_id: int = 0, host: str = "127.0.0.1", port: int = 9092) -> Cluster:
        return cls(Broker(broker_id, host, port), advertised=False)

    # -- what the door asks --------------------------------------------------------------------

    def address(self, broker: Broker, host: str, port: int) -> tuple[str, int]:
        """Where clients reach `broker`; this broker, without an advertised address, at the
        address the client reached (`host`, `port`)."""
        if broker.broker_id == self.me.broker_id and not self.advertised:
            return host, port
        return broker.host, broker.port

    def leader(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's (leader, leader epoch) as clients are told: NO_LEADER while its
        leader is not live and the move has not been placed yet (Kafka's LEADER_NOT_AVAILABLE,
        for a heartbeat at most); a partition not placed yet, where the placement will put it.
        A partition this view does not know is answered as led here (the log refuses it if it
        does not exist)."""
        found = self._leaders.get((topic, partition))
        if found is None:
            return self.me.broker_id, epochs.LEADER_EPOCH
        leader, epoch = found
        if leader is None:
            return self._placed.get((topic, partition), self.me.broker_id), epoch
        if leader not in self._live_ids:
            return NO_LEADER, epoch
        return leader, epoch

    def lead(self, topic: str, partition: int, current_leader_epoch: int) -> tuple[int, int]:
        """This broker's (id, leader epoch) as the partition's leader, what an append is fenced
        by; raises as Kafka's broker refuses a request for it: the client's epoch checked first
        (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH), then NOT_LEADER_OR_FOLLOWER."""
        leader, epoch = self.leader(topic, partition)
        epochs.check_current_epoch(current_leader_epoch, epoch)
        if leader != self.me.broker_id:
            raise NotLeaderOrFollower(
                f"broker {self.me.broker_id} does not lead {topic}-{partition}"
                + (f"; broker {leader} does" if leader != NO_LEADER else "; it is moving")
            )
        return leader, epoch

    async def lead_as_read(
        self, db: Store, topic: str, partition: int, current_leader_epoch: int
    ) -> tuple[int, int]:
        """`lead`, but a refusal the view may owe to being behind the store is checked again on
        the cluster read again first: a client whose epoch is ahead of the view, or one sent here
        as the leader (by a process that read the store since) while the view says another
        leads, has seen a move this process has not read yet. So a process just made leader
        takes a producer's first request there, rather than refusing it and then taking the
        next, the gap librdkafka answers by bumping its epoch on every partition
        (confluentinc/librdkafka#4953). A view read within `_REFRESH_AT_MOST_EVERY_S` is not
        read again: a client with stale metadata costs a read that often at most."""
        try:
            return self.lead(topic, partition, current_leader_epoch)
        except (UnknownLeaderEpoch, NotLeaderOrFollower):
            await self.refresh(db)
            return self.lead(topic, partition, current_leader_epoch)

    def knows(self, topics: Iterable[tuple[str, int]]) -> bool:
        """Whether the view holds every partition of these (topic, partition count)s: else a
        topic was created or grown since it was read (a view alone knows none, and needs none)."""
        if self._alone:
            return True
        leaders = self._leaders
        return all((name, count - 1) in leaders for name, count in topics if count > 0)

    def coordinator(self, key: str) -> Broker:
        """The live broker that coordinates a group or transactional id."""
        chosen = placement.coordinator_of(key, self._live_ids)
        return next(b for b in self.live if b.broker_id == chosen)

    def coordinates(self, key: str) -> bool:
        return placement.coordinator_of(key, self._live_ids) == self.me.broker_id

    def coordinate(self, key: str) -> None:
        """Raises NOT_COORDINATOR unless this broker coordinates `key`."""
        chosen = self.coordinator(key)
        if chosen.broker_id != self.me.broker_id:
            raise NotCoordinator(f"broker {chosen.broker_id} coordinates {key!r}, not this one")

    # -- keeping it fresh ------------------------------------------------------------------------

    def apply(self, seen: brokers.Snapshot) -> None:
        """A snapshot of the store's cluster, as this view (itself always among the live: a
        process that serves is live, whatever its lease's last renewal said)."""
        self._alone = False
        live = {b.broker_id: b for b in seen.live}
        live.setdefault(self.me.broker_id, self.me)
        self.live = tuple(live[i] for i in sorted(live))
        self._live_ids = tuple(sorted(live))
        self._leaders = seen.leaders
        unled = {k: v[0] for k, v in seen.leaders.items()}
        self._placed = placement.moves(unled, self._live_ids) if self._unled(unled) else {}
        self._refreshed = time.monotonic()

    def _unled(self, leaders: dict[Key, int | None]) -> bool:
        return any(leader is None or leader not in self._live_ids for leader in leaders.values())

    async def refresh(self, db: Store) -> None:
        """Read the cluster again (at most every `_REFRESH_AT_MOST_EVERY_S`, however many ask
        together)."""
        if self._alone:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        started = time.monotonic()
        async with self._refreshing:
            if self._refreshed >= started - _REFRESH_AT_MOST_EVERY_S:
                return
            self.apply(await brokers.snapshot(db, now_ms()))

    async def join(self, db: Store, node_id: int | None, rack: str | None, lease_ms: int) -> None:
        """Register this listener as a broker, place, and read the cluster."""
        me = self.me
        broker_id = None
        for _ in range(_REGISTER_ATTEMPTS):  # another process may take the id meanwhile
            broker_id = await brokers.register(
                db, node_id, me.host, me.port, rack, lease_ms, now_ms()
            )
            if broker_id is not None:
                break
        if broker_id is None:
            raise RuntimeError(f"could not register as a broker in {_REGISTER_ATTEMPTS} tries")
        self.me = Broker(broker_id, me.host, me.port, rack)
        await self.beat(db, lease_ms)

    async def beat(self, db: Store, lease_ms: int) -> None:
        """One heartbeat: the lease renewed, leadership placed, the cluster read again."""
        now = now_ms()
        if not await brokers.renew(db, self.me, lease_ms, now):
            # Its lease lapsed (a pause) and another listener took its id: it is not live, so
            # nothing is placed on it; what it leads still is, it keeps, fenced by the store.
            log.warning("broker %d's id is another listener's now", self.me.broker_id)
        await brokers.place(db, now)
        self.apply(await brokers.snapshot(db, now_ms()))

    async def keep(self, db: Store, lease_ms: int, interval_ms: int) -> None:
        """Heartbeats until cancelled; an outage of the store is waited out (the lease may
        lapse meanwhile: the broker is placed again when the store answers)."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await self.beat(db, lease_ms)
            except StoreUnavailable:
                pass
            except Exception:
                log.exception("the broker's heartbeat failed")

    async def leave(self, db: Store) -> None:
        """A clean shutdown: the lease given up, so the partitions move at once."""
        with contextlib.suppress(Exception):
            await brokers.leave(db, self.me.broker_id)
