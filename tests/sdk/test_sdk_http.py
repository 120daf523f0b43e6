"""The SDK's HTTP layer: the bearer token, bounded retries that repeat only what may be repeated."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk import (
    AdminClient,
    AuthenticationFailed,
    AuthorizationFailed,
    KafkaTimeoutError,
    NewTopic,
    Producer,
    TransactionalIdAuthorizationFailed,
    TransactionalIdNotFound,
    TransportError,
)
from tests.support.sdk_support import Coordinator, Faults, FaultyTransport

TOKENS = {
    "tokens": [
        {"token": "admin-s3cr3t", "principal": "ops", "roles": ["admin"]},
        {
            "token": "etl-s3cr3t",
            "principal": "etl",
            "roles": ["producer", "consumer"],
            "transactional_id_prefixes": ["etl-"],
            "topic_prefixes": ["payments"],
            "group_prefixes": ["etl"],
        },
    ]
}


def test_the_token_is_sent_as_a_bearer_header_to_a_service_with_auth(
    start_service: Callable[..., Coordinator], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    service = start_service(auth_tokens_file=tokens)
    transport = FaultyTransport(Faults(), seed=0)
    with AdminClient(coordinator_url=service.url, coordinator_token="admin-s3cr3t") as admin:
        for future in admin.create_topics([NewTopic("payments"), NewTopic("audit")]).values():
            future.result()
    with Producer(
        {"coordinator.url": service.url, "coordinator.token": "etl-s3cr3t"}, transport=transport
    ) as producer:
        producer.produce("payments", "paid")
        with pytest.raises(AuthorizationFailed) as denied:
            producer.produce("audit", "not mine")
        assert denied.value.code == "TOPIC_AUTHORIZATION_FAILED" and denied.value.status == 403
    assert {r.headers["authorization"] for r in transport.sent} == {"Bearer etl-s3cr3t"}
    anonymous = AdminClient(coordinator_url=service.url)
    with anonymous, pytest.raises(AuthenticationFailed):
        anonymous.list_topics(timeout=5)
    fenced_out = Producer(
        coordinator_url=service.url, coordinator_token="etl-s3cr3t", transactional_id="ops-1"
    )
    with pytest.raises(TransactionalIdAuthorizationFailed) as raised:
        fenced_out.init_transactions()
    assert raised.value.fatal
    fenced_out.close()


def test_transport_failures_are_retried_with_backoff_until_the_timeout(
    service: Coordinator,
) -> None:
    transport = FaultyTransport(Faults(refuse=1.0), seed=0)
    admin = AdminClient(coordinator_url=service.url, transport=transport, retry_backoff_ms=10)
    with admin, pytest.raises(KafkaTimeoutError) as raised:
        admin.list_topics(timeout=0.5)
    assert raised.value.retriable
    assert isinstance(raised.value.__cause__, TransportError)
    assert 3 <= transport.injected["refuse"] <= 12  # 10, 20, 40... ms apart, capped by 1 s


def test_an_answer_that_is_not_retriable_is_raised_at_once(service: Coordinator) -> None:
    transport = FaultyTransport(Faults(), seed=0)
    admin = AdminClient(coordinator_url=service.url, transport=transport)
    with admin, pytest.raises(TransactionalIdNotFound) as raised:
        admin.describe_transactions(["nobody"])
    assert raised.value.status == 404 and not raised.value.retriable
    assert len(transport.sent) == 1
