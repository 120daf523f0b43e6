"""Spark's own Kafka connector (`spark-sql-kafka-0-10`, as PySpark teams read and write Kafka)
against the coordinator's Kafka listener, on SQLite and on Postgres (issue 36, item 1).

The connector is unchanged, at the version of the pinned pyspark, on the suite's one Spark
session (`spark.jars`, resolved by the README's test command; a user passes
`spark.jars.packages`). What it asks of the broker is served as Kafka serves it: Metadata, its
AdminClient's ListOffsets (latest, earliest, by timestamp, at the isolation level it reads with),
Fetch, and Produce from its sink.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck
import confluent_kafka.admin
import pytest
from pyspark.errors import StreamingQueryException

from tests.support.kafka_broker import Broker, broker, create_topic
from tests.support.kafka_transactions import transaction, transactional
from tests.support.spark_support import (
    LOCAL_MASTER,
    SPARK_CONF,
    DriverProcess,
    Log,
    require_kafka_connector,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["broker"]

pytestmark = pytest.mark.slow

Drivers = Callable[[dict[str, Any], str], DriverProcess]
STARTUP_S = 240.0  # a JVM, a SparkSession and the first tasks, on a busy 2-core machine


@pytest.fixture(scope="module", autouse=True)
def _connector() -> None:
    require_kafka_connector()


def produce(
    broker: Broker, topic: str, partition: int, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Plain appends over HTTP (`key`, `value`, `headers`, `timestamp` as docs/pages/http-api.md has
    them)."""
    response = broker.http.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        json={"records": records},
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def kafka_read(spark: SparkSession, broker: Broker, **options: str) -> DataFrame:
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows(frame: DataFrame) -> list[tuple[int, int, str | None, str]]:
    """(partition, offset, key, value) of every row, in log order."""
    return sorted(
        (row.partition, row.offset, row.key and row.key.decode(), row.value.decode())
        for row in frame.collect()
    )


def test_batch_read_with_offsets_json_min_partitions_and_headers(
    spark: SparkSession, broker: Broker
) -> None:
    topic = create_topic(broker, partitions=2)
    for partition in (0, 1):
        produce(
            broker,
            topic,
            partition,
            [
                {"key": f"k{partition}-{i}", "value": f"v{partition}-{i}", "headers": {"n": str(i)}}
                for i in range(10)
            ],
        )
    frame = kafka_read(
        spark,
        broker,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 8, "1": -1}}),
        minPartitions="6",
        includeHeaders="true",
    )
    # minPartitions splits the partitions' ranges into at least that many Spark tasks.
    assert frame.rdd.getNumPartitions() >= 6
    collected = frame.collect()
    assert rows(frame) == [(0, i, f"k0-{i}", f"v0-{i}") for i in range(2, 8)] + [
        (1, i, f"k1-{i}", f"v1-{i}") for i in range(10)
    ]
    assert all(row.topic == topic for row in collected)
    assert {
        (row.partition, row.offset): [(h.key, h.value.decode()) for h in row.headers]
        for row in collected
    } == {(row.partition, row.offset): [("n", str(row.offset))] for row in collected}


def test_read_committed_hides_aborted_records_and_markers_with_exact_offsets(
    spark: SparkSession, broker: Broker
) -> None:
    """Offsets 0-2 committed, 3 their commit marker, 4-5 aborted, 6 the abort marker, 7-8
    committed, 9 their marker, 10 the first record of a transaction still open: read_committed
    rows are exactly offsets 0, 1, 2, 7, 8, and read_uncommitted adds the aborted and the open
    ones, never a marker."""
    topic = create_topic(broker)
    producer = transactional(broker.bootstrap)
    transaction(producer, topic, ["c0", "c1", "c2"], commit=True)
    transaction(producer, topic, ["a0", "a1"], commit=False)
    transaction(producer, topic, ["c3", "c4"], commit=True)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    try:
        committed = kafka_read(
            spark, broker, subscribe=topic, **{"kafka.isolation.level": "read_committed"}
        )
        assert [(offset, value) for _, offset, _, value in rows(committed)] == [
            (0, "c0"),
            (1, "c1"),
            (2, "c2"),
            (7, "c3"),
            (8, "c4"),
        ]
        uncommitted = kafka_read(spark, broker, subscribe=topic)
        assert [(offset, value) for _, offset, _, value in rows(uncommitted)] == [
            (0, "c0"),
            (1, "c1"),
            (2, "c2"),
            (4, "a0"),
            (5, "a1"),
            (7, "c3"),
            (8, "c4"),
            (10, "open"),
        ]
    finally:
        producer.abort_transaction(30)


