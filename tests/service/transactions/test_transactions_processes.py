"""Fencing across service processes: two `coordinator serve` processes on one Postgres database, a
zombie producer talking to one and its replacement talking to the other (docs/pages/http-api.md,
InitPid and Transactions). Every rule lives in the shared store, so it holds whichever process is
asked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import assert_problem, batch, create_topic, produce, read_all
from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.slow

# Every request to a real service is bounded; a hung call fails the test instead of hanging it.
HTTP_TIMEOUT = httpx.Timeout(15.0)
CONCURRENT_INIT_PIDS = 10
TOPIC = "payments"


@dataclass
class Processes:
    a: ServiceProcess
    b: ServiceProcess
    workdir: Path


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Two service processes on one fresh Postgres database; the first `serve` migrates it."""
    url = create_postgres_database()
    workdir = tmp_path_factory.mktemp("processes")
    started: list[ServiceProcess] = []
    try:
        for _ in range(2):
            service = ServiceProcess(url, workdir)
            started.append(service)
            service.start()
        yield Processes(started[0], started[1], workdir)
    finally:
        for service in started:
            service.stop()
        drop_postgres_database(url)


@pytest.fixture
async def clients(
    processes: Processes,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with (
        httpx.AsyncClient(base_url=processes.a.url, timeout=HTTP_TIMEOUT) as a,
        httpx.AsyncClient(base_url=processes.b.url, timeout=HTTP_TIMEOUT) as b,
    ):
        yield a, b
    assert_service_logs_clean(processes.workdir)


def assert_service_logs_clean(workdir: Path) -> None:
    """No process logged a traceback (an unexpected failure is always a bug)."""
    for log in sorted(workdir.glob("service-*.log")):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log.name}:\n{text[-4000:]}"


async def init_pid(client: httpx.AsyncClient, transactional_id: str) -> tuple[int, int]:
    response = await client.post("/v1/init-pid", json={"transactional_id": transactional_id})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["producer_id"], body["producer_epoch"]


def caller(producer_id: int, epoch: int) -> dict[str, int]:
    return {"producer_id": producer_id, "producer_epoch": epoch}


async def add_partitions(
    client: httpx.AsyncClient,
    tid: str,
    producer_id: int,
    epoch: int,
    *partitions: int,
    topic: str = TOPIC,
) -> httpx.Response:
    return await client.post(
        f"/v1/transactions/{tid}/partitions",
        json={
            **caller(producer_id, epoch),
            "partitions": [{"topic": topic, "partition": p} for p in partitions],
        },
    )


async def end_txn(
    client: httpx.AsyncClient, tid: str, producer_id: int, epoch: int, commit: bool
) -> httpx.Response:
    return await client.post(
        f"/v1/transactions/{tid}/end", json={**caller(producer_id, epoch), "commit": commit}
    )


