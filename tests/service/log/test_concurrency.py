"""Concurrent idempotent producers on one partition, across processes and across crashes.

Appends to a partition are serial and deduplicated however many requests, connections and service
processes race for it, and an acknowledged batch survives SIGKILL (docs/pages/http-api.md, Records).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import batch, create_topic, read_all
from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database

TOPIC = "t"
RECORDS_PATH = f"/v1/topics/{TOPIC}/partitions/0/records"
# Every request to a real service is bounded; a hung append fails the test instead of hanging it.
HTTP_TIMEOUT = httpx.Timeout(15.0)
# A producer's pause between retries after a transport error (Kafka's retry.backoff.ms).
RETRY_BACKOFF_S = 0.05


# -- batches, answers and the checks every test makes ------------------------------------------


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of an idempotent producer; each value names its producer and record sequence."""

    producer: int
    producer_id: int
    sequence: int
    values: tuple[str, ...]

    def body(self) -> dict[str, Any]:
        return batch(list(self.values), self.producer_id, 0, self.sequence)


@dataclass(frozen=True)
class Ack:
    base_offset: int
    last_offset: int


def value_of(producer: int, sequence: int) -> str:
    return f"p{producer}-s{sequence}"


def next_batch(producer: int, producer_id: int, sequence: int, rng: random.Random) -> PlannedBatch:
    size = rng.randint(1, 3)
    values = tuple(value_of(producer, sequence + i) for i in range(size))
    return PlannedBatch(producer, producer_id, sequence, values)


def plan_batches(producer: int, producer_id: int, count: int) -> list[PlannedBatch]:
    rng = random.Random(producer)
    batches, sequence = [], 0
    for _ in range(count):
        planned = next_batch(producer, producer_id, sequence, rng)
        batches.append(planned)
        sequence += len(planned.values)
    return batches


def answer_of(response: httpx.Response) -> tuple[Ack, bool]:
    """(offsets, duplicate) of a Produce answer, which must be 200."""
    assert response.status_code == 200, response.text
    body = response.json()
    return Ack(body["base_offset"], body["last_offset"]), body["duplicate"]


async def high_watermark(client: httpx.AsyncClient) -> int:
    response = await client.get(f"/v1/topics/{TOPIC}")
    assert response.status_code == 200, response.text
    hw: int = response.json()["partitions"][0]["high_watermark"]
    return hw


def assert_each_batch_once_at_its_offsets(
    plans: Iterable[list[PlannedBatch]],
    acks: dict[PlannedBatch, Ack],
    records: list[dict[str, Any]],
    hw: int,
) -> None:
    """Every acknowledged batch sits exactly once at its acknowledged offsets, and nothing else."""
    plans = list(plans)
    sent = [b for plan in plans for b in plan]
    assert set(acks) == set(sent), "every batch sent must have been acknowledged"
    total = sum(len(b.values) for b in sent)
    # The acknowledged offsets tile 0..HW-1: no gap, no overlap.
    next_offset = 0
    for base, last in sorted((a.base_offset, a.last_offset) for a in acks.values()):
        assert base == next_offset, (
            f"gap or overlap: a batch at {base}..{last}, expected {next_offset}"
        )
        next_offset = last + 1
    assert next_offset == hw == total, (next_offset, hw, total)
    # The log holds each record once, where its batch's answer said.
    assert [r["offset"] for r in records] == list(range(total))
    value_at = {r["offset"]: r["value"] for r in records}
    for planned, ack in acks.items():
        stored = [value_at[o] for o in range(ack.base_offset, ack.last_offset + 1)]
        assert stored == list(planned.values), (planned, ack)
    repeated = [v for v, n in Counter(value_at.values()).items() if n > 1]
    assert not repeated, f"records appear twice: {repeated[:10]}"
    # Each producer's records appear in the order it sent them.
    for plan in plans:
        if not plan:
            continue
        prefix = f"p{plan[0].producer}-"
        in_log = [r["value"] for r in records if r["value"].startswith(prefix)]
        assert in_log == [v for b in plan for v in b.values], f"producer {plan[0].producer}"


# -- producers that retry while their batch may still be in flight -------------------------------

HOME, OTHER = 0, 1
Send = Callable[[PlannedBatch, int], Awaitable[httpx.Response]]


@dataclass
class RetryAnswers:
    acks: dict[PlannedBatch, Ack] = field(default_factory=dict)
    # (batch, offsets, duplicate) of retries sent after the batch was acknowledged.
    late: list[tuple[PlannedBatch, Ack, bool]] = field(default_factory=list)


