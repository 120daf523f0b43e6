"""The data path's hot routes (coordinator.log.hot_routes): which requests they take from FastAPI's
route of the same path, and that what they answer, errors and metrics included, is what that
route answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Match

from coordinator.app import create_app
from coordinator.core.settings import Settings
from coordinator.log.hot_routes import HotRoute
from sdk import recordbatch as rb
from tests.support.api import assert_problem, create_topic, fetch_batches, produce_batch
from tests.support.metrics import scrape, value

RECORDS = "/v1/topics/{topic}/partitions/{partition}/records"
BATCH = "application/vnd.kafka.record-batch"


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The app's routes in the order its router tries them (no store is opened)."""
    path: Path = tmp_path_factory.mktemp("hot") / "unused.db"
    return list(create_app(Settings(database_url=f"sqlite:///{path}")).router.routes)


def taker(routes: list[Any], method: str, path: str, query: str = "", **headers: str) -> Any:
    """The route the app's router hands the request to: the first that fully matches it (None:
    no route does, as for a method no route of the path takes)."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
    return None


PRODUCE = "/v1/topics/t/partitions/0/records"


@pytest.mark.parametrize(
    ("path", "query", "content_type"),
    [
        (PRODUCE, "", BATCH),
        (PRODUCE, "", "Application/Vnd.Kafka.Record-Batch; version=2"),
        (PRODUCE, "transactional_id=payments-1", BATCH),
        ("/v1/topics/a.b_c-9/partitions/2147483647/records", "", BATCH),
    ],
)
def test_a_plain_record_batch_produce_takes_the_hot_route(
    routes: list[Any], path: str, query: str, content_type: str
) -> None:
    assert isinstance(taker(routes, "POST", path, query, content_type=content_type), HotRoute)


@pytest.mark.parametrize(
    ("method", "path", "query", "content_type"),
    [
        ("POST", PRODUCE, "", "application/json"),
        ("POST", PRODUCE, "", ""),
        ("POST", "/v1/topics/t/partitions/-1/records", "", BATCH),
        ("POST", "/v1/topics/t/partitions/1.0/records", "", BATCH),
        ("POST", "/v1/topics/t/partitions/2147483648/records", "", BATCH),
        ("POST", "/v1/topics/../partitions/0/records", "", BATCH),
        ("POST", "/v1/topics/a b/partitions/0/records", "", BATCH),
        ("POST", PRODUCE, "transactional_id=", BATCH),
        ("POST", PRODUCE, "transactional_id=a&transactional_id=b", BATCH),
        ("PUT", PRODUCE, "", BATCH),
    ],
)
def test_any_other_produce_is_left_to_fastapis_route(
    routes: list[Any], method: str, path: str, query: str, content_type: str
) -> None:
    headers = {"content_type": content_type} if content_type else {}
    assert not isinstance(taker(routes, method, path, query, **headers), HotRoute)


@pytest.mark.parametrize(
    "query",
    ["", "offset=5", "offset=5&max_bytes=10&isolation_level=read_uncommitted&max_records=7"],
)
def test_a_plain_record_batch_fetch_takes_the_hot_route(routes: list[Any], query: str) -> None:
    assert isinstance(taker(routes, "GET", PRODUCE, query, accept=BATCH), HotRoute)


@pytest.mark.parametrize(
    ("method", "query", "accept"),
    [
        ("GET", "", "application/json"),
        ("GET", "offset=-1", BATCH),
        ("GET", "offset=1.5", BATCH),
        ("GET", "max_bytes=0", BATCH),
        ("GET", "max_records=0", BATCH),
        ("GET", "isolation_level=serializable", BATCH),
        ("GET", "encoding=hex", BATCH),
        ("GET", "offset=1&offset=2", BATCH),
        ("HEAD", "", BATCH),
    ],
)
def test_any_other_fetch_is_left_to_fastapis_route(
    routes: list[Any], method: str, query: str, accept: str
) -> None:
    assert not isinstance(taker(routes, method, PRODUCE, query, accept=accept), HotRoute)


async def test_the_hot_routes_answer_errors_and_metrics_as_the_route_does(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    before = await scrape(client)
    data = rb.build([(0, None, b"v", [])])
    assert (await produce_batch(client, "t", 0, data)).json() == {
        "base_offset": 0,
        "last_offset": 0,
        "duplicate": False,
    }
    assert_problem(
        await produce_batch(client, "missing", 0, data), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert_problem(await produce_batch(client, "t", 0, b"not a batch"), 400, "CORRUPT_MESSAGE")
    fetched = await fetch_batches(client, "t", offset=0, isolation_level="read_uncommitted")
    assert fetched.headers["high-watermark"] == "1"
    assert [
        r.value
        for p, h in rb.iter_batches(fetched.content)
        for r in rb.records(fetched.content, p, h)
    ] == [b"v"]
    # Left to FastAPI's route: its own refusal.
    refused = await client.post(
        "/v1/topics/t/partitions/1.0/records", content=data, headers={"content-type": BATCH}
    )
    assert "partition" in assert_problem(refused, 422, "INVALID_REQUEST")["detail"]
    after = await scrape(client)

    def grew(method: str, code: str) -> float:
        name = "coordinator_requests_total"
        labels = {"method": method, "route": RECORDS, "code": code}
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("POST", "OK") == 1
    assert grew("POST", "UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert grew("POST", "CORRUPT_MESSAGE") == 1
    assert grew("POST", "INVALID_REQUEST") == 1
    assert grew("GET", "OK") == 1
