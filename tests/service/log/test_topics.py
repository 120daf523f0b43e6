"""Each rule of the HTTP API's Topics section, `/healthz`, and the answers to unknown paths and
methods.

Run on SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.api import assert_problem, batch, create_topic, produce


async def test_create_answers_201_with_name_and_partitions(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/topics", json={"name": "payments", "partitions": 3})
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"name": "payments", "partitions": 3}
    listed = (await client.get("/v1/topics")).json()
    assert listed == {"topics": [{"name": "payments", "partitions": 3}]}


async def test_partitions_default_to_one_when_omitted(client: httpx.AsyncClient) -> None:
    # docs/pages/http-api.md gives no default; the service follows Kafka's `num.partitions` default
    # of 1.
    response = await client.post("/v1/topics", json={"name": "t"})
    assert response.status_code == 201, response.text
    assert response.json() == {"name": "t", "partitions": 1}
    described = (await client.get("/v1/topics/t")).json()
    assert [p["partition"] for p in described["partitions"]] == [0]


@pytest.mark.parametrize(
    "name",
    ["a", "A.b_c-9", "t" * 249, "0", "_", "-", "with.dots"],
)
async def test_every_name_of_the_documented_alphabet_is_accepted(
    client: httpx.AsyncClient, name: str
) -> None:
    response = await client.post("/v1/topics", json={"name": name, "partitions": 1})
    assert response.status_code == 201, response.text
    described = await client.get(f"/v1/topics/{name}")
    assert described.status_code == 200, described.text
    assert described.json()["name"] == name


async def test_duplicate_create_is_409_and_leaves_the_topic_as_it_was(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    await produce(client, "t", 1, batch(["kept"]))
    response = await client.post("/v1/topics", json={"name": "t", "partitions": 5})
    body = assert_problem(response, 409, "TOPIC_ALREADY_EXISTS")
    assert body["retriable"] is False
    assert "t" in body["detail"]
    described = (await client.get("/v1/topics/t")).json()
    assert [(p["partition"], p["high_watermark"]) for p in described["partitions"]] == [
        (0, 0),
        (1, 1),
    ]
    assert (await client.get("/v1/topics")).json() == {"topics": [{"name": "t", "partitions": 2}]}


async def test_names_differing_only_in_case_are_different_topics(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "Orders", partitions=1)
    await create_topic(client, "orders", partitions=2)
    assert (await client.get("/v1/topics/Orders")).json()["partitions"][0]["partition"] == 0
    assert len((await client.get("/v1/topics/orders")).json()["partitions"]) == 2


async def test_concurrent_creates_of_one_name_give_exactly_one_201_and_409_for_the_rest(
    client: httpx.AsyncClient,
) -> None:
    racers = 6
    responses = await asyncio.gather(
        *(
            client.post("/v1/topics", json={"name": "raced", "partitions": n})
            for n in range(1, racers + 1)
        )
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * (racers - 1), [r.text for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert_problem(response, 409, "TOPIC_ALREADY_EXISTS")
    (winner,) = (r.json() for r in responses if r.status_code == 201)
    # The topic is the winner's, whole: no partitions from a loser mixed in.
    described = (await client.get("/v1/topics/raced")).json()
    assert [p["partition"] for p in described["partitions"]] == list(range(winner["partitions"]))
    assert (await client.get("/v1/topics")).json() == {"topics": [winner]}


async def test_concurrent_creates_of_different_names_all_succeed(
    client: httpx.AsyncClient,
) -> None:
    names = [f"topic-{i}" for i in range(8)]
    responses = await asyncio.gather(
        *(client.post("/v1/topics", json={"name": n, "partitions": 2}) for n in names)
    )
    assert [r.status_code for r in responses] == [201] * len(names), [r.text for r in responses]
    listed = (await client.get("/v1/topics")).json()["topics"]
    assert listed == [{"name": n, "partitions": 2} for n in sorted(names)]


async def test_list_is_empty_before_any_topic_exists(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/topics")
    assert response.status_code == 200
    assert response.json() == {"topics": []}


async def test_list_is_sorted_by_name_with_each_partition_count(
    client: httpx.AsyncClient,
) -> None:
    # Mixed case and punctuation: the order must be code-point order on every store, not the
    # database's collation (en_US would put "b" before "C"; SQLite and "C" put "C" first).
    created = {"b": 1, "C": 3, "a-2": 2, "a.1": 4, "_z": 1, "0": 2, "B": 1}
    for name, partitions in created.items():
        await create_topic(client, name, partitions)
    listed = (await client.get("/v1/topics")).json()["topics"]
    assert listed == [{"name": n, "partitions": created[n]} for n in sorted(created)]


async def test_describe_gives_every_partition_with_its_offsets(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=3)
    await produce(client, "t", 0, batch(["a", "b"]))
    await produce(client, "t", 2, batch(["c"]))
    await produce(client, "t", 2, batch(["d", "e", "f"]))
    response = await client.get("/v1/topics/t")
    assert response.status_code == 200, response.text
    # With no transaction open, the LSO is the high watermark.
    assert response.json() == {
        "name": "t",
        "partitions": [
            {"partition": 0, "log_start_offset": 0, "high_watermark": 2, "last_stable_offset": 2},
            {"partition": 1, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0},
            {"partition": 2, "log_start_offset": 0, "high_watermark": 4, "last_stable_offset": 4},
        ],
    }


async def test_high_watermark_is_the_offset_the_next_record_gets(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await produce(client, "t", 0, batch(["a", "b", "c"]))
    hw = (await client.get("/v1/topics/t")).json()["partitions"][0]["high_watermark"]
    appended = await produce(client, "t", 0, batch(["d"]))
    assert appended.json()["base_offset"] == hw


async def test_describe_unknown_topic_is_404_unknown_topic_or_partition(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "known")
    body = assert_problem(await client.get("/v1/topics/unknown"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert body["retriable"] is False
    assert "unknown" in body["detail"]
    # A different case is a different, unknown name.
    assert_problem(await client.get("/v1/topics/KNOWN"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


async def test_healthz_answers_200_status_ok_when_the_store_answers(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/",
        "/v1",
        "/v2/topics",
        "/v1/topic",
        "/V1/topics",
        "/v1/topics/t/partitions",
        "/v1/topics/t/partitions/0",
        "/v1/topics/t/partitions/0/records/extra",
        "/v1/topics//partitions/0/records",
        "/v1/topics/t/partitions//records",
        "/v1/transaction",
        # Not a documented path: a redirect (no body, not a problem document) is not 404.
        "/v1/topics/",
    ],
)
async def test_unknown_path_is_404_not_found_problem(client: httpx.AsyncClient, path: str) -> None:
    await create_topic(client, "t")
    for method in ("GET", "POST"):
        response = await client.request(method, path, json={})
        body = assert_problem(response, 404, "NOT_FOUND")
        assert body["retriable"] is False


WRONG_METHODS = [
    ("DELETE", "/v1/topics"),
    ("PUT", "/v1/topics"),
    ("PATCH", "/v1/topics"),
    ("POST", "/v1/topics/t"),
    ("PUT", "/v1/topics/t"),
    ("GET", "/v1/init-pid"),
    ("PUT", "/v1/init-pid"),
    ("DELETE", "/v1/init-pid"),
    ("DELETE", "/v1/topics/t/partitions/0/records"),
    ("GET", "/v1/topics/t/delete-records"),
    ("PUT", "/v1/topics/t/partitions/0/records"),
    ("PATCH", "/v1/topics/t/partitions/0/records"),
    ("POST", "/healthz"),
    ("DELETE", "/healthz"),
]


@pytest.mark.parametrize(("method", "path"), WRONG_METHODS)
async def test_wrong_method_is_405_method_not_allowed_problem_and_changes_nothing(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    await create_topic(client, "t")
    response = await client.request(method, path, json={"name": "other", "partitions": 1})
    body = assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert body["retriable"] is False
    assert (await client.get("/v1/topics")).json() == {"topics": [{"name": "t", "partitions": 1}]}
    assert (await client.get("/v1/topics/t")).json()["partitions"][0]["high_watermark"] == 0


ALLOWED_METHODS = {
    "/v1/topics": {"GET", "POST"},
    "/v1/topics/t/delete-records": {"POST"},
    "/v1/init-pid": {"POST"},
    "/v1/topics/t/partitions/0/records": {"GET", "POST"},
    "/healthz": {"GET"},
}


@pytest.mark.parametrize(("path", "allowed"), ALLOWED_METHODS.items(), ids=list(ALLOWED_METHODS))
async def test_wrong_method_answer_lists_every_allowed_method(
    client: httpx.AsyncClient, path: str, allowed: set[str]
) -> None:
    # RFC 9110 15.5.6: a 405 carries an Allow header listing the methods the resource supports.
    await create_topic(client, "t")
    response = await client.request("DELETE", path)
    assert response.status_code == 405
    listed = {m.strip() for m in response.headers.get("allow", "").split(",") if m.strip()}
    assert allowed <= listed, response.headers.get("allow")
    assert "DELETE" not in listed
