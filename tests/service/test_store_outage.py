"""A store outage is retriable, not a bug (issue 22, item 5): with Postgres cut off (a TCP proxy
between `coordinator serve` and its store), the HTTP API answers 503 COORDINATOR_NOT_AVAILABLE and
the Kafka listener the retriable code each API uses, keeping the connection; when the store is
back the same connection is served again. One WARNING when the outage begins and one when it
ends, no traceback."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from kio.schema.errors import ErrorCode

from sdk import recordbatch
from tests.support.kafka_socket import DEADLINE_S, KafkaSocket, produce_v9
from tests.support.services import (
    ServiceProcess,
    TcpProxy,
    create_postgres_database,
    drop_postgres_database,
    free_port,
    terminate_backends,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cut_off(tmp_path: Path) -> Iterator[tuple[ServiceProcess, TcpProxy, int]]:
    url = create_postgres_database()
    proxy = TcpProxy("127.0.0.1", 5432).start()
    base, _, rest = url.partition("127.0.0.1:5432")
    kafka_port = free_port()
    service = ServiceProcess(
        f"{base}127.0.0.1:{proxy.port}{rest}",
        tmp_path,
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{kafka_port}",
    )
    try:
        yield service.start(), proxy, kafka_port
    finally:
        service.stop()
        proxy.stop()
        drop_postgres_database(url)
        # Anything left unclosed warns here, in this test, not in whichever test runs next.
        gc.collect()


def _produce(kafka: KafkaSocket, topic: str) -> ErrorCode:
    batch = recordbatch.build([(1, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    return produce_v9(kafka, topic, batch)


def _init_pid(kafka: KafkaSocket) -> ErrorCode:
    answer = kafka.call(
        22,
        4,
        transactional_id="tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    code: ErrorCode = answer.error_code
    return code


def test_a_store_outage_is_answered_retriably_through_both_doors_and_passes(
    cut_off: tuple[ServiceProcess, TcpProxy, int],
) -> None:
    service, proxy, kafka_port = cut_off
    assert httpx.post(f"{service.url}/v1/topics", json={"name": "t"}).status_code == 201
    kafka = KafkaSocket(kafka_port)
    try:
        _through_an_outage(service, proxy, kafka)
    finally:
        kafka.sock.close()
    log = service.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert log.count("the store is unavailable") == 1
    assert log.count("the store answers again") == 1


def _through_an_outage(service: ServiceProcess, proxy: TcpProxy, kafka: KafkaSocket) -> None:
    assert _produce(kafka, "t") == ErrorCode.none

    proxy.cut()
    # Every attempt during the outage: retriable answers on the same connection, several
    # times over (the pool's connections die one by one).
    for _ in range(3):
        response = httpx.post(f"{service.url}/v1/init-pid", json={})
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "COORDINATOR_NOT_AVAILABLE"
        assert response.json()["retriable"] is True
        # Possibly written, as Kafka's leader says it: never "not persisted" (see
        # coordinator/kafka/versions.py for what that costs with librdkafka).
        assert _produce(kafka, "t") == ErrorCode.request_timed_out
        assert _init_pid(kafka) == ErrorCode.coordinator_not_available

    proxy.restore()
    deadline = time.monotonic() + DEADLINE_S
    while _produce(kafka, "t") != ErrorCode.none:  # the same connection, served again
        assert time.monotonic() < deadline, "the service did not recover"
    assert _init_pid(kafka) == ErrorCode.none
    assert httpx.get(f"{service.url}/v1/topics/t").json()["partitions"][0]["high_watermark"] >= 2


def test_connections_the_server_terminates_are_an_outage_not_a_bug(
    cut_off: tuple[ServiceProcess, TcpProxy, int],
) -> None:
    """What a primary going down sends its clients (`pg_terminate_backend`: SQLSTATE 57P01,
    "terminating connection due to administrator command", as a fast shutdown does) meets
    requests of both doors mid-statement: each answer is a success or retriable, never a 500."""
    service, _, kafka_port = cut_off
    assert httpx.post(f"{service.url}/v1/topics", json={"name": "t"}).status_code == 201
    database = service.database_url.rpartition("/")[2]
    kafka = KafkaSocket(kafka_port)
    answers: list[int] = []
    codes: list[ErrorCode] = []
    try:
        with httpx.Client(base_url=service.url, timeout=DEADLINE_S) as client:
            for _ in range(8):
                for _ in range(5):
                    produced = client.post(
                        "/v1/topics/t/partitions/0/records", json={"records": [{"value": "v"}]}
                    )
                    answers.append(produced.status_code)
                    assert produced.status_code in (200, 503), produced.text
                    codes.append(_produce(kafka, "t"))
                terminate_backends(database)
    finally:
        kafka.sock.close()
    assert set(codes) <= {ErrorCode.none, ErrorCode.request_timed_out}
    assert answers.count(200) > len(answers) // 2 and codes.count(ErrorCode.none) > len(codes) // 2

    # Whether a request above met a connection its backend had left depends on when the
    # service read the server's goodbye. One that surely does: an append waiting for the
    # partition's row, which a session of the test's holds until that append's backend ended.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with _row_held(service.database_url, "t"):
            produced = pool.submit(
                httpx.post,
                f"{service.url}/v1/topics/t/partitions/0/records",
                json={"records": [{"value": "v"}]},
                timeout=DEADLINE_S,
            )
            _end_the_lock_waiter(service.database_url)
        assert produced.result().status_code == 503, produced.result().text
    assert "Traceback" not in service.log.read_text(errors="replace")


@contextlib.contextmanager
def _row_held(database_url: str, topic: str) -> Iterator[None]:
    """A session of the test's holding `topic`'s partition rows (FOR UPDATE) for the block, or
    until its backend is ended."""
    locked, release = threading.Event(), threading.Event()

    async def hold() -> None:
        connection = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            async with connection.transaction():
                await connection.execute(
                    "SELECT * FROM partitions WHERE topic = $1 FOR UPDATE", topic
                )
                locked.set()
                await asyncio.to_thread(release.wait)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError):
            pass  # its backend was ended
        finally:
            connection.terminate()

    holder = threading.Thread(target=asyncio.run, args=(hold(),))
    holder.start()
    try:
        assert locked.wait(DEADLINE_S)
        yield
    finally:
        release.set()
        holder.join(DEADLINE_S)


def _end_the_lock_waiter(database_url: str) -> None:
    """Once a session of the database waits for a row lock (the server's view, polled), end
    its backend, and wait until it is gone."""

    async def end() -> bool:
        connection = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            pid = await connection.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if pid is None:
                return False
            await connection.execute("SELECT pg_terminate_backend($1, $2)", pid, 10_000)
            return True
        finally:
            await connection.close()

    deadline = time.monotonic() + DEADLINE_S
    while not asyncio.run(end()):
        assert time.monotonic() < deadline, "no append waited for the partition's row"
        time.sleep(0.01)