async def partitions_of(client: httpx.AsyncClient, topic: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    partitions: list[dict[str, Any]] = response.json()["partitions"]
    return partitions


async def describe(client: httpx.AsyncClient, tid: str) -> dict[str, Any]:
    response = await client.get(f"/v1/transactions/{tid}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def offsets(high_watermark: int, stable: int) -> dict[str, int]:
    return {"log_start_offset": 0, "high_watermark": high_watermark, "last_stable_offset": stable}


def values(records: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(r["offset"], r["value"]) for r in records]


async def test_init_pid_via_another_process_aborts_the_zombie_txn_and_fences_it(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    zombie, fresh = clients  # the zombie talks to process A, its replacement to process B
    tid = "etl-fencing"
    await create_topic(zombie, TOPIC, partitions=2)

    pid, old = await init_pid(zombie, tid)
    assert (await add_partitions(zombie, tid, pid, old, 0, 1)).json() == {"state": "Ongoing"}
    written = await produce(
        zombie, TOPIC, 0, batch(["z1", "z2"], pid, old, 0, transactional_id=tid)
    )
    assert written.json() == {"base_offset": 0, "last_offset": 1, "duplicate": False}
    # Process B sees the open transaction pin the LSO at its first record.
    assert (await partitions_of(fresh, TOPIC))[0] == {"partition": 0, **offsets(2, 0)}

    # The new instance, via B: the same producer id, the epoch raised by one, and the zombie's
    # open transaction aborted before the answer (an abort marker on each of its partitions).
    assert await init_pid(fresh, tid) == (pid, old + 1)
    new = old + 1
    assert await partitions_of(zombie, TOPIC) == [
        {"partition": 0, **offsets(3, 3)},
        {"partition": 1, **offsets(1, 1)},
    ]
    assert await read_all(zombie, TOPIC, 0) == []
    uncommitted = await read_all(zombie, TOPIC, 0, isolation_level="read_uncommitted")
    assert values(uncommitted) == [(0, "z1"), (1, "z2")]
    after_init = await describe(zombie, tid)
    assert (after_init["state"], after_init["producer_epoch"]) == ("Empty", new)

    # Everything the zombie tries next via A is fenced and writes nothing.
    for response in [
        await produce(zombie, TOPIC, 0, batch(["z3"], pid, old, 2, transactional_id=tid)),
        await produce(zombie, TOPIC, 0, batch(["z1", "z2"], pid, old, 0, transactional_id=tid)),
        await add_partitions(zombie, tid, pid, old, 1),
        await zombie.post(f"/v1/transactions/{tid}/prepare", json=caller(pid, old)),
        await end_txn(zombie, tid, pid, old, commit=True),
        await end_txn(zombie, tid, pid, old, commit=False),
    ]:
        assert_problem(response, 409, "PRODUCER_FENCED")
    assert await partitions_of(fresh, TOPIC) == [
        {"partition": 0, **offsets(3, 3)},
        {"partition": 1, **offsets(1, 1)},
    ]
    assert await describe(fresh, tid) == after_init

    # The new instance's transaction, via B, commits and is visible through both processes.
    assert (await add_partitions(fresh, tid, pid, new, 0)).json() == {"state": "Ongoing"}
    written = await produce(fresh, TOPIC, 0, batch(["n1"], pid, new, 0, transactional_id=tid))
    assert written.json() == {"base_offset": 3, "last_offset": 3, "duplicate": False}
    # The zombie cannot end the new instance's transaction either.
    assert_problem(await end_txn(zombie, tid, pid, old, commit=True), 409, "PRODUCER_FENCED")
    assert (await partitions_of(zombie, TOPIC))[0] == {"partition": 0, **offsets(4, 3)}
    ended = await end_txn(fresh, tid, pid, new, commit=True)
    assert ended.json() == {
        "state": "CompleteCommit",
        "producer_id": pid,
        "producer_epoch": new + 1,
    }
    for client in clients:
        assert values(await read_all(client, TOPIC, 0)) == [(3, "n1")]
        assert (await partitions_of(client, TOPIC))[0] == {"partition": 0, **offsets(5, 5)}
    # Late, the zombie's commit is still refused: a fenced epoch never joins a later transaction.
    assert_problem(await end_txn(zombie, tid, pid, old, commit=True), 409, "PRODUCER_FENCED")
    assert values(await read_all(fresh, TOPIC, 0)) == [(3, "n1")]


async def concurrent_init_pids(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], tid: str
) -> list[tuple[int, int]]:
    """CONCURRENT_INIT_PIDS InitPids of one id at once, split across both processes."""
    return await asyncio.gather(
        *(init_pid(clients[i % 2], tid) for i in range(CONCURRENT_INIT_PIDS))
    )


async def test_concurrent_init_pids_across_processes_each_get_a_distinct_epoch(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, b = clients
    tid = "etl-racing"
    topic = "racing"
    await create_topic(a, topic)
    pid, first = await init_pid(a, tid)
    added = await add_partitions(a, tid, pid, first, 0, topic=topic)
    assert added.json() == {"state": "Ongoing"}
    response = await a.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json=batch(["open"], pid, first, 0, transactional_id=tid),
    )
    assert response.status_code == 200, response.text

    answers = await concurrent_init_pids(clients, tid)

    # Each raise is by exactly one: every call got its own epoch, none lost, none repeated.
    assert {p for p, _ in answers} == {pid}
    assert sorted(e for _, e in answers) == list(range(first + 1, first + 1 + len(answers)))
    for client in clients:
        description = await describe(client, tid)
        assert description["producer_epoch"] == first + CONCURRENT_INIT_PIDS
        assert description["state"] == "Empty"
    # The open transaction was aborted exactly once: one record, one abort marker.
    response = await b.get(f"/v1/topics/{topic}")
    assert response.json()["partitions"] == [{"partition": 0, **offsets(2, 2)}]
    assert await read_all(b, topic, 0) == []


async def test_concurrent_first_init_pids_of_a_new_id_across_processes_share_one_producer_id(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    tid = "etl-brand-new"

    answers = await concurrent_init_pids(clients, tid)

    # One caller created the id at epoch 0; every other raised it by exactly one.
    assert len({p for p, _ in answers}) == 1
    assert sorted(e for _, e in answers) == list(range(CONCURRENT_INIT_PIDS))
    for client in clients:
        assert (await describe(client, tid))["producer_epoch"] == CONCURRENT_INIT_PIDS - 1