async def produce_with_retries(plan: list[PlannedBatch], send: Send, answers: RetryAnswers) -> None:
    """Send `plan` in order through `send`; some batches go twice at once, some are re-sent later.

    `send(batch, route)`: route HOME is the producer's usual way in, OTHER another one (another
    service process, where there is one), as when a client fails over and retries elsewhere.
    """
    for k, planned in enumerate(plan):
        if k % 5 == 1:
            # The same batch twice at once: exactly one is written, both answers agree.
            first, second = await asyncio.gather(send(planned, HOME), send(planned, OTHER))
            (ack_a, dup_a), (ack_b, dup_b) = answer_of(first), answer_of(second)
            assert sorted([dup_a, dup_b]) == [False, True], (planned, first.text, second.text)
            assert ack_a == ack_b, (planned, first.text, second.text)
            answers.acks[planned] = ack_a
        elif k % 5 == 3:
            # A retry of an acknowledged batch, concurrent with the producer's next append.
            earlier = plan[k - 2]
            new, retry = await asyncio.gather(send(planned, HOME), send(earlier, OTHER))
            ack, duplicate = answer_of(new)
            assert not duplicate, (planned, new.text)
            answers.acks[planned] = ack
            answers.late.append((earlier, *answer_of(retry)))
        else:
            ack, duplicate = answer_of(await send(planned, HOME))
            assert not duplicate, (planned, ack)
            answers.acks[planned] = ack


def assert_retries_were_duplicates(answers: RetryAnswers) -> None:
    assert answers.late, "the test sent no late retries"
    for planned, ack, duplicate in answers.late:
        assert duplicate, f"a retry of {planned} was written again at {ack}"
        assert ack == answers.acks[planned], f"a retry of {planned} answered other offsets"


async def init_pid_via(client: httpx.AsyncClient) -> int:
    response = await client.post("/v1/init-pid", json={"transactional_id": None})
    assert response.status_code == 200, response.text
    assert response.json()["producer_epoch"] == 0
    producer_id: int = response.json()["producer_id"]
    return producer_id


# -- rule 1: one process, many producers -------------------------------------------------------


async def test_concurrent_idempotent_producers_get_unique_contiguous_offsets_and_dedup(
    client: httpx.AsyncClient,
) -> None:
    producers, batches_each = 8, 25
    await create_topic(client, TOPIC)
    pids = [await init_pid_via(client) for _ in range(producers)]
    assert len(set(pids)) == producers
    plans = [plan_batches(i, pid, batches_each) for i, pid in enumerate(pids)]
    answers = RetryAnswers()

    async def send(planned: PlannedBatch, _: int) -> httpx.Response:
        return await client.post(RECORDS_PATH, json=planned.body())

    await asyncio.wait_for(
        asyncio.gather(*(produce_with_retries(plan, send, answers) for plan in plans)), 60
    )

    assert_retries_were_duplicates(answers)
    records = await read_all(client, TOPIC)
    assert_each_batch_once_at_its_offsets(
        plans, answers.acks, records, await high_watermark(client)
    )


# -- real service processes ----------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_store_url(request: pytest.FixtureRequest, workdir: Path) -> Iterator[str]:
    """A store no process has touched yet: the first `serve` migrates it."""
    if request.param == "sqlite":
        yield f"sqlite:///{workdir / 'coordinator.db'}"
        return
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


@pytest.fixture
def spawn(fresh_store_url: str, workdir: Path) -> Iterator[Callable[[], ServiceProcess]]:
    """Start another service process on the fresh store; every one is stopped at the end."""
    started: list[ServiceProcess] = []

    def start() -> ServiceProcess:
        service = ServiceProcess(fresh_store_url, workdir)
        started.append(service)
        return service.start()

    try:
        yield start
    finally:
        for service in started:
            service.stop()


def assert_service_logs_clean(workdir: Path) -> None:
    """No process logged a traceback (an unexpected failure is always a bug)."""
    for log in sorted(workdir.glob("service-*.log")):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log.name}:\n{text[-4000:]}"


def service_client(service: ServiceProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=service.url, timeout=HTTP_TIMEOUT)


# -- rule 2: two processes, one store ------------------------------------------------------------


@pytest.mark.slow
async def test_two_processes_on_one_store_append_serially_and_dedup_across_processes(
    spawn: Callable[[], ServiceProcess], workdir: Path
) -> None:
    producers, batches_each = 6, 20
    # One after the other: the first migrates the fresh store, the second finds it at head.
    first = await asyncio.to_thread(spawn)
    second = await asyncio.to_thread(spawn)
    async with service_client(first) as a, service_client(second) as b:
        clients = [a, b]
        await create_topic(a, TOPIC)
        # Producer ids come from the shared store, so they are unique across processes.
        pids = [await init_pid_via(clients[i % 2]) for i in range(producers)]
        assert len(set(pids)) == producers
        plans = [plan_batches(i, pid, batches_each) for i, pid in enumerate(pids)]
        answers = RetryAnswers()

        async def send(planned: PlannedBatch, route: int) -> httpx.Response:
            # Producer i lives on process i % 2; its concurrent twins and retries go to the other.
            via = clients[(planned.producer + route) % 2]
            return await via.post(RECORDS_PATH, json=planned.body())

        await asyncio.wait_for(
            asyncio.gather(*(produce_with_retries(plan, send, answers) for plan in plans)), 60
        )

        assert_retries_were_duplicates(answers)
        # Both processes see the same log.
        records = await read_all(a, TOPIC)
        assert await read_all(b, TOPIC) == records
        hw = await high_watermark(b)
        assert_each_batch_once_at_its_offsets(plans, answers.acks, records, hw)
    assert_service_logs_clean(workdir)