def test_offsets_by_timestamp_start_and_end_where_kafka_would(
    spark: SparkSession, broker: Broker
) -> None:
    """startingOffsetsByTimestamp / endingOffsetsByTimestamp: the connector's AdminClient asks
    ListOffsets for the first offset whose timestamp is at or after each."""
    topic = create_topic(broker)
    produce(
        broker,
        topic,
        0,
        [{"value": f"t{i}", "timestamp": 1_700_000_000_000 + 1000 * i} for i in range(5)],
    )
    frame = kafka_read(
        spark,
        broker,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": 1_700_000_001_500}}),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": 1_700_000_003_500}}),
    )
    assert [(offset, value) for _, offset, _, value in rows(frame)] == [(2, "t2"), (3, "t3")]
    assert [row.timestamp.timestamp() for row in frame.orderBy("offset").collect()] == [
        1_700_000_002.0,
        1_700_000_003.0,
    ]


def stream_to_parquet(spark: SparkSession, broker: Broker, work: Path, **options: str) -> Any:
    """One run of a streaming read to a Parquet sink (exactly once with its checkpoint) over
    what the topic holds now (`availableNow`); the query, terminated."""
    reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):  # the query keeps it: .exception()
        query.awaitTermination(120)
    return query


def streamed(spark: SparkSession, work: Path) -> list[tuple[str, int, int, str]]:
    return sorted(
        (row.topic, row.partition, row.offset, row.value)
        for row in spark.read.parquet(str(work / "out")).collect()
    )


