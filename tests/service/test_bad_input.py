"""Bad input of every kind gets a clear 4xx problem document and changes nothing
(docs/pages/http-api.md, Conventions: "No input ever produces a 5xx").

Each case runs against a store holding a topic `t` (two partitions) with one record, written by an
idempotent producer; after the refusal every row of the store (and, on Postgres, every sequence)
is exactly as before, and the producer's next sequence and the next producer id are too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from coordinator.app import create_app
from coordinator.store import Store
from tests.support.api import assert_problem, batch, create_topic, init_pid, produce, read_all
from tests.support.services import Backend, empty_tables, make_settings, store_rows

TOPICS = "/v1/topics"
INIT_PID = "/v1/init-pid"
RECORDS = "/v1/topics/t/partitions/0/records"
BODY_ENDPOINTS = [TOPICS, INIT_PID, RECORDS]

# A body each endpoint accepts; the cases below break one thing in it at a time.
VALID: dict[str, dict[str, Any]] = {
    TOPICS: {"name": "fresh", "partitions": 1},
    INIT_PID: {"transactional_id": None},
    RECORDS: {"records": [{"key": "k", "value": "v"}]},
}
# The producer of the seed record is the first id issued in an empty store; its next sequence is 1,
# so every idempotent case below would be written if the bad field were let through.
SEED_PID = 1
IDEMPOTENT = {"producer_id": SEED_PID, "producer_epoch": 0, "base_sequence": 1}

JSON = {"content-type": "application/json"}


def encode(body: Any) -> bytes:
    """JSON as Python writes it: lone surrogates as `\\ud800` escapes, NaN as a literal."""
    return json.dumps(body).encode()


def records_path(topic: str, partition: str | int = 0) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/records"


# -- the store before, and the proof that a refusal changed nothing ----------------------------


@dataclass
class Before:
    db: Store
    rows: dict[str, list[tuple[Any, ...]]]
    producer_id: int


@pytest.fixture
async def before(app: Any, client: httpx.AsyncClient) -> Before:
    await create_topic(client, "t", partitions=2)
    pid = await init_pid(client)
    assert pid == SEED_PID
    assert (await produce(client, "t", 0, batch(["seed"], pid, 0, 0))).status_code == 200
    return Before(app.state.db, await store_rows(app.state.db), pid)


async def assert_nothing_changed(client: httpx.AsyncClient, before: Before) -> None:
    assert await store_rows(before.db) == before.rows
    # Nor did what the service keeps in memory: the producer's next batch still starts at 1,
    response = await produce(client, "t", 0, batch(["next"], before.producer_id, 0, 1))
    assert response.json() == {"base_offset": 1, "last_offset": 1, "duplicate": False}
    # and producer ids are issued one after another: a refused request must not have used one up.
    assert await init_pid(client) == before.producer_id + 1


def assert_invalid(
    response: httpx.Response, *fields: str, statuses: tuple[int, ...] = (400, 422)
) -> dict[str, Any]:
    """A 4xx INVALID_REQUEST problem document whose detail names one of `fields`."""
    request = f"{response.request.method} {str(response.request.url)[:120]}"
    assert response.status_code in statuses, (request, response.text)
    body = assert_problem(response, response.status_code, "INVALID_REQUEST")
    assert body["retriable"] is False
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert any(field in body["detail"] for field in fields), (request, fields, body["detail"])
    return body


# -- bodies that are not a JSON object ----------------------------------------------------------

NOT_AN_OBJECT = [
    pytest.param(b'{"name": "a",', id="malformed"),
    pytest.param(b'{"records": [{"value": "a"', id="truncated"),
    pytest.param(b"{'name': 'a'}", id="single-quoted"),
    pytest.param(b'{"name": "a"} trailing', id="trailing-garbage"),
    pytest.param(b"[]", id="array"),
    pytest.param(b'[{"name": "a"}]', id="array-of-object"),
    pytest.param(b'"text"', id="string"),
    pytest.param(b"42", id="number"),
    pytest.param(b"null", id="null"),
    pytest.param(b"true", id="boolean"),
    pytest.param(b"", id="empty"),
    pytest.param(b"   ", id="whitespace"),
    pytest.param(b"\xff\xfe\x00{", id="not-utf8"),
    pytest.param(b'{"name": "a\xff"}', id="invalid-utf8-in-string"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-100000-deep"),
    pytest.param(b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="nested-field"),
]


@pytest.mark.parametrize("content", NOT_AN_OBJECT)
async def test_body_that_is_not_a_json_object_is_invalid_request(
    client: httpx.AsyncClient, before: Before, content: bytes
) -> None:
    for path in BODY_ENDPOINTS:
        response = await client.post(path, content=content, headers=JSON)
        assert_invalid(response, "body")
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",  # what `curl -d` sends
        "application/xml",
        "multipart/form-data; boundary=x",
    ],
)
async def test_json_sent_under_another_content_type_is_refused(
    client: httpx.AsyncClient, before: Before, content_type: str
) -> None:
    for path in BODY_ENDPOINTS:
        response = await client.post(
            path, content=encode(VALID[path]), headers={"content-type": content_type}
        )
        # 415 Unsupported Media Type would be the most precise; 400 and 422 are documented.
        assert_invalid(response, "body", "content-type", "Content-Type", statuses=(400, 415, 422))
    await assert_nothing_changed(client, before)


# A body with one number field, written by hand so the literal goes out exactly as given.
NUMBER_FIELD = {
    TOPICS: ("partitions", b'{"name": "fresh", "partitions": %s}'),
    INIT_PID: ("transaction_timeout_ms", b'{"transaction_timeout_ms": %s}'),
    RECORDS: (
        "producer_id",
        b'{"producer_id": %s, "producer_epoch": 0, "base_sequence": 1, '
        b'"records": [{"value": "v"}]}',
    ),
}


@pytest.mark.parametrize(
    "literal",
    [b"1" * 5000, b"-" + b"9" * 5000, b"1e999999", b"NaN", b"Infinity", b"-Infinity"],
    ids=["5000-digits", "minus-5000-digits", "1e999999", "NaN", "Infinity", "-Infinity"],
)
async def test_number_literal_no_field_can_hold_is_invalid_request(
    client: httpx.AsyncClient, before: Before, literal: bytes
) -> None:
    for path, (field, template) in NUMBER_FIELD.items():
        response = await client.post(path, content=template % literal, headers=JSON)
        # A parser may refuse the literal itself (then the body is the problem) or hand it on.
        assert_invalid(response, field, "body")
    await assert_nothing_changed(client, before)


# -- one bad field in an otherwise valid body ---------------------------------------------------


def case(path: str, change: dict[str, Any], field: str, case_id: str) -> Any:
    return pytest.param(path, {**VALID[path], **change}, field, id=case_id)


def without(path: str, key: str) -> dict[str, Any]:
    return {k: v for k, v in VALID[path].items() if k != key}


def one_record(**record: Any) -> dict[str, Any]:
    return {"records": [record]}


BAD_FIELDS = [
    # POST /v1/topics
    pytest.param(TOPICS, {"partitions": 1}, "name", id="topics-name-missing"),
    case(TOPICS, {"name": None}, "name", "topics-name-null"),
    case(TOPICS, {"name": 5}, "name", "topics-name-int"),
    case(TOPICS, {"name": {"a": "b"}}, "name", "topics-name-object"),
    case(TOPICS, {"name": ["t"]}, "name", "topics-name-array"),
    case(TOPICS, {"name": ""}, "name", "topics-name-empty"),
    case(TOPICS, {"name": "a b"}, "name", "topics-name-space"),
    case(TOPICS, {"name": "a/b"}, "name", "topics-name-slash"),
    case(TOPICS, {"name": "zürich"}, "name", "topics-name-unicode"),
    case(TOPICS, {"name": "t" * 250}, "name", "topics-name-250-chars"),
    case(TOPICS, {"name": "a\n"}, "name", "topics-name-trailing-newline"),
    case(TOPICS, {"name": "a\u0000"}, "name", "topics-name-nul"),
    case(TOPICS, {"name": "\ud800"}, "name", "topics-name-lone-surrogate"),
    case(TOPICS, {"partitions": "1"}, "partitions", "topics-partitions-string"),
    case(TOPICS, {"partitions": 1.0}, "partitions", "topics-partitions-float"),
    case(TOPICS, {"partitions": True}, "partitions", "topics-partitions-true"),
    case(TOPICS, {"partitions": None}, "partitions", "topics-partitions-null"),
    case(TOPICS, {"partitions": 0}, "partitions", "topics-partitions-0"),
    case(TOPICS, {"partitions": -1}, "partitions", "topics-partitions-negative"),
    case(TOPICS, {"partitions": 10**9}, "partitions", "topics-partitions-a-billion"),
    case(TOPICS, {"partitions": 2**63}, "partitions", "topics-partitions-2**63"),
    case(TOPICS, {"bogus": 1}, "bogus", "topics-unknown-field"),
    case(TOPICS, {"Name": "x"}, "Name", "topics-unknown-field-case"),
    # POST /v1/init-pid
    case(INIT_PID, {"transactional_id": 5}, "transactional_id", "pid-tid-int"),
    case(INIT_PID, {"transactional_id": True}, "transactional_id", "pid-tid-true"),
    case(INIT_PID, {"transactional_id": {}}, "transactional_id", "pid-tid-object"),
    case(INIT_PID, {"transactional_id": ""}, "transactional_id", "pid-tid-empty"),
    case(INIT_PID, {"transactional_id": "x" * 256}, "transactional_id", "pid-tid-256-chars"),
    case(INIT_PID, {"transactional_id": "a\u0000b"}, "transactional_id", "pid-tid-nul"),
    case(INIT_PID, {"transactional_id": "a\nb"}, "transactional_id", "pid-tid-newline"),
    case(INIT_PID, {"transactional_id": "\t"}, "transactional_id", "pid-tid-tab"),
    case(INIT_PID, {"transactional_id": "\x1b[31m"}, "transactional_id", "pid-tid-escape"),
    case(INIT_PID, {"transactional_id": "a\x7f"}, "transactional_id", "pid-tid-del"),
    case(INIT_PID, {"transactional_id": "\ud800"}, "transactional_id", "pid-tid-surrogate"),
    case(INIT_PID, {"transaction_timeout_ms": "1000"}, "transaction_timeout_ms", "pid-to-str"),
    case(INIT_PID, {"transaction_timeout_ms": 1000.0}, "transaction_timeout_ms", "pid-to-float"),
    case(INIT_PID, {"transaction_timeout_ms": True}, "transaction_timeout_ms", "pid-to-true"),
    case(INIT_PID, {"transaction_timeout_ms": None}, "transaction_timeout_ms", "pid-to-null"),
    case(INIT_PID, {"keep_prepared": "true"}, "keep_prepared", "pid-keep-string"),
    case(INIT_PID, {"keep_prepared": 1}, "keep_prepared", "pid-keep-int"),
    case(INIT_PID, {"keep_prepared": None}, "keep_prepared", "pid-keep-null"),
    case(INIT_PID, {"bogus": 1}, "bogus", "pid-unknown-field"),
    case(INIT_PID, {"transactionalId": "x"}, "transactionalId", "pid-unknown-camel-case"),
    # POST /v1/topics/{t}/partitions/{p}/records: producer fields
    case(RECORDS, {**IDEMPOTENT, "producer_id": "1"}, "producer_id", "rec-pid-string"),
    case(RECORDS, {**IDEMPOTENT, "producer_id": 1.0}, "producer_id", "rec-pid-float"),
    case(RECORDS, {**IDEMPOTENT, "producer_id": True}, "producer_id", "rec-pid-true"),
    case(RECORDS, {**IDEMPOTENT, "producer_id": None}, "producer_id", "rec-pid-null"),
    case(RECORDS, {**IDEMPOTENT, "producer_id": 2**63}, "producer_id", "rec-pid-2**63"),
    case(RECORDS, {**IDEMPOTENT, "producer_id": -2}, "producer_id", "rec-pid-minus-2"),
    case(RECORDS, {**IDEMPOTENT, "producer_epoch": 32767}, "producer_epoch", "rec-epoch-32767"),
    case(RECORDS, {**IDEMPOTENT, "producer_epoch": -2}, "producer_epoch", "rec-epoch-minus-2"),
    case(RECORDS, {**IDEMPOTENT, "producer_epoch": 2**16}, "producer_epoch", "rec-epoch-2**16"),
    case(RECORDS, {**IDEMPOTENT, "producer_epoch": "0"}, "producer_epoch", "rec-epoch-string"),
    case(RECORDS, {**IDEMPOTENT, "producer_epoch": 0.0}, "producer_epoch", "rec-epoch-float"),
    case(RECORDS, {**IDEMPOTENT, "base_sequence": 2**31}, "base_sequence", "rec-seq-2**31"),
    case(RECORDS, {**IDEMPOTENT, "base_sequence": -2}, "base_sequence", "rec-seq-minus-2"),
    case(RECORDS, {**IDEMPOTENT, "base_sequence": 1.5}, "base_sequence", "rec-seq-float"),
    case(RECORDS, {**IDEMPOTENT, "base_sequence": False}, "base_sequence", "rec-seq-false"),
    case(RECORDS, {"producer_id": SEED_PID}, "producer_epoch", "rec-pid-without-epoch"),
    case(RECORDS, {"producer_epoch": 0, "base_sequence": 1}, "producer_epoch", "rec-epoch-no-pid"),
    case(RECORDS, {"transactional_id": "tx"}, "producer_id", "rec-tid-without-pid"),
    case(RECORDS, {**IDEMPOTENT, "transactional_id": ""}, "transactional_id", "rec-tid-empty"),
    case(RECORDS, {**IDEMPOTENT, "transactional_id": "x" * 256}, "transactional_id", "rec-tid-256"),
    case(RECORDS, {**IDEMPOTENT, "transactional_id": "a\u0000"}, "transactional_id", "rec-tid-nul"),
    case(RECORDS, {**IDEMPOTENT, "transactional_id": "\x01"}, "transactional_id", "rec-tid-ctrl"),
    case(RECORDS, {**IDEMPOTENT, "transactional_id": 7}, "transactional_id", "rec-tid-int"),
    # ... the batch and its encoding
    pytest.param(RECORDS, {**IDEMPOTENT}, "records", id="rec-records-missing"),
    case(RECORDS, {**IDEMPOTENT, "records": []}, "records", "rec-records-empty"),
    case(RECORDS, {"records": None}, "records", "rec-records-null"),
    case(RECORDS, {"records": {"value": "a"}}, "records", "rec-records-object"),
    case(RECORDS, {"records": "a"}, "records", "rec-records-string"),
    case(RECORDS, {"records": [None]}, "records.0", "rec-record-null"),
    case(RECORDS, {"records": ["a"]}, "records.0", "rec-record-string"),
    case(RECORDS, {"records": [{"value": "a"}, []]}, "records.1", "rec-second-record-array"),
    case(RECORDS, {"encoding": "hex"}, "encoding", "rec-encoding-unknown"),
    case(RECORDS, {"encoding": "UTF-8"}, "encoding", "rec-encoding-spelling"),
    case(RECORDS, {"encoding": None}, "encoding", "rec-encoding-null"),
    case(RECORDS, {"encoding": 64}, "encoding", "rec-encoding-int"),
    case(RECORDS, {"acks": "all"}, "acks", "rec-unknown-field"),
    # ... each record
    case(RECORDS, one_record(value=1), "records.0.value", "rec-value-int"),
    case(RECORDS, one_record(value=True), "records.0.value", "rec-value-true"),
    case(RECORDS, one_record(value={"a": "b"}), "records.0.value", "rec-value-object"),
    case(RECORDS, one_record(value=["a"]), "records.0.value", "rec-value-array"),
    case(RECORDS, one_record(key=5), "records.0.key", "rec-key-int"),
    case(RECORDS, one_record(key={"a": "b"}), "records.0.key", "rec-key-object"),
    case(RECORDS, one_record(value="a", bogus=1), "records.0.bogus", "rec-record-unknown-field"),
    case(RECORDS, one_record(value="a", headers=None), "records.0.headers", "rec-headers-null"),
    case(RECORDS, one_record(value="a", headers=["h"]), "records.0.headers", "rec-headers-array"),
    case(RECORDS, one_record(value="a", headers={"h": 1}), "records.0.headers", "rec-header-int"),
    case(RECORDS, one_record(value="a", headers={"h": None}), "records.0.headers", "rec-hdr-null"),
    case(RECORDS, one_record(value="a", headers={"h": ["x"]}), "records.0.headers", "rec-hdr-arr"),
    case(RECORDS, one_record(value="a", headers={"h": {}}), "records.0.headers", "rec-hdr-object"),
    # ... lone UTF-16 surrogates: text that no byte sequence encodes
    case(RECORDS, one_record(value="\ud800"), "records.0.value", "rec-value-surrogate"),
    case(RECORDS, one_record(key="x\udc00"), "records.0.key", "rec-key-surrogate"),
    case(
        RECORDS,
        {"records": [{"value": "ok"}, {"value": "\udfff"}]},
        "records.1.value",
        "rec-second-value-surrogate",
    ),
    case(
        RECORDS,
        one_record(value="a", headers={"h": "\ud800"}),
        "records.0.headers",
        "rec-header-value-surrogate",
    ),
    case(
        RECORDS,
        one_record(value="a", headers={"\ud800": "v"}),
        "records.0.headers",
        "rec-header-name-surrogate",
    ),
    # ... invalid base64
    case(RECORDS, {"encoding": "base64", **one_record(value="!!!")}, "records.0.value", "b64-bad"),
    case(RECORDS, {"encoding": "base64", **one_record(value="YQ")}, "records.0.value", "b64-pad"),
    case(
        RECORDS, {"encoding": "base64", **one_record(value="é")}, "records.0.value", "b64-non-ascii"
    ),
    case(RECORDS, {"encoding": "base64", **one_record(key="@")}, "records.0.key", "b64-key"),
    case(
        RECORDS,
        {"encoding": "base64", "records": [{"value": "YQ=="}, {"value": "Y Q=="}]},
        "records.1.value",
        "b64-second-record",
    ),
    case(
        RECORDS,
        {"encoding": "base64", **one_record(value="YQ==", headers={"h": "@@"})},
        "records.0.headers",
        "b64-header",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_FIELDS)
async def test_bad_field_is_invalid_request_naming_it(
    client: httpx.AsyncClient, before: Before, path: str, body: dict[str, Any], field: str
) -> None:
    response = await client.post(path, content=encode(body), headers=JSON)
    assert_invalid(response, field)
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize("timeout_ms", [900_001, 2**31, 2**63 - 1])
async def test_transaction_timeout_above_the_maximum_is_invalid_transaction_timeout(
    client: httpx.AsyncClient, before: Before, timeout_ms: int
) -> None:
    response = await client.post(INIT_PID, json={"transaction_timeout_ms": timeout_ms})
    body = assert_problem(response, 400, "INVALID_TRANSACTION_TIMEOUT")
    assert "transaction_timeout_ms" in body["detail"]
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize("timeout_ms", [0, -1, -(2**63), 2**64, 2**70])
async def test_transaction_timeout_no_producer_could_use_is_refused(
    client: httpx.AsyncClient, before: Before, timeout_ms: int
) -> None:
    # Not positive, or past any 64-bit integer: either code says what is wrong.
    response = await client.post(INIT_PID, json={"transaction_timeout_ms": timeout_ms})
    assert response.status_code in (400, 422), response.text
    body = assert_problem(response, response.status_code, response.json()["code"])
    assert body["code"] in ("INVALID_TRANSACTION_TIMEOUT", "INVALID_REQUEST")
    assert "transaction_timeout_ms" in body["detail"]
    await assert_nothing_changed(client, before)


async def test_transactional_produce_for_an_unknown_transactional_id_writes_nothing(
    client: httpx.AsyncClient, before: Before
) -> None:
    # docs/pages/http-api.md, Transactions: the checks of a transactional produce start with the
    # transactional id; one never initialised is 404 TRANSACTIONAL_ID_NOT_FOUND, and nothing is
    # written.
    body = {**VALID[RECORDS], **IDEMPOTENT, "transactional_id": "never-initialised"}
    response = await client.post(RECORDS, content=encode(body), headers=JSON)
    assert_problem(response, 404, "TRANSACTIONAL_ID_NOT_FOUND")
    await assert_nothing_changed(client, before)


# -- paths and query strings --------------------------------------------------------------------

LONG = "a" * 60_000  # near the longest URL a client sends

BAD_NAMES = [
    pytest.param("a%20b", id="space"),
    pytest.param("zu%CC%88rich", id="unicode"),
    pytest.param("%C3%A9", id="unicode-e-acute"),
    pytest.param("t" * 250, id="250-chars"),
    pytest.param(LONG, id="60000-chars"),
    pytest.param("%00", id="nul"),
    pytest.param("t%00", id="trailing-nul"),
    pytest.param("%0A", id="newline"),
    pytest.param("%ED%A0%80", id="utf8-encoded-surrogate"),
    pytest.param("%FF", id="not-utf8"),
    pytest.param("t%3Bdrop", id="semicolon"),
    pytest.param("%27%20OR%20%271%27%3D%271", id="sql-quote"),
]


@pytest.mark.parametrize("segment", BAD_NAMES)
async def test_bad_topic_name_in_the_path_is_invalid_request_naming_topic(
    client: httpx.AsyncClient, before: Before, segment: str
) -> None:
    for method, url in [
        ("GET", f"/v1/topics/{segment}"),
        ("GET", records_path(segment)),
        ("POST", records_path(segment)),
    ]:
        response = await client.request(method, url, json=VALID[RECORDS])
        assert_invalid(response, "topic")
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize(
    "segment",
    [
        pytest.param("a%2Fb", id="encoded-slash"),
        pytest.param("..%2F..%2Fhealthz", id="encoded-dot-dot-slash"),
        pytest.param("..%2F..%2Fv1%2Finit-pid", id="encoded-traversal-to-init-pid"),
        pytest.param("%2F", id="only-slash"),
        pytest.param("%5C..%5C", id="backslashes"),
        pytest.param("", id="empty"),
    ],
)
async def test_hostile_topic_segment_is_refused_and_reaches_no_other_route(
    client: httpx.AsyncClient, before: Before, segment: str
) -> None:
    for method in ("GET", "POST"):
        response = await client.request(method, records_path(segment), json=VALID[RECORDS])
        # Decoded, the path may name no route at all (404 NOT_FOUND) or a topic with a bad name.
        assert 400 <= response.status_code < 500, response.text
        code = response.json().get("code")
        assert code in ("NOT_FOUND", "INVALID_REQUEST"), response.text
        assert_problem(response, response.status_code, code)
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize(
    "partition",
    ["-1", str(2**31), str(2**40), str(2**70), "abc", "0x1", "1e3", "%00", "%EF%BC%91", "NaN"],
)
async def test_bad_partition_in_the_path_is_invalid_request_naming_partition(
    client: httpx.AsyncClient, before: Before, partition: str
) -> None:
    for method in ("GET", "POST"):
        response = await client.request(method, records_path("t", partition), json=VALID[RECORDS])
        assert_invalid(response, "partition")
    await assert_nothing_changed(client, before)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=-1", "offset"),
        (f"offset={2**63}", "offset"),
        (f"offset={2**70}", "offset"),
        ("offset=abc", "offset"),
        ("offset=", "offset"),
        ("offset=1.5", "offset"),
        ("offset=%00", "offset"),
        ("max_records=0", "max_records"),
        ("max_records=-1", "max_records"),
        ("max_records=10001", "max_records"),
        (f"max_records={2**70}", "max_records"),
        ("max_records=ten", "max_records"),
        ("isolation_level=serializable", "isolation_level"),
        ("isolation_level=READ_COMMITTED", "isolation_level"),
        ("isolation_level=", "isolation_level"),
        ("encoding=hex", "encoding"),
        ("encoding=base32", "encoding"),
        ("encoding=%00", "encoding"),
    ],
)
async def test_bad_fetch_parameter_is_invalid_request_naming_it(
    client: httpx.AsyncClient, before: Before, query: str, field: str
) -> None:
    response = await client.get(f"{RECORDS}?{query}")
    assert_invalid(response, field)
    await assert_nothing_changed(client, before)


# -- size limits --------------------------------------------------------------------------------


class TestWithSmallBodyLimit:
    @pytest.fixture
    def settings_overrides(self) -> dict[str, Any]:
        return {"max_request_bytes": 4096}

    @pytest.mark.parametrize(
        ("path", "body", "code"),
        [
            (INIT_PID, {"transactional_id": "x" * 5000}, "INVALID_REQUEST"),
            (TOPICS, {"name": "t" * 5000}, "INVALID_REQUEST"),
            (RECORDS, {"records": [{"value": "x" * 5000}]}, "RECORD_LIST_TOO_LARGE"),
        ],
        ids=["init-pid", "topics", "produce"],
    )
    @pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
    async def test_body_over_the_limit_is_413_and_changes_nothing(
        self,
        client: httpx.AsyncClient,
        before: Before,
        path: str,
        body: dict[str, Any],
        code: str,
        chunked: bool,
    ) -> None:
        content = encode(body)

        async def in_chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(content), 1000):
                yield content[start : start + 1000]

        response = await client.post(
            path, content=in_chunks() if chunked else content, headers=JSON
        )
        assert_problem(response, 413, code)
        await assert_nothing_changed(client, before)


# -- fuzzing: random input never gets a 5xx ------------------------------------------------------

# Text of any code point, with the troublesome ones (lone surrogates, NUL, controls) made common.
any_text = st.text(
    st.characters(exclude_categories=())
    | st.sampled_from(["\ud800", "\udfff", "\u0000", "\n", "\x7f", "\u200b", "é", "\U0001f600"]),
    max_size=12,
)
edge_ints = st.sampled_from(
    [-(2**63) - 1, -(2**63), -2, -1, 0, 1, 32766, 32767, 2**31 - 1, 2**31, 2**63 - 1, 2**63]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | edge_ints
    | st.floats()
    | any_text
    | st.sampled_from(["utf8", "base64", "t", "YQ==", "", "\u0000"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=12,
)


Loosen = Callable[[st.SearchStrategy[Any]], st.SearchStrategy[Any]]


def exact(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return strategy


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, picked in proportion to its weight (`one_of` picks evenly)."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(pool) - 1).flatmap(lambda i: pool[i])


def loose(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the plausible value, sometimes any JSON value at all."""
    return weighted((5, strategy), (1, json_values))


