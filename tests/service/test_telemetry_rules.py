"""Client telemetry's rules (KIP-714) without I/O: which metrics a client is asked for by the
subscriptions it matches, how a subscription's configs are checked, and when a client's
GetTelemetrySubscriptions or PushTelemetry is early (throttled), stale or refused, as Kafka's
ClientMetricsManager decides."""

from __future__ import annotations

import uuid

import pytest

from coordinator.core.errors import InvalidRequest
from coordinator.core.quotas import ThrottlingQuotaExceeded
from coordinator.log.errors import InvalidConfig
from coordinator.telemetry import instances as rules
from coordinator.telemetry.subscriptions import (
    DEFAULT_INTERVAL_MS,
    Requested,
    Subscription,
    check,
    requested,
)

JAVA = {
    "client_id": "payments-1",
    "client_software_name": "apache-kafka-java",
    "client_software_version": "4.4.0",
    "client_source_address": "10.0.0.7",
    "client_source_port": "51000",
}


def test_a_client_is_asked_the_union_of_what_it_matches_at_the_shortest_interval() -> None:
    subscriptions = [
        Subscription.of(
            "producers", {"metrics": "org.apache.kafka.producer.", "interval.ms": "900"}
        ),
        Subscription.of(
            "payments",
            {
                "metrics": "org.apache.kafka.consumer., org.apache.kafka.producer.",
                "interval.ms": "500",
                "match": "client_id=payments-.*",
            },
        ),
        Subscription.of(
            "go", {"metrics": "*", "interval.ms": "100", "match": "client_software_name=franz"}
        ),
    ]
    assert requested(subscriptions, JAVA) == Requested(
        ("org.apache.kafka.consumer.", "org.apache.kafka.producer."), 500
    )
    # The pattern matches the whole attribute, as Java's Matcher.matches does.
    partial = {**JAVA, "client_id": "xpayments-1"}
    assert requested(subscriptions, partial) == Requested(("org.apache.kafka.producer.",), 900)


def test_all_metrics_is_a_star_alone_and_no_match_is_nothing_every_five_minutes() -> None:
    subscriptions = [
        Subscription.of("all", {"metrics": "*", "match": "client_software_name=apache-kafka-java"}),
        Subscription.of("some", {"metrics": "org.apache.kafka.producer."}),
    ]
    assert requested(subscriptions, JAVA) == Requested(("*",), DEFAULT_INTERVAL_MS)
    other = {**JAVA, "client_software_name": "librdkafka"}
    assert requested(subscriptions[:1], other) == Requested((), DEFAULT_INTERVAL_MS)


@pytest.mark.parametrize(
    ("configs", "error"),
    [
        ({"metric": "x"}, InvalidRequest),  # a name Kafka does not know
        ({"interval.ms": "99"}, InvalidRequest),
        ({"interval.ms": "3600001"}, InvalidRequest),
        ({"interval.ms": "soon"}, InvalidConfig),
        ({"match": "client_colour=red"}, InvalidConfig),
        ({"match": "client_id"}, InvalidConfig),
        ({"match": "client_id=(unclosed"}, InvalidConfig),
    ],
)
def test_a_subscription_s_configs_are_checked_as_kafka_checks_them(
    configs: dict[str, str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        check("sub", configs)


def test_good_configs_pass_and_an_empty_name_does_not() -> None:
    check(
        "sub", {"metrics": "*", "interval.ms": "100", "match": "client_id=a.*,client_source_port=5"}
    )
    with pytest.raises(InvalidRequest):
        check("", {"metrics": "*"})


def _instance(interval_ms: int = 1000) -> rules.Instance:
    return rules.Instances().instance(uuid.uuid4(), Requested(("*",), interval_ms), JAVA)


def test_a_second_get_within_the_interval_is_throttled() -> None:
    instance = _instance()
    rules.check_get(instance, 10_000)
    with pytest.raises(ThrottlingQuotaExceeded):
        rules.check_get(instance, 10_999)
    rules.check_get(instance, 11_000)


def _push(instance: rules.Instance, at: int, **changes: object) -> None:
    asked: dict[str, object] = {
        "subscription": instance.subscription_id,
        "compression_type": 0,
        "size": 10,
        "terminating": False,
        "max_bytes": 100,
    }
    asked.update(changes)
    rules.check_push(instance, at, **asked)  # type: ignore[arg-type]


def test_the_first_push_after_a_get_is_taken_at_once_then_one_per_interval() -> None:
    instance = _instance()
    rules.check_get(instance, 10_000)
    _push(instance, 10_001)
    with pytest.raises(ThrottlingQuotaExceeded):
        _push(instance, 10_500)
    _push(instance, 11_001)


def test_a_push_is_checked_in_kafka_s_order() -> None:
    instance = _instance()
    with pytest.raises(rules.UnknownSubscriptionId):
        _push(instance, 5_000, subscription=instance.subscription_id + 1)
    with pytest.raises(rules.UnsupportedCompressionType):
        _push(instance, 7_000, compression_type=9)
    with pytest.raises(rules.TelemetryTooLarge):
        _push(instance, 9_000, size=101)


def test_after_a_terminating_push_nothing_more_is_taken() -> None:
    instance = _instance()
    _push(instance, 5_000, terminating=True)  # early or not, a terminating push is taken
    with pytest.raises(InvalidRequest):
        _push(instance, 9_000)


def test_an_instance_is_new_when_its_subscriptions_change() -> None:
    known = rules.Instances()
    instance_id = uuid.uuid4()
    first = known.instance(instance_id, Requested(("a.",), 1000), JAVA)
    assert known.instance(instance_id, Requested(("a.",), 1000), JAVA) is first
    changed = known.instance(instance_id, Requested(("a.", "b."), 1000), JAVA)
    assert changed is not first and changed.subscription_id != first.subscription_id
    # Derived from what is asked and the id alone: every process gives the same id.
    again = rules.Instances().instance(instance_id, Requested(("a.", "b."), 1000), JAVA)
    assert again.subscription_id == changed.subscription_id
    other = known.instance(uuid.uuid4(), Requested(("a.", "b."), 1000), JAVA)
    assert other.subscription_id != changed.subscription_id
    assert -(2**31) <= changed.subscription_id < 2**31


def test_the_cache_keeps_the_most_recently_used_instances() -> None:
    known = rules.Instances(size=2)
    ids = [uuid.uuid4() for _ in range(3)]
    first = known.instance(ids[0], Requested((), 1000), JAVA)
    second = known.instance(ids[1], Requested((), 1000), JAVA)
    assert known.instance(ids[0], Requested((), 1000), JAVA) is first  # used again: kept
    known.instance(ids[2], Requested((), 1000), JAVA)
    assert known.instance(ids[0], Requested((), 1000), JAVA) is first
    assert known.instance(ids[1], Requested((), 1000), JAVA) is not second  # evicted: anew