@pytest.mark.slow
async def test_retries_of_one_batch_racing_in_two_processes_append_it_once(
    spawn: Callable[[], ServiceProcess], workdir: Path
) -> None:
    """Each process gathers its copies into one append group; the two groups race for the
    partition's lock, and the one that gets it second finds the batch written."""
    first = await asyncio.to_thread(spawn)
    second = await asyncio.to_thread(spawn)
    async with service_client(first) as a, service_client(second) as b:
        await create_topic(a, TOPIC)
        pid = await init_pid_via(a)
        copies = [a, b] * 8
        for sequence in (0, 2):
            body = batch([f"s{sequence}", f"s{sequence + 1}"], pid, 0, sequence)
            answers = await asyncio.gather(*(c.post(RECORDS_PATH, json=body) for c in copies))
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            assert sum(not r.json()["duplicate"] for r in answers) == 1
            assert {(r.json()["base_offset"], r.json()["last_offset"]) for r in answers} == {
                (sequence, sequence + 1)
            }
        assert [r["value"] for r in await read_all(b, TOPIC)] == ["s0", "s1", "s2", "s3"]
    assert_service_logs_clean(workdir)


# -- rule 3: SIGKILL under load -----------------------------------------------------------------


class Target:
    """The service the producers talk to; the test replaces it after each crash."""

    def __init__(self, service: ServiceProcess) -> None:
        self.service = service


@dataclass
class CrashingProducer:
    index: int
    producer_id: int
    sent: list[PlannedBatch] = field(default_factory=list)
    acks: dict[PlannedBatch, Ack] = field(default_factory=dict)
    # Batches whose first attempt got no answer (in flight at the kill, or sent while down).
    unanswered: list[PlannedBatch] = field(default_factory=list)
    # Requests cut off by a kill after they were sent (not merely refused while it was down).
    cut_off: int = 0

    def last_acknowledged(self) -> PlannedBatch | None:
        return next((b for b in reversed(self.sent) if b in self.acks), None)


async def send_until_answered(
    http: httpx.AsyncClient, target: Target, planned: PlannedBatch, deadline: float
) -> tuple[Ack, bool, list[httpx.TransportError]]:
    """Send the same batch (same sequence) until a service answers, as an idempotent producer does.

    Returns (offsets, duplicate, the transport errors on the way). Only transport errors and the
    retriable 503 are retried; any other answer is final.
    """
    errors: list[httpx.TransportError] = []
    for _ in range(10_000):
        if time.monotonic() > deadline:
            break
        try:
            response = await http.post(f"{target.service.url}{RECORDS_PATH}", json=planned.body())
        except httpx.TransportError as exc:
            errors.append(exc)
            await asyncio.sleep(RETRY_BACKOFF_S)
            continue
        if response.status_code == 503 and response.json().get("retriable"):
            await asyncio.sleep(RETRY_BACKOFF_S)
            continue
        ack, duplicate = answer_of(response)
        return ack, duplicate, errors
    raise AssertionError(f"{planned} got no answer before the deadline ({len(errors)} errors)")


async def keep_producing(
    http: httpx.AsyncClient,
    target: Target,
    producer: CrashingProducer,
    stop: asyncio.Event,
    deadline: float,
) -> None:
    rng = random.Random(producer.index)
    sequence = 0
    for _ in range(5_000):
        if stop.is_set():
            return
        planned = next_batch(producer.index, producer.producer_id, sequence, rng)
        producer.sent.append(planned)
        ack, duplicate, errors = await send_until_answered(http, target, planned, deadline)
        if errors:
            producer.unanswered.append(planned)
            producer.cut_off += sum(not isinstance(e, httpx.ConnectError) for e in errors)
        else:
            assert not duplicate, f"{planned} was a duplicate on its first attempt"
        producer.acks[planned] = ack
        sequence += len(planned.values)
    raise AssertionError(f"producer {producer.index} ran out of batches before the test stopped it")