def shaped(path: str, field: Loosen) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the endpoint's own fields. With `exact`, every value has the right type (so
    the request gets past validation into the service); with `loose`, some have any type."""
    text_or_null = weighted((3, any_text), (1, st.none()))
    if path == TOPICS:
        return st.fixed_dictionaries(
            {"name": field(st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True) | any_text)},
            optional={"partitions": field(st.integers(-2, 12) | edge_ints)},
        )
    if path == INIT_PID:
        return st.fixed_dictionaries(
            {},
            optional={
                "transactional_id": field(st.none() | any_text),
                "transaction_timeout_ms": field(st.integers(-10, 1_000_000) | edge_ints),
                "keep_prepared": field(st.booleans()),
            },
        )
    record = st.fixed_dictionaries(
        {},
        optional={
            "key": field(text_or_null),
            "value": field(text_or_null),
            "headers": field(st.dictionaries(any_text, field(any_text), max_size=2)),
        },
    )
    # Producer fields that agree with each other (so the batch reaches its records), or not.
    producer = st.one_of(
        st.just({}),
        st.fixed_dictionaries(
            {"producer_id": st.just(SEED_PID), "producer_epoch": st.just(0)},
            optional={"base_sequence": st.integers(-1, 3) | edge_ints},
        ),
        st.fixed_dictionaries(
            {},
            optional={
                "producer_id": field(st.sampled_from([-1, SEED_PID]) | edge_ints),
                "producer_epoch": field(st.integers(-2, 2) | edge_ints),
                "base_sequence": field(st.integers(-2, 4) | edge_ints),
                "transactional_id": field(st.none() | any_text),
            },
        ),
    )
    batch_fields = st.fixed_dictionaries(
        {"records": field(st.lists(field(record), min_size=1, max_size=3))},
        optional={"encoding": field(st.sampled_from(["utf8", "base64"]))},
    )
    return st.tuples(producer, batch_fields).map(lambda parts: {**parts[0], **parts[1]})


def bodies(path: str) -> st.SearchStrategy[bytes]:
    """Objects shaped like the endpoint's body, exactly or loosely, with an unknown field now and
    then; also any JSON value, any text, any bytes."""
    unknown_field = st.dictionaries(any_text, json_values, min_size=1, max_size=1)
    extra = weighted((3, st.just({})), (1, unknown_field))
    objects = st.one_of(shaped(path, exact), shaped(path, loose))
    with_extra = st.tuples(objects, extra).map(lambda parts: {**parts[0], **parts[1]})
    return weighted(
        (8, with_extra.map(encode)),
        (1, json_values.map(encode)),
        (1, any_text.map(lambda s: s.encode("utf-8", "surrogatepass"))),
        (1, st.binary(max_size=40)),
    )


def assert_answer_is_not_a_failure(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if not response.is_success:
        body = assert_problem(response, response.status_code, response.json()["code"])
        assert isinstance(body["title"], str)


def run_fuzz(store: Backend, check: Callable[[asyncio.Runner, httpx.AsyncClient], None]) -> None:
    """Runs `check` against a fresh app over `store`, with topic `t` and producer id 1 in it.

    The app is built here, in one event loop for every example, rather than taken from the
    function-scoped fixtures, which hypothesis would share between examples.
    """
    with asyncio.Runner() as runner:
        app = create_app(make_settings(store))
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://coordinator")

        async def setup() -> None:
            await empty_tables(app.state.db)
            await create_topic(client, "t", partitions=2)
            assert await init_pid(client) == SEED_PID

        try:
            runner.run(setup())
            check(runner, client)
            # Whatever was accepted can be read back.
            runner.run(read_all(client, "t", 0, encoding="base64"))
        finally:
            runner.run(client.aclose())
            runner.run(app.state.db.dispose())


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
def test_random_bodies_never_get_a_5xx(store: Backend, path: str) -> None:
    def check(runner: asyncio.Runner, client: httpx.AsyncClient) -> None:
        @settings(max_examples=100, deadline=None)
        @given(content=bodies(path))
        def post(content: bytes) -> None:
            note(f"POST {path} {content!r}")
            response = runner.run(client.post(path, content=content, headers=JSON))
            assert_answer_is_not_a_failure(response)

        post()

    run_fuzz(store, check)


def test_random_fetch_urls_never_get_a_5xx(store: Backend) -> None:
    segment = st.sampled_from(["t", "0", "1", "-1", str(2**63)]) | any_text
    params = st.dictionaries(
        st.sampled_from(["offset", "max_records", "isolation_level", "encoding"]) | any_text,
        st.sampled_from(["0", "1", "-1", "10000", "read_committed", "base64", str(2**64)])
        | any_text,
        max_size=4,
    )

    def check(runner: asyncio.Runner, client: httpx.AsyncClient) -> None:
        runner.run(produce(client, "t", 0, batch(["a", "b"])))

        @settings(max_examples=100, deadline=None)
        @given(topic=segment, partition=segment, query=params)
        def get(topic: str, partition: str, query: dict[str, str]) -> None:
            def q(text: str) -> str:
                return quote(text.encode("utf-8", "surrogatepass"), safe="")

            query_string = "&".join(f"{q(k)}={q(v)}" for k, v in query.items())
            url = f"/v1/topics/{q(topic)}/partitions/{q(partition)}/records?{query_string}"
            note(f"GET {url}")
            assert_answer_is_not_a_failure(runner.run(client.get(url)))

        get()

    run_fuzz(store, check)


# -- text the stores could not keep, or would keep as another id --------------------------------


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1/transactions/tx%FF", id="transactional-id"),
        pytest.param("/v1/groups/g%FE", id="group-id"),
        pytest.param("/v1/effects/k%C3", id="effect-key"),
        pytest.param("/v1/groups?state=%FF", id="query"),
    ],
)
async def test_ids_whose_escapes_are_not_utf8_are_refused_not_repaired(
    client: httpx.AsyncClient, before: Before, path: str
) -> None:
    # Decoded leniently, "tx%FF" and "tx%FE" would both be "tx\ufffd": one id for two.
    response = await client.get(path)
    assert_invalid(response, "not UTF-8", statuses=(400,))
    await assert_nothing_changed(client, before)


async def test_a_nul_in_stored_text_is_invalid_request_on_both_stores(
    client: httpx.AsyncClient, before: Before
) -> None:
    # A member's client id is text the store keeps: Postgres cannot hold a NUL, so neither
    # store takes one (SQLite would keep it silently).
    heartbeat = {"member_id": "m", "member_epoch": 0, "subscribed_topics": ["t"]}
    response = await client.post(
        "/v1/groups/g-1/heartbeat", json={**heartbeat, "client_id": "a\0b"}
    )
    assert_invalid(response, "NUL", statuses=(400,))
    assert (await client.get("/v1/groups/g-1")).status_code == 404
    await assert_nothing_changed(client, before)


async def test_offset_metadata_may_hold_any_text_a_nul_included(
    client: httpx.AsyncClient, before: Before
) -> None:
    # Kafka's offset metadata is any string: kept as its bytes, given back as it came.
    offsets = {"offsets": [{"topic": "t", "partition": 0, "offset": 1, "metadata": "a\0b\\0"}]}
    assert (await client.post("/v1/groups/g-1/offsets", json=offsets)).status_code == 200
    (stored,) = (await client.get("/v1/groups/g-1/offsets")).json()["offsets"]
    assert stored == {"topic": "t", "partition": 0, "offset": 1, "metadata": "a\0b\\0"}


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate", "chunked, gzip"])
async def test_a_transfer_coding_other_than_chunked_is_501(
    client: httpx.AsyncClient, before: Before, coding: str
) -> None:
    response = await client.post(
        TOPICS,
        content=encode(VALID[TOPICS]),
        headers={**JSON, "transfer-encoding": coding},
    )
    assert response.status_code == 501, response.text
    assert_problem(response, 501, "INVALID_REQUEST")
    await assert_nothing_changed(client, before)
