"""A transactional producer instance for tests: holds its (pid, epoch) and per-partition
sequences, and makes the raw calls so a test reads as the rule it proves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx


@dataclass
class Instance:
    client: httpx.AsyncClient
    tid: str
    pid: int = -1
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    async def init(self, **body: Any) -> httpx.Response:
        response = await self.client.post(
            "/v1/init-pid", json={"transactional_id": self.tid, **body}
        )
        if response.status_code == 200:
            self.pid = response.json()["producer_id"]
            self.epoch = response.json()["producer_epoch"]
            self.sequences.clear()
        return response

    @property
    def path_id(self) -> str:
        """The id as it goes in a URL path: percent-encoded (ids may hold "/", "?", "%")."""
        return quote(self.tid, safe="")

    def caller(self) -> dict[str, int]:
        return {"producer_id": self.pid, "producer_epoch": self.epoch}

    async def add(self, *partitions: tuple[str, int]) -> httpx.Response:
        return await self.client.post(
            f"/v1/transactions/{self.path_id}/partitions",
            json={
                **self.caller(),
                "partitions": [{"topic": t, "partition": p} for t, p in partitions],
            },
        )

    async def produce(self, topic: str, partition: int, *values: str) -> httpx.Response:
        sequence = self.sequences.get((topic, partition), 0)
        response = await self.client.post(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            json={
                **self.caller(),
                "base_sequence": sequence,
                "transactional_id": self.tid,
                "records": [{"value": v} for v in values],
            },
        )
        if response.status_code == 200:
            self.sequences[(topic, partition)] = sequence + len(values)
        return response

    async def offsets(self, group: str, *offsets: tuple[str, int, int]) -> httpx.Response:
        return await self.client.post(
            f"/v1/transactions/{self.path_id}/offsets",
            json={
                **self.caller(),
                "group_id": group,
                "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets],
            },
        )

    async def share_acks(
        self, group: str, member: str, *acks: tuple[str, int, int, str]
    ) -> httpx.Response:
        """A share group member's acknowledgements (topic, partition, offset, type) into the
        transaction."""
        return await self.client.post(
            f"/v1/transactions/{self.path_id}/share-acknowledgements",
            json={
                **self.caller(),
                "group_id": group,
                "member_id": member,
                "acknowledgements": [
                    {"topic": t, "partition": p, "first_offset": o, "type": kind}
                    for t, p, o, kind in acks
                ],
            },
        )

    async def prepare(self) -> httpx.Response:
        return await self.client.post(
            f"/v1/transactions/{self.path_id}/prepare", json=self.caller()
        )

    async def end(self, commit: bool, adopt: bool = True) -> httpx.Response:
        """EndTxn; on success the instance takes the answer's new epoch (KIP-890)."""
        response = await self.client.post(
            f"/v1/transactions/{self.path_id}/end", json={**self.caller(), "commit": commit}
        )
        if response.status_code == 200 and adopt:
            self.pid = response.json()["producer_id"]
            self.epoch = response.json()["producer_epoch"]
            self.sequences.clear()
        return response

    async def describe(self) -> dict[str, Any]:
        response = await self.client.get(f"/v1/transactions/{self.path_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


async def started(client: httpx.AsyncClient, tid: str) -> Instance:
    instance = Instance(client, tid)
    response = await instance.init()
    assert response.status_code == 200, response.text
    return instance


async def partition_state(client: httpx.AsyncClient, topic: str, partition: int) -> dict[str, int]:
    response = await client.get(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    state: dict[str, int] = response.json()["partitions"][partition]
    return state


async def included(producer: Instance) -> tuple[str, list[tuple[str, int]]]:
    """The transaction's state and the partitions it includes, sorted."""
    described = await producer.describe()
    partitions = sorted((p["topic"], p["partition"]) for p in described["partitions"])
    return described["state"], partitions
