"""A consumer group member driven by raw heartbeats, for tests: it keeps its epoch and what it
owns, and behaves as a well-written client does (gives up what it is no longer assigned)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import text

TP = tuple[str, int]


def tps(entries: list[dict[str, Any]]) -> set[TP]:
    return {(e["topic"], e["partition"]) for e in entries}


def wire(partitions: set[TP]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(partitions)]


@dataclass
class Member:
    client: httpx.AsyncClient
    group: str
    member_id: str
    topics: list[str] = field(default_factory=lambda: ["t"])
    epoch: int = 0
    owned: set[TP] = field(default_factory=set)
    assignment: set[TP] = field(default_factory=set)

    @property
    def path(self) -> str:
        return f"/v1/groups/{quote(self.group, safe='')}"

    async def send(self, **body: Any) -> httpx.Response:
        payload: dict[str, Any] = {
            "member_id": self.member_id,
            "member_epoch": self.epoch,
            "owned_partitions": wire(self.owned),
        }
        if self.epoch == 0:
            payload["subscribed_topics"] = self.topics
        payload.update(body)
        return await self.client.post(f"{self.path}/heartbeat", json=payload)

    async def beat(self, **body: Any) -> set[TP]:
        """One heartbeat; on success takes the answer: its epoch, and owning exactly what it was
        assigned (what it was told to give up it gives up now, reported at the next beat)."""
        response = await self.send(**body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["member_id"] == self.member_id
        self.epoch = answer["member_epoch"]
        self.assignment = tps(answer["assignment"])
        self.owned = set(self.assignment)
        return self.assignment

    async def leave(self) -> httpx.Response:
        response = await self.send(member_epoch=-1)
        if response.status_code == 200:
            self.epoch, self.owned, self.assignment = 0, set(), set()
        return response

    async def commit(
        self, *offsets: tuple[str, int, int], epoch: int | None = None
    ) -> httpx.Response:
        return await self.client.post(
            f"{self.path}/offsets",
            json={
                "member_id": self.member_id,
                "member_epoch": self.epoch if epoch is None else epoch,
                "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets],
            },
        )


async def settle(members: list[Member], rounds: int = 10) -> None:
    """Heartbeat every member in turn until two rounds in a row change nothing (a release shows
    only in the round after it)."""
    quiet = 0
    for _ in range(rounds):
        before = [(m.epoch, frozenset(m.owned)) for m in members]
        for m in members:
            await m.beat()
        quiet = quiet + 1 if before == [(m.epoch, frozenset(m.owned)) for m in members] else 0
        if quiet == 2:
            return
    raise AssertionError("the group did not settle")


async def settled_pair(client: httpx.AsyncClient) -> tuple[Member, Member]:
    """Members a and b of group g (subscribed to t), joined in that order and settled."""
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    await a.beat()
    await b.beat()
    await settle([a, b])
    return a, b


async def expire(app: Any, member_id: str, column: str = "session_deadline_ms") -> None:
    """Move a member's deadline into the past, as if its timeout had run out."""
    async with app.state.db.write() as session:
        await session.execute(
            text(f"UPDATE group_members SET {column} = 1 WHERE member_id = :m"), {"m": member_id}
        )


async def member_owning_two(client: httpx.AsyncClient) -> Member:
    """Member "a" of group "g", alone, owning both partitions of a new topic "t"."""
    response = await client.post("/v1/topics", json={"name": "t", "partitions": 2})
    assert response.status_code == 201, response.text
    member = Member(client, "g", "a")
    await member.beat()
    await member.beat()
    assert member.owned == {("t", 0), ("t", 1)}
    return member
