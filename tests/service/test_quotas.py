"""Limits of the domain, through both doors (issue 21, item 7): a group holds at most
COORDINATOR_GROUP_CONSUMER_MAX_SIZE members (GROUP_MAX_SIZE_REACHED), and a principal creates at
most COORDINATOR_CONTROLLER_MUTATION_RATE partitions a second (Kafka's KIP-599 quota,
THROTTLING_QUOTA_EXCEEDED); each refusal changes nothing and is counted. SQLite and Postgres."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from coordinator.core import quotas
from coordinator.core.metrics import LIMIT_REFUSALS
from coordinator.core.quotas import MutationQuota, ThrottlingQuotaExceeded
from coordinator.groups.consumer_protocol import encode_subscription
from coordinator.kafka.server import KafkaListener
from tests.support.api import assert_problem, create_topic
from tests.support.groups import Member
from tests.support.kafka_wire import Connection
from tests.support.services import free_port

MAX_MEMBERS = 2
RATE = 1.0  # partitions a second: a bucket of 10


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {
        "group_consumer_max_size": MAX_MEMBERS,
        # A classic group's first rebalance outlasts the test: its members stay parked in it.
        "group_initial_rebalance_delay_ms": 60_000,
        "controller_mutation_rate": RATE,
        "kafka_listener": f"127.0.0.1:{free_port()}",
    }


@pytest.fixture
async def listener(app: Any) -> AsyncIterator[KafkaListener]:
    state = app.state
    listener = KafkaListener(state.db, state.settings, state.authenticator, state.quota)
    await listener.start()
    yield listener
    await listener.close()


@pytest.fixture
async def kafka(listener: KafkaListener) -> AsyncIterator[Connection]:
    connection = Connection(*await asyncio.open_connection(listener.host, listener.port))
    yield connection
    connection.writer.close()


def refusals(limit: str) -> float:
    value: float = LIMIT_REFUSALS.labels(limit=limit)._value.get()
    return value


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_quota_admits_while_positive_goes_into_debt_and_refills() -> None:
    clock = Clock()
    quota = MutationQuota(2.0, clock)
    quota.take("p", 25, 2.0)  # a bucket of 20, admitted whole while positive
    with pytest.raises(ThrottlingQuotaExceeded) as refused:
        quota.take("p", 1, 2.0)
    assert refused.value.extensions["throttle_time_ms"] == 2501  # 5 in debt at 2 a second
    quota.take("q", 1, 2.0)  # another principal has a bucket of its own
    clock.now = 2.6
    quota.take("p", 1, 2.0)


async def test_a_group_past_its_max_size_refuses_a_new_member_over_http(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    members = [Member(client, "g", f"m-{i}") for i in range(MAX_MEMBERS)]
    for member in members:
        await member.beat()
    before = refusals("group_max_size")
    response = await Member(client, "g", "m-extra").send(member_epoch=0, subscribed_topics=["t"])
    assert_problem(response, 409, "GROUP_MAX_SIZE_REACHED")
    assert refusals("group_max_size") == before + 1
    described = (await client.get("/v1/groups/g")).json()
    assert sorted(m["member_id"] for m in described["members"]) == ["m-0", "m-1"]
    # The members it has go on; once one leaves, another may join.
    await members[0].beat()
    await members[1].leave()
    response = await Member(client, "g", "m-extra").send(member_epoch=0, subscribed_topics=["t"])
    assert response.status_code == 200, response.text


async def test_a_group_past_its_max_size_refuses_a_new_member_over_kafka(
    client: httpx.AsyncClient, listener: KafkaListener
) -> None:
    await create_topic(client, "t")
    module = load_payload_module(11, 7, EntityType.request)

    async def join(member_id: str) -> ErrorCode:
        # Each member on its own connection: a JoinGroup is parked until the rebalance ends.
        kafka = Connection(*await asyncio.open_connection(listener.host, listener.port))
        try:
            answer = await kafka.call(
                11,
                7,
                group_id="g",
                session_timeout=datetime.timedelta(seconds=30),
                rebalance_timeout=datetime.timedelta(seconds=30),
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(
                    module.JoinGroupRequestProtocol(
                        name="range", metadata=encode_subscription(["t"])
                    ),
                ),
            )
        finally:
            kafka.writer.close()
        code: ErrorCode = answer.error_code
        return code

    parked = [asyncio.create_task(join(f"m-{i}")) for i in range(MAX_MEMBERS)]

    async def members() -> int:
        described = await client.get("/v1/groups/g")
        return len(described.json()["members"]) if described.status_code == 200 else 0

    deadline = asyncio.get_running_loop().time() + 10
    while await members() < MAX_MEMBERS:
        assert asyncio.get_running_loop().time() < deadline, "the members did not join"
        await asyncio.sleep(0.01)
    assert await join("m-extra") == ErrorCode.group_max_size_reached
    assert not any(task.done() for task in parked)  # still in the group's first rebalance
    for task in parked:
        task.cancel()
    await asyncio.gather(*parked, return_exceptions=True)


async def test_topic_creation_past_the_mutation_quota_is_429_and_creates_nothing(
    client: httpx.AsyncClient,
) -> None:
    before = refusals("partition_mutation_rate")
    assert (
        await client.post("/v1/topics", json={"name": "a", "partitions": 12})
    ).status_code == 201
    response = await client.post("/v1/topics", json={"name": "b", "partitions": 1})
    body = assert_problem(response, 429, "THROTTLING_QUOTA_EXCEEDED")
    assert body["retriable"] is True
    assert body["throttle_time_ms"] > 0
    assert (await client.get("/v1/topics/b")).status_code == 404
    assert refusals("partition_mutation_rate") == before + 1


async def test_topic_creation_past_the_mutation_quota_is_throttled_over_kafka(
    kafka: Connection,
) -> None:
    module = load_payload_module(19, 7, EntityType.request)

    async def create(name: str, partitions: int) -> Any:
        return await kafka.call(
            19,
            7,
            topics=(
                module.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=-1,
                    assignments=(),
                    configs=(),
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
            validate_only=False,
        )

    assert (await create("a", 12)).topics[0].error_code == ErrorCode.none
    answer = await create("b", 1)
    assert answer.topics[0].error_code == ErrorCode.throttling_quota_exceeded
    assert answer.throttle_time > datetime.timedelta(0)


async def test_quotas_stored_by_alter_client_quotas_replace_the_setting_user_by_user(
    client: httpx.AsyncClient, kafka: Connection, app: Any
) -> None:
    # kafka-configs --entity-type users: a user's stored controller_mutation_rate, else the
    # default user's, else the setting (Kafka's precedence). What is not enforced is refused.
    alter = load_payload_module(49, 1, EntityType.request)
    describe = load_payload_module(48, 1, EntityType.request)

    async def set_quota(
        entity: tuple[tuple[str, str | None], ...],
        *ops: tuple[str, float | None],
        validate_only: bool = False,
    ) -> tuple[ErrorCode, str | None]:
        answer = await kafka.call(
            49,
            1,
            entries=(
                alter.EntryData(
                    entity=tuple(alter.EntityData(entity_type=t, entity_name=n) for t, n in entity),
                    ops=tuple(
                        alter.OpData(key=k, value=v or 0.0, remove=v is None) for k, v in ops
                    ),
                ),
            ),
            validate_only=validate_only,
        )
        (entry,) = answer.entries
        return entry.error_code, entry.error_message

    rate = "controller_mutation_rate"
    default, alice = (("user", None),), (("user", "alice"),)
    assert await set_quota(default, (rate, RATE / 2)) == (ErrorCode.none, None)
    assert await set_quota(alice, (rate, 7.0)) == (ErrorCode.none, None)
    assert await set_quota((("user", "bob"),), (rate, 9.0), validate_only=True) == (
        ErrorCode.none,
        None,
    )
    refused = [
        await set_quota((("client-id", "c"),), (rate, 3.0)),
        await set_quota((("user", "u"), ("client-id", "c")), (rate, 3.0)),
        await set_quota(alice, ("producer_byte_rate", 1024.0)),
        await set_quota(alice, (rate, 0.0)),
        await set_quota(alice, (rate, float("nan"))),
        await set_quota(alice, (rate, float("inf"))),
        await set_quota(alice, ("no_such_quota", 1.0)),
        await set_quota((), (rate, 3.0)),
        await set_quota((("user", ""),), (rate, 3.0)),
        await set_quota(alice, (rate, 3.0), (rate, 4.0)),
    ]
    assert [code for code, _ in refused] == [ErrorCode.invalid_request] * len(refused)
    assert "not enforced" in (refused[2][1] or "")

    described = await kafka.call(48, 1, components=(), strict=False)
    assert {
        e.entity[0].entity_name: [(v.key, v.value) for v in e.values] for e in described.entries
    } == {None: [(rate, RATE / 2)], "alice": [(rate, 7.0)]}
    only_alice = await kafka.call(
        48,
        1,
        components=(describe.ComponentData(entity_type="user", match_type=0, match="alice"),),
        strict=True,
    )
    assert [e.entity[0].entity_name for e in only_alice.entries] == ["alice"]

    # Auth is off here: every caller is the default user, at half the setting's rate (a
    # bucket of 5 partitions, where the setting's holds 10).
    assert (await client.post("/v1/topics", json={"name": "a", "partitions": 6})).status_code == 201
    response = await client.post("/v1/topics", json={"name": "b", "partitions": 1})
    assert_problem(response, 429, "THROTTLING_QUOTA_EXCEEDED")

    db = app.state.db
    assert (await quotas.rate_of(db, "alice"), await quotas.rate_of(db, "bob")) == (7.0, RATE / 2)
    assert await set_quota(default, (rate, None)) == (ErrorCode.none, None)
    assert await set_quota(alice, (rate, None)) == (ErrorCode.none, None)
    assert await quotas.rate_of(db, "alice") is None  # the setting's again
