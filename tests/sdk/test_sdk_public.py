"""The SDK's public surface: the names it exports, its typed errors and its typed configuration."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sdk
from sdk import (
    ConfigError,
    Consumer,
    ConsumerConfig,
    KafkaError,
    KafkaException,
    Producer,
    ProducerConfig,
    ProducerFenced,
    TransactionTimedOut,
)
from sdk._config import build_config
from sdk._errors import error_for

EXPECTED_ALL = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "AcknowledgeType",
    "AdminClient",
    "AdminConfig",
    "AdminOptions",
    "AlterConfigOpType",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "Claim",
    "ClusterMetadata",
    "CommitCallback",
    "ConcurrentTransactions",
    "ConfigEntry",
    "ConfigError",
    "ConfigResource",
    "ConfigSource",
    "Consumer",
    "ConsumerConfig",
    "ConsumerGroupMetadata",
    "ConsumerOptions",
    "CoordinatorNotAvailable",
    "DeletedRecords",
    "DeliveryCallback",
    "Effect",
    "EffectClaimed",
    "EffectNotFound",
    "EffectsClient",
    "EffectsConfig",
    "EffectsOptions",
    "FatalError",
    "FencedClaim",
    "FencedMemberEpoch",
    "GroupIdNotFound",
    "HangingPartition",
    "HangingTransactions",
    "Headers",
    "IllegalStateError",
    "InternalError",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidRequest",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "KafkaError",
    "KafkaException",
    "KafkaTimeoutError",
    "Message",
    "MessagePurged",
    "MessageSizeTooLarge",
    "MessageTimedOut",
    "NewTopic",
    "NonEmptyGroup",
    "NotFound",
    "OutOfOrderSequenceNumber",
    "PartitionDescription",
    "PartitionMetadata",
    "Producer",
    "ProducerConfig",
    "ProducerFenced",
    "ProducerOptions",
    "ProducerState",
    "RebalanceCallback",
    "RecordListTooLarge",
    "ResourceType",
    "RetriableError",
    "ServiceError",
    "ShareAcknowledgement",
    "ShareConsumer",
    "ShareConsumerConfig",
    "ShareConsumerOptions",
    "ShareGroupMetadata",
    "TopicAlreadyExists",
    "TopicDescription",
    "TopicMetadata",
    "TopicPartition",
    "TransactionDescription",
    "TransactionTimedOut",
    "TransactionalIdAuthorizationFailed",
    "TransactionalIdNotFound",
    "TransportError",
    "UnknownMemberId",
    "UnknownProducerId",
    "UnknownTopicOrPartition",
    "UnstableOffsetCommit",
]

# The HTTP API's error codes: (code, status, retriable).
API_CODES = [
    ("INVALID_REQUEST", 422, False),
    ("INVALID_TRANSACTION_TIMEOUT", 400, False),
    ("UNKNOWN_TOPIC_OR_PARTITION", 404, False),
    ("TRANSACTIONAL_ID_NOT_FOUND", 404, False),
    ("TOPIC_ALREADY_EXISTS", 409, False),
    ("PRODUCER_FENCED", 409, False),
    ("TRANSACTION_TIMED_OUT", 409, False),
    ("INVALID_PRODUCER_EPOCH", 409, False),
    ("INVALID_PRODUCER_ID_MAPPING", 409, False),
    ("INVALID_TXN_STATE", 409, False),
    ("CONCURRENT_TRANSACTIONS", 409, True),
    ("OUT_OF_ORDER_SEQUENCE_NUMBER", 409, False),
    ("UNKNOWN_PRODUCER_ID", 409, False),
    ("UNSTABLE_OFFSET_COMMIT", 409, True),
    ("UNKNOWN_MEMBER_ID", 409, False),
    ("FENCED_MEMBER_EPOCH", 409, False),
    ("GROUP_ID_NOT_FOUND", 404, False),
    ("NON_EMPTY_GROUP", 409, False),
    ("RECORD_LIST_TOO_LARGE", 413, False),
    ("EFFECT_CLAIMED", 409, True),
    ("FENCED_CLAIM", 409, False),
    ("EFFECT_NOT_FOUND", 404, False),
    ("COORDINATOR_NOT_AVAILABLE", 503, True),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 403, False),
    ("TOPIC_AUTHORIZATION_FAILED", 403, False),
    ("GROUP_AUTHORIZATION_FAILED", 403, False),
    ("CLUSTER_AUTHORIZATION_FAILED", 403, False),
    ("UNAUTHENTICATED", 401, False),
    ("NOT_FOUND", 404, False),
    ("METHOD_NOT_ALLOWED", 405, False),
    ("INTERNAL_ERROR", 500, True),
]


def test_all_lists_exactly_the_curated_public_names() -> None:
    assert sdk.__all__ == EXPECTED_ALL
    # `sdk.spark`, the Spark integration (it needs pyspark), and `sdk.recordbatch`, Kafka's
    # record batch codec (the service's too), are submodules of their own: each shows as an
    # attribute of `sdk` once something imported it, and is never re-exported.
    public = {n for n in dir(sdk) if not n.startswith("_")} - {"spark", "recordbatch"}
    assert public == set(EXPECTED_ALL)
    assert "spark" not in sdk.__all__ and "recordbatch" not in sdk.__all__
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if isinstance(obj, type):
            assert obj.__module__ == "sdk", name


def test_a_part_of_the_sdk_imports_only_what_it_needs() -> None:
    """The names load on first use: `import sdk` costs nothing, and a Spark worker that unpickles
    the txlog source does not import SQLAlchemy (txsql's) nor the admin client."""
    probe = (
        "import sys, sdk; first = {'httpx', 'pydantic'} & set(sys.modules); "
        "import sdk.spark._source; "
        "print(sorted(first), sorted({'sqlalchemy', 'sdk._admin'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "[]"], done.stdout + done.stderr
    assert sdk.Producer is sdk._producer.Producer and sdk.Producer.__module__ == "sdk"


def test_the_package_ships_py_typed() -> None:
    assert (Path(sdk.__file__).parent / "py.typed").is_file()


def test_every_exported_error_class_is_drawn_in_the_error_tree() -> None:
    tree = sdk._errors.__doc__ or ""
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if isinstance(obj, type) and issubclass(obj, KafkaException):
            assert name in tree, name


@pytest.mark.parametrize(("code", "status", "retriable"), API_CODES)
def test_each_api_code_becomes_a_typed_error(code: str, status: int, retriable: bool) -> None:
    error = error_for(code, "detail sentence", status)
    assert type(error) is not KafkaException
    assert isinstance(error, sdk.ServiceError)
    assert (error.code, error.status, error.detail) == (code, status, "detail sentence")
    assert error.retriable is retriable
    assert isinstance(error, sdk.RetriableError) is retriable


def test_producer_fenced_is_fatal_and_not_retriable() -> None:
    error = error_for("PRODUCER_FENCED", "a newer producer exists", 409)
    assert isinstance(error, ProducerFenced) and isinstance(error, sdk.FatalError)
    assert (error.fatal, error.retriable, error.txn_requires_abort) == (True, False, False)


def test_transaction_timed_out_is_its_own_class_telling_to_init_again() -> None:
    error = error_for("TRANSACTION_TIMED_OUT", "aborted after its timeout", 409)
    assert isinstance(error, TransactionTimedOut)
    assert (error.fatal, error.retriable, error.txn_requires_abort) == (False, False, False)
    assert "init_transactions()" in (TransactionTimedOut.__doc__ or "")


def test_args0_is_a_kafka_error_with_confluent_kafkas_methods() -> None:
    error = error_for("CONCURRENT_TRANSACTIONS", "busy", 409)
    value = error.args[0]
    assert isinstance(value, KafkaError)
    assert value.code() == KafkaError.CONCURRENT_TRANSACTIONS == "CONCURRENT_TRANSACTIONS"
    assert (value.retriable(), value.fatal(), value.txn_requires_abort()) == (True, False, False)
    assert value.str() == "busy" and value.name() == "CONCURRENT_TRANSACTIONS"
    assert isinstance(value.exception(), sdk.ConcurrentTransactions)
    eof = KafkaError(KafkaError._PARTITION_EOF, "end")
    assert type(eof.exception()) is KafkaException and eof != value
    # As in confluent-kafka: raise KafkaException(msg.error()).
    raised = KafkaException(value)
    assert raised.code == "CONCURRENT_TRANSACTIONS" and raised.retriable


def test_an_error_failing_a_transaction_keeps_its_class_and_requires_abort() -> None:
    error = error_for("UNKNOWN_TOPIC_OR_PARTITION", "no such partition", 404)
    assert not error.txn_requires_abort
    marked = error.with_abort_required()
    assert isinstance(marked, sdk.UnknownTopicOrPartition)
    assert marked.txn_requires_abort and not marked.retriable and marked.status == 404


def test_errors_pickle_so_they_cross_process_boundaries() -> None:
    error = error_for("PRODUCER_FENCED", "fenced", 409)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ProducerFenced
    assert (copy.code, copy.status, copy.fatal) == ("PRODUCER_FENCED", 409, True)
    assert copy.detail == "fenced"


def test_config_from_kafka_keys_equals_config_from_typed_keywords() -> None:
    from_dict = build_config(
        ProducerConfig,
        {
            "coordinator.url": "http://127.0.0.1:8080",
            "transactional.id": "etl-1",
            "linger.ms": 20,
            "max.in.flight.requests.per.connection": 3,
            "coordinator.token": "s3cr3t",
        },
        {},
    )
    from_keywords = build_config(
        ProducerConfig,
        None,
        {
            "coordinator_url": "http://127.0.0.1:8080",
            "transactional_id": "etl-1",
            "linger_ms": 20,
            "max_in_flight_requests_per_connection": 3,
            "coordinator_token": "s3cr3t",
        },
    )
    assert from_dict == from_keywords
    assert from_dict.enable_idempotence is True
    assert from_dict.transaction_timeout_ms == 60_000


def test_keywords_override_the_dict_and_strings_are_read_as_librdkafka_does() -> None:
    config = build_config(
        ConsumerConfig,
        {"coordinator.url": "http://h:1", "enable.auto.commit": "false", "max.poll.records": "50"},
        {"max_poll_records": 7, "auto_offset_reset": "smallest"},
    )
    assert config.enable_auto_commit is False
    assert config.max_poll_records == 7
    assert config.auto_offset_reset == "earliest"
    assert config.isolation_level == "read_committed"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"bootstrap.servers": "localhost:9092"}, "coordinator.url"),
        ({"coordinator.url": "http://h:1", "lingr.ms": 5}, "did you mean 'linger.ms'"),
        ({"coordinator.url": "http://h:1", "max.in.flight.requests.per.connection": 6}, "1..5"),
        ({"coordinator.url": "http://h:1", "linger.ms": "soon"}, "expected an integer"),
        ({"coordinator.url": "http://h:1", "acks": 1}, "acks"),
        ({"coordinator.url": "localhost:8080"}, "http://"),
        ({"linger.ms": 5}, "coordinator.url: required"),
        (
            {
                "coordinator.url": "http://h:1",
                "transactional.id": "t",
                "enable.idempotence": False,
            },
            "enable.idempotence",
        ),
        ({"coordinator.url": "http://h:1", "delivery.timeout.ms": 10}, "delivery.timeout.ms"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        build_config(ProducerConfig, settings, {})
    assert isinstance(raised.value, ValueError)
    assert raised.value.code == KafkaError._INVALID_ARG


def test_typed_keyword_options_match_the_config_fields() -> None:
    for config, options in [
        (sdk.ProducerConfig, sdk.ProducerOptions),
        (sdk.ConsumerConfig, sdk.ConsumerOptions),
        (sdk.AdminConfig, sdk.AdminOptions),
        (sdk.EffectsConfig, sdk.EffectsOptions),
        (sdk.ShareConsumerConfig, sdk.ShareConsumerOptions),
    ]:
        fields = {f.name for f in dataclasses.fields(config)}
        assert set(options.__annotations__) == fields, config.__name__


def test_every_public_method_says_what_to_do_in_its_docstring() -> None:
    for cls in (Producer, Consumer, sdk.AdminClient, sdk.EffectsClient, sdk.ShareConsumer):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or name in ("close", "unassign", "assignment"):
                continue
            assert member.__doc__, f"{cls.__name__}.{name} has no docstring"
    for name in (
        "init_transactions",
        "send_offsets_to_transaction",
        "commit_transaction",
        "abort_transaction",
    ):
        doc = getattr(Producer, name).__doc__ or ""
        assert "Raises" in doc and "KafkaTimeoutError" in doc, name
        if name != "init_transactions":
            assert "fatal" in doc and "TransactionTimedOut" in doc, name


def test_the_spark_subpackage_exports_its_own_few_names() -> None:
    import sdk.spark

    assert sdk.spark.__all__ == [
        "CommitResult",
        "TaskOutcome",
        "TaskWriter",
        "TransactionalJob",
        "TxlogDataSource",
        "TxshareDataSource",
        "TxsqlDataSource",
        "committed_offsets",
        "latest_offsets",
        "offsets_json",
        "register",
        "sql_committed_offsets",
    ]


CLIENTS = [
    (sdk.AdminClient, "the admin client", lambda c: c.list_topics()),
    (sdk.EffectsClient, "the effects client", lambda c: c.claim("k", "o", 1000)),
    (sdk.Consumer, "the consumer", lambda c: c.poll(0)),
    (sdk.Producer, "the producer", lambda c: c.produce("t", b"v")),
]


@pytest.mark.parametrize(("client_class", "name", "call"), CLIENTS)
def test_every_client_has_one_lifecycle(client_class: Any, name: str, call: Any) -> None:
    """A context manager that closes on exit; closing again does nothing; a closed client
    refuses every call, naming itself. No call reaches a service here."""
    with client_class({"coordinator.url": "http://127.0.0.1:9"}) as client:
        pass
    client.close()
    with pytest.raises(sdk.IllegalStateError, match=f": {name} is closed$"):
        call(client)