def test_a_stream_resumes_from_its_checkpoint_exactly(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    topic = create_topic(broker, partitions=2)
    for partition in (0, 1):
        produce(broker, topic, partition, [{"value": f"a{partition}{i}"} for i in range(3)])
    first = stream_to_parquet(spark, broker, tmp_path, subscribe=topic, startingOffsets="earliest")
    assert first.exception() is None
    assert len(streamed(spark, tmp_path)) == 6
    for partition in (0, 1):
        produce(broker, topic, partition, [{"value": f"b{partition}{i}"} for i in range(2)])
    second = stream_to_parquet(spark, broker, tmp_path, subscribe=topic)
    assert second.exception() is None
    assert streamed(spark, tmp_path) == sorted(
        [(topic, p, i, f"a{p}{i}") for p in (0, 1) for i in range(3)]
        + [(topic, p, 3 + i, f"b{p}{i}") for p in (0, 1) for i in range(2)]
    )


def delete_records(broker: Broker, topic: str, offset: int) -> None:
    response = broker.http.post(
        f"/v1/topics/{topic}/delete-records",
        json={"partitions": [{"partition": 0, "offset": offset}]},
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_data_removed_under_a_checkpoint_is_reported_as_spark_reports_it(
    spark: SparkSession, broker: Broker, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """The checkpoint points at offset 3; delete-records then moves the log start to 5. With
    failOnDataLoss (the default) the query fails, naming the loss; without, it goes on from the
    log start and reads 5-6 only."""
    topic = create_topic(broker)
    produce(broker, topic, 0, [{"value": f"v{i}"} for i in range(3)])
    options = {
        "subscribe": topic,
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    assert stream_to_parquet(spark, broker, tmp_path, **options).exception() is None
    produce(broker, topic, 0, [{"value": f"v{i}"} for i in range(3, 7)])
    delete_records(broker, topic, 5)
    query = stream_to_parquet(spark, broker, tmp_path, **options)
    if fail_on_data_loss:
        assert query.exception() is not None
        assert "lost" in str(query.exception()).lower(), query.exception()
        assert [offset for _, _, offset, _ in streamed(spark, tmp_path)] == [0, 1, 2]
    else:
        assert query.exception() is None
        assert [offset for _, _, offset, _ in streamed(spark, tmp_path)] == [0, 1, 2, 5, 6]


def until_rows(spark: SparkSession, table: str, count: int) -> list[tuple[str, int, str]]:
    """The memory sink's rows once it holds `count` (polled; the query runs meanwhile)."""
    deadline = time.monotonic() + 90
    while True:
        got = sorted(
            (row.topic, row.partition, row.value)
            for row in spark.sql(f"SELECT topic, partition, value FROM {table}").collect()
        )
        if len(got) >= count or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_subscribe_pattern_finds_new_topics_and_partitions_while_the_stream_runs(
    spark: SparkSession, broker: Broker
) -> None:
    """A running query subscribed by pattern reads a topic created after it started, and a
    partition added to its topic (CreatePartitions, through Kafka's AdminClient) from offset 0."""
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    first = f"{prefix}-a"
    assert broker.http.post("/v1/topics", json={"name": first}).status_code == 201
    produce(broker, first, 0, [{"value": "a0"}])
    table = prefix.replace("-", "_")
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribePattern", f"{prefix}-.*")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("topic", "partition", "CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName(table)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        assert until_rows(spark, table, 1) == [(first, 0, "a0")]
        admin = ck.admin.AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_partitions([ck.admin.NewPartitions(first, 2)])[first].result(30)
        second = f"{prefix}-b"
        assert broker.http.post("/v1/topics", json={"name": second}).status_code == 201
        produce(broker, first, 1, [{"value": "a1"}])
        produce(broker, second, 0, [{"value": "b0"}])
        assert until_rows(spark, table, 3) == [
            (first, 0, "a0"),
            (first, 1, "a1"),
            (second, 0, "b0"),
        ]
        assert query.exception() is None
    finally:
        query.stop()


def test_the_kafka_sink_writes_into_the_listener_in_batch_and_streaming(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    """`write.format("kafka")` with key, value, headers and a partition column; then a stream
    from that topic through the sink into another, which holds each record once."""
    source, copy = create_topic(broker, partitions=2), create_topic(broker, partitions=2)
    frame = spark.createDataFrame(
        [(f"k{i}", f"v{i}", i % 2, [("n", str(i).encode())]) for i in range(6)],
        "key STRING, value STRING, partition INT, "
        "headers ARRAY<STRUCT<key: STRING, value: BINARY>>",
    )
    (
        frame.write.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", source)
        .save()
    )
    written = kafka_read(spark, broker, subscribe=source, includeHeaders="true").collect()
    assert sorted(
        (row.partition, row.key.decode(), row.value.decode(), row.headers[0].value.decode())
        for row in written
    ) == sorted((i % 2, f"k{i}", f"v{i}", str(i)) for i in range(6))

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value", "partition")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", copy)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    copied = kafka_read(spark, broker, subscribe=copy).collect()
    assert sorted(
        (row.partition, row.key.decode(), row.value.decode()) for row in copied
    ) == sorted((i % 2, f"k{i}", f"V{i}") for i in range(6))


class TransactionsInTheBackground:
    """A Kafka team's producer (librdkafka), writing transactions of 4 records over the
    source's 2 partitions until stopped; every 4th is aborted. `committed` holds the values a
    read_committed reader must see."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.producer = transactional(broker.bootstrap)
        self.topic = topic
        self.committed: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.failure: BaseException | None = None

    def __enter__(self) -> TransactionsInTheBackground:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                values = [f"r{self.rounds}-{j}" for j in range(4)]
                commit = self.rounds % 4 != 3
                self.producer.begin_transaction()
                for j, value in enumerate(values):
                    self.producer.produce(self.topic, value=value.encode(), partition=j % 2)
                self.producer.flush(30)
                if commit:
                    self.producer.commit_transaction(30)
                    self.committed += values
                else:
                    self.producer.abort_transaction(30)
                self.rounds += 1
                self._stop.wait(0.2)  # a few transactions a second: enough to interleave
        except BaseException as exc:  # reported by stop()
            self.failure = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.failure is None, self.failure

    def __exit__(self, *exc: object) -> None:
        self.stop()


def test_kafka_source_to_txlog_is_exactly_once_through_two_driver_kills(
    spark: SparkSession,
    broker: Broker,
    driver_processes: Drivers,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """`jobs.mirror` reading with Spark's Kafka source (read_committed) from the listener and
    writing with the txlog streaming sink, while a producer commits and aborts transactions.
    Its driver is SIGKILLed twice: once between the coordinator's commit of a micro-batch and
    Spark's checkpoint of it (the batch is replayed), once wherever the stream is a few
    batches later. A final run from the checkpoint catches up. The copy, read committed, holds
    every committed source record once and no aborted one."""
    from jobs.mirror import Route, Transform, run_stream

    source, target = create_topic(broker, partitions=2), create_topic(broker, partitions=2)
    job = f"kmirror-{uuid.uuid4().hex[:6]}"
    route = {
        "url": broker.url,
        "source": source,
        "target": target,
        "job_id": job,
        "group": job,
        "bootstrap": broker.bootstrap,
    }
    checkpoint = str(tmp_path / "checkpoint")
    spec = {
        "master": LOCAL_MASTER,
        "conf": SPARK_CONF,
        "job": "mirror",
        "route": route,
        "checkpoint": checkpoint,
        "processing_time": "300 milliseconds",
    }
    batches = f"{job}/batches"
    log = Log(broker.url)
    request.addfinalizer(log.close)

    def batch_count() -> int:
        return log.group_offsets(batches, target).get(0, 0)

    with TransactionsInTheBackground(broker, source) as producer:
        first = driver_processes(
            {**spec, "writer_options": {"testing.pauseAfterCommit": "600"}}, "first"
        )
        first.wait_until(lambda: batch_count() >= 1, STARTUP_S, "a micro-batch committed")
        first.kill()
        second = driver_processes(spec, "second")
        reached = batch_count()
        second.wait_until(lambda: batch_count() >= reached + 3, STARTUP_S, "3 more batches")
        second.kill()
        producer.stop()
    run_stream(spark, Route(**route), Transform(value="upper(value)"), checkpoint)

    copied = log.records(target, 0) + log.records(target, 1)
    values = [base64.b64decode(r["value"]).decode() for r in copied]
    assert Counter(values) == Counter(v.upper() for v in producer.committed)
    # Each copy names its source record, and no source record was copied twice.
    origins = [base64.b64decode(r["headers"]["mirror.source"]).decode() for r in copied]
    assert len(origins) == len(set(origins)) == len(copied)
    assert producer.rounds >= 8  # aborted transactions were among what the stream met
    # The first kill mattered: the batch it cut off was replayed, and its second copy aborted.
    assert len(log.values(target, "read_uncommitted")) > len(values)