async def until(
    condition: Callable[[], bool], deadline: float, tasks: list[asyncio.Task[None]], what: str
) -> None:
    """Poll `condition`; fail if a producer task failed or the deadline passes."""
    while not condition():
        for task in tasks:
            if task.done():
                task.result()  # re-raises a producer's failure
                raise AssertionError(f"a producer stopped early while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"deadline passed while waiting for {what}")
        await asyncio.sleep(0.01)


async def assert_last_batches_are_duplicates(
    http: httpx.AsyncClient, target: Target, producers: list[CrashingProducer], deadline: float
) -> int:
    """Re-send each producer's last acknowledged batch: answered as a duplicate, same offsets."""
    checked = 0
    for producer in producers:
        last = producer.last_acknowledged()
        if last is None:
            continue
        original = producer.acks[last]
        ack, duplicate, _ = await send_until_answered(http, target, last, deadline)
        assert duplicate, f"{last} (acknowledged at {original}) was written again at {ack}"
        assert ack == original, f"{last}: first answered {original}, after the crash {ack}"
        checked += 1
    return checked


@pytest.mark.slow
async def test_acknowledged_batches_survive_sigkill_exactly_once_and_dedup_survives(
    spawn: Callable[[], ServiceProcess], workdir: Path
) -> None:
    deadline = time.monotonic() + 75
    kills, progress_between_kills = 2, 6
    target = Target(await asyncio.to_thread(spawn))
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as http:
        async with service_client(target.service) as setup:
            await create_topic(setup, TOPIC)
            pids = [await init_pid_via(setup) for _ in range(4)]
        producers = [CrashingProducer(i, pid) for i, pid in enumerate(pids)]
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(keep_producing(http, target, p, stop, deadline)) for p in producers
        ]

        async def every_producer_progresses(what: str) -> None:
            goals = [len(p.acks) + progress_between_kills for p in producers]
            await until(
                lambda: all(len(p.acks) >= g for p, g in zip(producers, goals, strict=True)),
                deadline,
                tasks,
                what,
            )

        try:
            for kill in range(1, kills + 1):
                await every_producer_progresses(f"appends before kill {kill}")
                # Mid-load: the producers have requests in flight right now.
                await asyncio.to_thread(target.service.kill)
                target.service = await asyncio.to_thread(spawn)
                # Dedup survives the crash: what the killed process acknowledged is recognised.
                checked = await assert_last_batches_are_duplicates(
                    http, target, producers, deadline
                )
                assert checked == len(producers), f"after kill {kill}"
            await every_producer_progresses("appends after the last restart")
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), max(1.0, deadline - time.monotonic()))
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # The kills hit requests already sent, not only ones sent while the service was down.
    assert sum(p.cut_off for p in producers) > 0, "no request was in flight at a kill"
    async with service_client(target.service) as reader:
        records = await read_all(reader, TOPIC)
        hw = await high_watermark(reader)
    acks = {b: a for p in producers for b, a in p.acks.items()}
    assert_each_batch_once_at_its_offsets((p.sent for p in producers), acks, records, hw)
    # The batches that got no answer at first were written once, by whichever attempt landed.
    counts = Counter(r["value"] for r in records)
    unanswered = [b for p in producers for b in p.unanswered]
    assert unanswered
    for planned in unanswered:
        assert [counts[v] for v in planned.values] == [1] * len(planned.values), planned
    assert_service_logs_clean(workdir)


@pytest.mark.slow
async def test_serve_with_several_workers_appends_each_batch_once_in_order(tmp_path: Path) -> None:
    """`serve --workers 2`: two processes behind one port on one store, as in production."""
    service = ServiceProcess(
        f"sqlite:///{tmp_path / 'workers.db'}", tmp_path, COORDINATOR_WORKERS="2"
    )
    with service:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            created = await http.post("/v1/topics", json={"name": "w", "partitions": 1})
            assert created.status_code == 201

            async def producer(index: int) -> list[tuple[int, str]]:
                pid = (await http.post("/v1/init-pid", json={})).json()["producer_id"]
                acked = []
                for sequence in range(10):
                    value = f"p{index}-{sequence}"
                    answer = await http.post(
                        "/v1/topics/w/partitions/0/records",
                        json={
                            "producer_id": pid,
                            "producer_epoch": 0,
                            "base_sequence": sequence,
                            "records": [{"value": value}],
                        },
                    )
                    assert answer.status_code == 200, answer.text
                    acked.append((answer.json()["base_offset"], value))
                return acked

            acked = [a for result in await asyncio.gather(*map(producer, range(4))) for a in result]
            log = (await http.get("/v1/topics/w/partitions/0/records?max_records=100")).json()
    assert sorted(offset for offset, _ in acked) == list(range(40))
    assert {(r["offset"], r["value"]) for r in log["records"]} == set(acked)
