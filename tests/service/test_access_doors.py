"""One table of who may do what, walked through both doors (issue 21, item 4): every operation that
names a topic, a group or a transactional id, with the principals that pass, asked over HTTP and
over Kafka's protocol (SASL/PLAIN with the same tokens). A door that lets a principal through where
the table says no, or refuses one it lets through, fails its row. On SQLite and on Postgres."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from coordinator.groups.consumer_protocol import encode_subscription
from coordinator.kafka.server import KafkaListener
from sdk import recordbatch
from tests.support.auth_tokens import TOKENS  # the same principals as the HTTP matrix
from tests.support.kafka_wire import Connection, fetch_request
from tests.support.services import free_port

PRINCIPALS = ("producer", "consumer", "nothing")
REFUSED_HTTP = {
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
}
REFUSED_KAFKA = {
    ErrorCode.transactional_id_authorization_failed,
    ErrorCode.topic_authorization_failed,
    ErrorCode.group_authorization_failed,
    ErrorCode.cluster_authorization_failed,
}


@dataclass
class World:
    """What the operations name: topics `payments` (the principals' prefix) and `other`, and
    transactional ids `a-1` (the producer's prefix) and `b-1` with their producer ids."""

    ids: dict[str, int]


KafkaCall = Callable[[Connection, World], Awaitable[ErrorCode]]
HttpCall = Callable[[World], tuple[str, str, dict[str, Any] | None]]


@dataclass(frozen=True)
class Operation:
    name: str
    allowed: frozenset[str]  # of PRINCIPALS; the admin passes everything
    http: HttpCall | None  # (method, path, body), or None where HTTP has no such call
    kafka: KafkaCall | None  # the error code of the item named, or None where Kafka has none


def _module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.request)


def _batch() -> bytes:
    return recordbatch.build([(0, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)


def produce(topic: str, transactional_id: str | None = None) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(0, 9)
        answer = await c.call(
            0,
            9,
            transactional_id=transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                m.TopicProduceData(
                    name=topic, partition_data=(m.PartitionProduceData(index=0, records=_batch()),)
                ),
            ),
        )
        code: ErrorCode = answer.responses[0].partition_responses[0].error_code
        return code

    return call


def fetch(topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.request(fetch_request(topic, isolation_level=1))
        code: ErrorCode = answer.responses[0].partitions[0].error_code
        return code

    return call


def list_offsets(topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(2, 7)
        answer = await c.call(
            2,
            7,
            replica_id=-1,
            isolation_level=1,
            topics=(
                m.ListOffsetsTopic(
                    name=topic,
                    partitions=(
                        m.ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=-1, timestamp=-1
                        ),
                    ),
                ),
            ),
        )
        code: ErrorCode = answer.topics[0].partitions[0].error_code
        return code

    return call


def init_pid(transactional_id: str | None) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.call(
            22,
            4,
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=10),
            producer_id=-1,
            producer_epoch=-1,
        )
        code: ErrorCode = answer.error_code
        return code

    return call


def add_partitions(transactional_id: str, topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(24, 3)
        answer = await c.call(
            24,
            3,
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=w.ids[transactional_id],
            v3_and_below_producer_epoch=0,
            v3_and_below_topics=(m.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),),
        )
        code: ErrorCode = (
            answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
        )
        return code

    return call


def add_offsets(transactional_id: str, group: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.call(
            25,
            3,
            transactional_id=transactional_id,
            producer_id=w.ids[transactional_id],
            producer_epoch=0,
            group_id=group,
        )
        code: ErrorCode = answer.error_code
        return code

    return call


def txn_offset_commit(transactional_id: str, group: str, topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(28, 3)
        answer = await c.call(
            28,
            3,
            transactional_id=transactional_id,
            group_id=group,
            producer_id=w.ids[transactional_id],
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                m.TxnOffsetCommitRequestTopic(
                    name=topic,
                    partitions=(
                        m.TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=1,
                            committed_leader_epoch=-1,
                            committed_metadata=None,
                        ),
                    ),
                ),
            ),
        )
        code: ErrorCode = answer.topics[0].partitions[0].error_code
        return code

    return call


def end_txn(transactional_id: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.call(
            26,
            3,
            transactional_id=transactional_id,
            producer_id=w.ids[transactional_id],
            producer_epoch=0,
            committed=False,
        )
        code: ErrorCode = answer.error_code
        return code

    return call


def offset_commit(group: str, topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(8, 8)
        answer = await c.call(
            8,
            8,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                m.OffsetCommitRequestTopic(
                    name=topic,
                    partitions=(
                        m.OffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=0,
                            committed_leader_epoch=-1,
                            committed_metadata=None,
                        ),
                    ),
                ),
            ),
        )
        code: ErrorCode = answer.topics[0].partitions[0].error_code
        return code

    return call


def offset_fetch(group: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.call(9, 7, group_id=group, topics=None, require_stable=False)
        code: ErrorCode = answer.error_code
        return code

    return call


def join(group: str, topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(11, 7)
        answer = await c.call(
            11,
            7,
            group_id=group,
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="m-1",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(
                m.JoinGroupRequestProtocol(name="range", metadata=encode_subscription([topic])),
            ),
        )
        code: ErrorCode = answer.error_code
        return code

    return call


def describe_configs(topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(32, 4)
        answer = await c.call(
            32,
            4,
            resources=(
                m.DescribeConfigsResource(
                    resource_type=2, resource_name=topic, configuration_keys=None
                ),
            ),
            include_synonyms=False,
            include_documentation=False,
        )
        code: ErrorCode = answer.results[0].error_code
        return code

    return call


def metadata(topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(3, 12)
        answer = await c.call(
            3,
            12,
            topics=(m.MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        code: ErrorCode = answer.topics[0].error_code
        return code

    return call


def delete_group(group: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        answer = await c.call(42, 2, groups_names=(group,))
        code: ErrorCode = answer.results[0].error_code
        return code

    return call


def create_topic(name: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(19, 7)
        answer = await c.call(
            19,
            7,
            topics=(
                m.CreatableTopic(
                    name=name, num_partitions=1, replication_factor=-1, assignments=(), configs=()
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
            validate_only=True,
        )
        code: ErrorCode = answer.topics[0].error_code
        return code

    return call


def delete_records(topic: str) -> KafkaCall:
    async def call(c: Connection, w: World) -> ErrorCode:
        m = _module(21, 2)
        answer = await c.call(
            21,
            2,
            topics=(
                m.DeleteRecordsTopic(
                    name=topic, partitions=(m.DeleteRecordsPartition(partition_index=0, offset=0),)
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
        )
        code: ErrorCode = answer.topics[0].partitions[0].error_code
        return code

    return call


def _pid(tid: str) -> Callable[[World], dict[str, int]]:
    return lambda w: {"producer_id": w.ids[tid], "producer_epoch": 0}


def _offsets(topic: str) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": 0, "offset": 1}]


def _http(method: str, path: str, body: Callable[[World], Any] | None = None) -> HttpCall:
    return lambda w: (method, path, None if body is None else body(w))


a1, b1 = _pid("a-1"), _pid("b-1")
NOBODY: frozenset[str] = frozenset()
P, C, PC = frozenset({"producer"}), frozenset({"consumer"}), frozenset({"producer", "consumer"})
RECORD = {"records": [{"value": "v"}]}
SUBSCRIBE = {"member_id": "m-1", "member_epoch": 0}

OPERATIONS = [
    Operation(
        "produce payments",
        P,
        _http("POST", "/v1/topics/payments/partitions/0/records", lambda w: RECORD),
        produce("payments"),
    ),
    Operation(
        "produce other",
        NOBODY,
        _http("POST", "/v1/topics/other/partitions/0/records", lambda w: RECORD),
        produce("other"),
    ),
    Operation(
        "produce payments in b-1",
        NOBODY,
        _http(
            "POST",
            "/v1/topics/payments/partitions/0/records",
            lambda w: {**b1(w), "base_sequence": 0, "transactional_id": "b-1", **RECORD},
        ),
        produce("payments", "b-1"),
    ),
    Operation(
        "fetch payments",
        C,
        _http("GET", "/v1/topics/payments/partitions/0/records"),
        fetch("payments"),
    ),
    Operation(
        "fetch other", NOBODY, _http("GET", "/v1/topics/other/partitions/0/records"), fetch("other")
    ),
    Operation("list offsets payments", C, None, list_offsets("payments")),
    Operation("list offsets other", NOBODY, None, list_offsets("other")),
    Operation("describe payments", PC, _http("GET", "/v1/topics/payments"), metadata("payments")),
    Operation("describe other", NOBODY, _http("GET", "/v1/topics/other"), metadata("other")),
    Operation(
        "configs of payments",
        PC,
        _http("GET", "/v1/topics/payments/configs"),
        describe_configs("payments"),
    ),
    Operation(
        "configs of other",
        NOBODY,
        _http("GET", "/v1/topics/other/configs"),
        describe_configs("other"),
    ),
    Operation(
        "idempotent producer id",
        frozenset({"producer", "nothing"}),
        _http("POST", "/v1/init-pid", lambda w: {}),
        init_pid(None),
    ),
    Operation(
        "init a-2",
        P,
        _http("POST", "/v1/init-pid", lambda w: {"transactional_id": "a-2"}),
        init_pid("a-2"),
    ),
    Operation(
        "init b-2",
        NOBODY,
        _http("POST", "/v1/init-pid", lambda w: {"transactional_id": "b-2"}),
        init_pid("b-2"),
    ),
    Operation(
        "add payments to a-1",
        P,
        _http(
            "POST",
            "/v1/transactions/a-1/partitions",
            lambda w: {**a1(w), "partitions": [{"topic": "payments", "partition": 0}]},
        ),
        add_partitions("a-1", "payments"),
    ),
    Operation(
        "add other to a-1",
        NOBODY,
        _http(
            "POST",
            "/v1/transactions/a-1/partitions",
            lambda w: {**a1(w), "partitions": [{"topic": "other", "partition": 0}]},
        ),
        add_partitions("a-1", "other"),
    ),
    Operation(
        "add payments to b-1",
        NOBODY,
        _http(
            "POST",
            "/v1/transactions/b-1/partitions",
            lambda w: {**b1(w), "partitions": [{"topic": "payments", "partition": 0}]},
        ),
        add_partitions("b-1", "payments"),
    ),
    Operation(
        "group g-1 into a-1",
        P,
        _http(
            "POST",
            "/v1/transactions/a-1/offsets",
            lambda w: {**a1(w), "group_id": "g-1", "offsets": []},
        ),
        add_offsets("a-1", "g-1"),
    ),
    Operation(
        "group h-1 into a-1",
        NOBODY,
        _http(
            "POST",
            "/v1/transactions/a-1/offsets",
            lambda w: {**a1(w), "group_id": "h-1", "offsets": []},
        ),
        add_offsets("a-1", "h-1"),
    ),
    Operation(
        "payments offsets of g-1 in a-1",
        P,
        _http(
            "POST",
            "/v1/transactions/a-1/offsets",
            lambda w: {**a1(w), "group_id": "g-1", "offsets": _offsets("payments")},
        ),
        txn_offset_commit("a-1", "g-1", "payments"),
    ),
    # The gap both doors had: a topic outside the producer's prefixes, into its own group.
    Operation(
        "other offsets of g-1 in a-1",
        NOBODY,
        _http(
            "POST",
            "/v1/transactions/a-1/offsets",
            lambda w: {**a1(w), "group_id": "g-1", "offsets": _offsets("other")},
        ),
        txn_offset_commit("a-1", "g-1", "other"),
    ),
    Operation(
        "payments offsets of h-1 in a-1",
        NOBODY,
        _http(
            "POST",
            "/v1/transactions/a-1/offsets",
            lambda w: {**a1(w), "group_id": "h-1", "offsets": _offsets("payments")},
        ),
        txn_offset_commit("a-1", "h-1", "payments"),
    ),
    Operation(
        "end a-1",
        P,
        _http("POST", "/v1/transactions/a-1/end", lambda w: {**a1(w), "commit": False}),
        end_txn("a-1"),
    ),
    Operation(
        "end b-1",
        NOBODY,
        _http("POST", "/v1/transactions/b-1/end", lambda w: {**b1(w), "commit": False}),
        end_txn("b-1"),
    ),
    Operation(
        "commit payments offsets of g-1",
        C,
        _http("POST", "/v1/groups/g-1/offsets", lambda w: {"offsets": _offsets("payments")}),
        offset_commit("g-1", "payments"),
    ),
    Operation(
        "commit other offsets of g-1",
        NOBODY,
        _http("POST", "/v1/groups/g-1/offsets", lambda w: {"offsets": _offsets("other")}),
        offset_commit("g-1", "other"),
    ),
    Operation(
        "commit payments offsets of h-1",
        NOBODY,
        _http("POST", "/v1/groups/h-1/offsets", lambda w: {"offsets": _offsets("payments")}),
        offset_commit("h-1", "payments"),
    ),
    Operation(
        "read offsets of g-1", C, _http("GET", "/v1/groups/g-1/offsets"), offset_fetch("g-1")
    ),
    Operation(
        "read offsets of h-1", NOBODY, _http("GET", "/v1/groups/h-1/offsets"), offset_fetch("h-1")
    ),
    Operation(
        "join g-1 for payments",
        C,
        _http(
            "POST",
            "/v1/groups/g-1/heartbeat",
            lambda w: {**SUBSCRIBE, "subscribed_topics": ["payments"]},
        ),
        join("g-1", "payments"),
    ),
    Operation(
        "join g-1 for other",
        NOBODY,
        _http(
            "POST",
            "/v1/groups/g-1/heartbeat",
            lambda w: {**SUBSCRIBE, "subscribed_topics": ["other"]},
        ),
        join("g-1", "other"),
    ),
    Operation(
        "join h-1 for payments",
        NOBODY,
        _http(
            "POST",
            "/v1/groups/h-1/heartbeat",
            lambda w: {**SUBSCRIBE, "subscribed_topics": ["payments"]},
        ),
        join("h-1", "payments"),
    ),
    Operation("delete group g-1", NOBODY, _http("DELETE", "/v1/groups/g-1"), delete_group("g-1")),
    Operation(
        "create a topic",
        NOBODY,
        _http("POST", "/v1/topics", lambda w: {"name": "payments-new"}),
        create_topic("payments-new"),
    ),
    Operation(
        "delete records of payments",
        NOBODY,
        _http(
            "POST",
            "/v1/topics/payments/delete-records",
            lambda w: {"partitions": [{"partition": 0, "offset": 0}]},
        ),
        delete_records("payments"),
    ),
]


@pytest.fixture
def settings_overrides(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": list(TOKENS.values())}))
    return {"auth_tokens_file": path, "kafka_listener": f"127.0.0.1:{free_port()}"}


@pytest.fixture
async def world(app: Any) -> World:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TOKENS['admin']['token']}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://coordinator", headers=headers
    ) as admin:
        for name in ("payments", "other"):
            assert (await admin.post("/v1/topics", json={"name": name})).status_code == 201
        ids = {}
        for tid in ("a-1", "b-1"):
            answer = await admin.post("/v1/init-pid", json={"transactional_id": tid})
            ids[tid] = answer.json()["producer_id"]
    return World(ids)


async def _http_refused(app: Any, who: str, call: HttpCall, world: World) -> bool:
    method, path, body = call(world)
    headers = {"Authorization": f"Bearer {TOKENS[who]['token']}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://coordinator", headers=headers
    ) as client:
        response = await client.request(method, path, json=body)
    if response.status_code == 403:
        assert response.json()["code"] in REFUSED_HTTP, response.text
        return True
    assert response.status_code < 500, response.text
    return False


@pytest.fixture
async def kafka(app: Any) -> AsyncIterator[KafkaListener]:
    state = app.state
    listener = KafkaListener(state.db, state.settings, state.authenticator)
    await listener.start()
    yield listener
    await listener.close()


async def _kafka_connection(listener: KafkaListener, who: str) -> Connection:
    import asyncio

    connection = Connection(*await asyncio.open_connection(listener.host, listener.port))
    assert (await connection.call(17, 1, mechanism="PLAIN")).error_code == ErrorCode.none
    entry = TOKENS[who]
    plain = b"\0" + entry["principal"].encode() + b"\0" + entry["token"].encode()  # type: ignore[attr-defined]
    assert (await connection.call(36, 2, auth_bytes=plain)).error_code == ErrorCode.none
    return connection


@pytest.mark.parametrize("door", ["http", "kafka"])
async def test_every_named_operation_passes_exactly_the_principals_the_table_names(
    app: Any, world: World, kafka: KafkaListener, door: str
) -> None:
    connections = {}
    if door == "kafka":
        connections = {who: await _kafka_connection(kafka, who) for who in (*PRINCIPALS, "admin")}
    wrong = []
    try:
        for operation in OPERATIONS:
            for who in (*PRINCIPALS, "admin"):
                allowed = who == "admin" or who in operation.allowed
                if door == "http":
                    if operation.http is None:
                        continue
                    refused = await _http_refused(app, who, operation.http, world)
                else:
                    if operation.kafka is None:
                        continue
                    refused = await operation.kafka(connections[who], world) in REFUSED_KAFKA
                if refused == allowed:
                    wrong.append(f"{operation.name}: {who} {'refused' if refused else 'let in'}")
    finally:
        for connection in connections.values():
            connection.writer.close()
    assert not wrong, wrong


def test_the_table_reaches_both_doors() -> None:
    assert sum(op.http is not None for op in OPERATIONS) >= 30
    assert sum(op.kafka is not None for op in OPERATIONS) >= 30
