"""No Kafka request can take the service down (issue 21, item 1): random well-formed requests of
every served API and version, and mutants of them (absurd counts and lengths, flipped bytes,
truncations), sent to `coordinator serve`'s listener on SQLite and on Postgres. The process stays
up with bounded memory, logs no traceback, and answers a well-behaved client afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import httpx
import pytest
from kio.static.constants import EntityType

from coordinator.core import guard
from coordinator.groups.consumer_protocol import parse_subscription
from coordinator.kafka.wire import BadRequest, decode, payload_type
from tests.support.kafka_fuzz import mutate, random_request, served
from tests.support.services import ServiceProcess, free_port, serve_on_fresh_store

pytestmark = pytest.mark.slow

SEED = 21
WELL_FORMED = 2  # per API version
MUTANTS = 6  # per well-formed request
# A request the listener neither answers nor refuses within this is waiting by design (a Fetch's
# long poll, acks=0): the fuzzer moves on.
ANSWER_S = 0.5
# Growth of the service's resident memory the whole run may cause (one 34 GB reservation was
# the failure; a decoder that honours declared lengths shows here).
MAX_GROWTH_BYTES = 150 * 1024 * 1024


def test_the_length_check_ends_where_kio_ends_for_every_served_request() -> None:
    rng = random.Random(SEED)
    for api_key, version in served():
        request_type = payload_type(api_key, version, EntityType.request)
        for _ in range(5):
            frame = random_request(api_key, version, rng)
            assert guard.check(request_type, frame) == len(frame)
            decode(frame)


@pytest.mark.parametrize("length", [2**32 + 1, 2**31])
def test_an_absurd_array_length_is_refused_before_anything_is_allocated(length: int) -> None:
    # Metadata v12, all fields up to its topics array, whose compact count claims `length` - 1.
    count = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        count.append(byte | (0x80 if length else 0))
        if not length:
            break
    frame = struct.pack(">hhih", 3, 12, 1, 1) + b"x" + b"\0" + bytes(count)
    with pytest.raises(BadRequest, match="elements declared"):
        decode(frame)


def test_a_null_array_that_is_not_nullable_is_refused() -> None:
    # LeaveGroup v3: group id "g", then members as a null (-1) array.
    frame = struct.pack(">hhih", 13, 3, 1, 1) + b"x" + struct.pack(">h", 1) + b"g"
    with pytest.raises(BadRequest, match="members: a null"):
        decode(frame + struct.pack(">i", -1))


@pytest.mark.parametrize("version", [0, 1, 3])
def test_a_subscription_declaring_an_absurd_count_is_refused_before_it_is_read(
    version: int,
) -> None:
    # A JoinGroup member's metadata is the client's bytes too, read by kio inside the handler.
    with pytest.raises(guard.Malformed, match="topics: 2147483647 elements declared"):
        parse_subscription(struct.pack(">hi", version, 2**31 - 1))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, int]]:
    port = free_port()
    for running in serve_on_fresh_store(
        request.param,
        tmp_path_factory.mktemp("fuzz"),
        "fuzz",
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
    ):
        yield running, port


def _rss(service: ServiceProcess) -> int:
    assert service.process is not None
    for line in Path(f"/proc/{service.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _send(port: int, frame: bytes) -> None:
    """One request on a connection of its own; waits briefly for an answer or the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(struct.pack(">i", len(frame)) + frame)
        await writer.drain()
        await asyncio.wait_for(reader.read(65536), ANSWER_S)
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _fuzz(port: int) -> int:
    rng = random.Random(SEED)
    frames = []
    for api_key, version in served():
        for _ in range(WELL_FORMED):
            frame = random_request(api_key, version, rng)
            frames.append(frame)
            frames += [mutate(frame, rng) for _ in range(MUTANTS)]
    gate = asyncio.Semaphore(16)

    async def one(frame: bytes) -> None:
        async with gate:
            await _send(port, frame)

    await asyncio.gather(*(one(f) for f in frames))
    return len(frames)


def test_fuzzed_requests_leave_the_service_up_and_serving(
    service: tuple[ServiceProcess, int],
) -> None:
    running, port = service
    before = _rss(running)
    sent = asyncio.run(_fuzz(port))
    assert sent > 1000
    assert running.process is not None and running.process.poll() is None, "the service died"
    assert _rss(running) - before < MAX_GROWTH_BYTES
    # A well-behaved client is answered, through both doors.
    topic = "after-fuzz"
    assert httpx.post(f"{running.url}/v1/topics", json={"name": topic}).status_code == 201
    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    producer.produce(topic, b"still-here")
    assert producer.flush(30) == 0
    fetched = httpx.get(f"{running.url}/v1/topics/{topic}/partitions/0/records?offset=0").json()
    assert [r["value"] for r in fetched["records"]] == ["still-here"]
    log = running.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert " ERROR " not in log and "ERROR:" not in log, log[-3000:]
