"""The txlog reader's options and columns, and the options both sides refuse: a bad option
fails the read or the write before anything runs, with an error that names it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sdk import KafkaException, Producer
from sdk.spark._source import OffsetRange, _ReadSettings
from tests.support.spark_support import Log, unique

pytestmark = pytest.mark.slow

KAFKA_SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def reader(spark: SparkSession, log: Log, topic: str, **options: str) -> DataFrame:
    return (
        spark.read.format("txlog")
        .option("coordinator.url", log.url)
        .option("subscribe", topic)
        .options(**options)
        .load()
    )


def texts(df: DataFrame) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of every row, sorted."""
    rows = df.select("partition", "offset", "value").collect()
    return sorted((r.partition, r.offset, bytes(r.value).decode()) for r in rows)


def transactional(log: Log) -> Producer:
    producer = Producer(
        {"coordinator.url": log.url, "transactional.id": unique("input"), "linger.ms": 1}
    )
    producer.init_transactions()
    return producer


def test_columns_and_types_are_those_of_spark_kafka_source(spark: SparkSession, log: Log) -> None:
    topic = log.create_topic(unique("typed"), 2)
    with Producer({"coordinator.url": log.url, "linger.ms": 1}) as producer:
        producer.produce(
            topic,
            value=b"\x00value\xff",
            key=b"\xfe\x00key",
            partition=1,
            headers=[("trace", b"\x01\x02"), ("kind", b"payment")],
        )
        producer.flush(30)
    written = log.records(topic, 1)[0]

    df = reader(spark, log, topic)
    assert df.schema == KAFKA_SOURCE_SCHEMA
    assert df.rdd.getNumPartitions() == 1  # one per partition with records; partition 0 has none
    (row,) = df.collect()
    assert bytes(row.key) == b"\xfe\x00key" and bytes(row.value) == b"\x00value\xff"
    assert (row.topic, row.partition, row.offset) == (topic, 1, 0)
    stamp = dt.datetime.fromtimestamp(written["timestamp"] / 1000)  # Spark's session time zone
    assert row.timestamp == stamp
    assert sorted((h.key, bytes(h.value)) for h in row.headers) == [
        ("kind", b"payment"),
        ("trace", b"\x01\x02"),
    ]


def test_binary_keys_values_and_headers_round_trip_through_write_and_read(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("binary"), 2)
    rows = [
        (bytes([i, 0xFF, 0x00]), bytes([0x80 + i]) * 3, i % 2, [("h", bytes([i, 0xFE]))])
        for i in range(6)
    ]
    schema = (
        "key binary, value binary, partition int, headers array<struct<key string, value binary>>"
    )
    (
        spark.createDataFrame(rows, schema)
        .write.format("txlog")
        .option("coordinator.url", log.url)
        .option("topic", topic)
        .option("jobId", unique("binary"))
        .mode("append")
        .save()
    )

    read = reader(spark, log, topic).collect()
    got = sorted(
        (bytes(r.key), bytes(r.value), r.partition, [(h.key, bytes(h.value)) for h in r.headers])
        for r in read
    )
    assert got == sorted(rows)


def test_starting_and_ending_offsets_given_as_json(spark: SparkSession, log: Log) -> None:
    topic = log.create_topic(unique("ranges"), 2)
    log.append(topic, 0, [f"p0-{i}" for i in range(10)])
    log.append(topic, 1, [f"p1-{i}" for i in range(10)])

    df = reader(
        spark,
        log,
        topic,
        startingOffsets=f'{{"{topic}": {{"0": 2, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 5, "1": -1}}}}',
    )
    assert texts(df) == [(0, i, f"p0-{i}") for i in range(2, 5)] + [
        (1, i, f"p1-{i}") for i in range(10)
    ]
    # A partition left out of the JSON starts at the earliest and ends at the latest offset.
    only_ending = reader(spark, log, topic, endingOffsets=f'{{"{topic}": {{"1": 3}}}}')
    assert texts(only_ending) == [(0, i, f"p0-{i}") for i in range(10)] + [
        (1, i, f"p1-{i}") for i in range(3)
    ]
    latest = reader(spark, log, topic, startingOffsets="latest")
    assert texts(latest) == []


def test_fail_on_data_loss_fails_on_deleted_offsets_unless_false(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("lost"))
    log.append(topic, 0, [f"v{i}" for i in range(6)])
    deleted = log.http.post(
        f"/v1/topics/{topic}/delete-records",
        json={"partitions": [{"partition": 0, "offset": 3}]},
    )
    assert deleted.status_code == 200, deleted.text
    asked = f'{{"{topic}": {{"0": 1}}}}'
    with pytest.raises(Exception, match=r"offset 1 was asked for, but the log now starts at 3"):
        reader(spark, log, topic, startingOffsets=asked).collect()
    lenient = reader(spark, log, topic, startingOffsets=asked, failOnDataLoss="false")
    assert texts(lenient) == [(0, i, f"v{i}") for i in range(3, 6)]
    # The default, earliest, starts at the log start: nothing asked for was lost.
    assert texts(reader(spark, log, topic)) == [(0, i, f"v{i}") for i in range(3, 6)]


def test_a_range_planned_before_a_deletion_follows_fail_on_data_loss(log: Log) -> None:
    """Records deleted between planning (the driver) and reading (a task): the task's fetch is
    OFFSET_OUT_OF_RANGE and failOnDataLoss decides. The task's read, driven directly."""
    topic = log.create_topic(unique("lost-late"))
    log.append(topic, 0, [f"v{i}" for i in range(6)])
    planned = OffsetRange(topic, 0, 1, 6)
    deleted = log.http.post(
        f"/v1/topics/{topic}/delete-records",
        json={"partitions": [{"partition": 0, "offset": 4}]},
    )
    assert deleted.status_code == 200, deleted.text
    strict = _ReadSettings(log.url, None, (topic,), "read_committed")
    with pytest.raises(KafkaException, match="offset 1 was asked for, but the log now starts at 4"):
        list(strict.read(planned))
    lenient = dataclasses.replace(strict, fail_on_data_loss=False)
    assert [row[4] for row in lenient.read(planned)] == [4, 5]


def test_read_committed_never_returns_aborted_or_open_records_and_read_uncommitted_does(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("isolation"))
    committed, aborted, still_open = transactional(log), transactional(log), transactional(log)
    committed.begin_transaction()
    committed.produce(topic, value="committed", partition=0)
    committed.commit_transaction()
    aborted.begin_transaction()
    aborted.produce(topic, value="aborted", partition=0)
    aborted.flush(30)
    aborted.abort_transaction()
    log.append(topic, 0, ["plain-before"])
    still_open.begin_transaction()
    still_open.produce(topic, value="open", partition=0)
    still_open.flush(30)
    log.append(topic, 0, ["plain-after"])  # behind the open transaction: not stable yet

    values = [v for _, _, v in texts(reader(spark, log, topic))]
    assert values == ["committed", "plain-before"]
    everything = [
        v for _, _, v in texts(reader(spark, log, topic, **{"isolation.level": "read_uncommitted"}))
    ]
    assert everything == ["committed", "aborted", "plain-before", "open", "plain-after"]

    still_open.commit_transaction()
    values = [v for _, _, v in texts(reader(spark, log, topic))]
    assert values == ["committed", "plain-before", "open", "plain-after"]
    for producer in (committed, aborted, still_open):
        producer.close()


def test_a_streaming_read_takes_max_offsets_per_trigger_and_skips_aborted_and_open_records(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    topic = log.create_topic(unique("stream-in"))
    log.append(topic, 0, [str(i) for i in range(6)])  # offsets 0..5
    aborted, still_open = transactional(log), transactional(log)
    aborted.begin_transaction()
    aborted.produce(topic, value="aborted", partition=0)
    aborted.produce(topic, value="aborted", partition=0)
    aborted.flush(30)
    aborted.abort_transaction()  # records at 6 and 7, the abort marker at 8
    log.append(topic, 0, [str(i) for i in range(6, 10)])  # offsets 9..12
    still_open.begin_transaction()
    still_open.produce(topic, value="open", partition=0)  # offset 13: beyond the LSO
    still_open.flush(30)

    batches: list[list[str]] = []

    def each_batch(df: DataFrame, batch_id: int) -> None:
        batches.append([bytes(r.value).decode() for r in df.orderBy("offset").collect()])

    query = (
        spark.readStream.format("txlog")
        .option("coordinator.url", log.url)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4")
        .load()
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=120)
    assert not query.isActive and query.exception() is None

    # Offsets [0, 4), [4, 8), [8, 12), [12, 13): the aborted records and the marker take
    # offsets but are never returned; the open transaction's record is not reached.
    assert batches == [["0", "1", "2", "3"], ["4", "5"], ["6", "7", "8"], ["9"]]
    for producer in (aborted, still_open):
        producer.close()


Build = Callable[[SparkSession, str, str], Any]


def _read(**options: str) -> Build:
    def run(spark: SparkSession, url: str, topic: str) -> Any:
        given = {"coordinator.url": url, "subscribe": topic, **options}
        given = {k: v for k, v in given.items() if v is not None}
        return spark.read.format("txlog").options(**given).load().collect()

    return run


def _write(mode: str = "append", **options: str | None) -> Build:
    def run(spark: SparkSession, url: str, topic: str) -> Any:
        given = {"coordinator.url": url, "topic": topic, "jobId": "refused", **options}
        given = {k: v for k, v in given.items() if v is not None}
        df = spark.range(3).selectExpr("cast(id as string) as value")
        return df.write.format("txlog").options(**given).mode(mode).save()

    return run


BAD_OPTIONS = {
    "read without coordinator.url": (
        _read(**{"coordinator.url": None}),
        "coordinator.url: required option",
    ),
    "read with startingOffsets not JSON": (
        _read(startingOffsets='{"t": {"0": '),
        "startingOffsets: not JSON",
    ),
    "read with an endingOffsets that is no offset": (
        _read(endingOffsets='{"t": {"0": "twelve"}}'),
        "endingOffsets: t/0: 'twelve' is not an offset",
    ),
    "read with a bad failOnDataLoss": (
        _read(failOnDataLoss="maybe"),
        "failOnDataLoss: 'maybe' is neither true nor false",
    ),
    "read with a bad isolation.level": (
        _read(**{"isolation.level": "serializable"}),
        "isolation.level: 'serializable' is not one of",
    ),
    "write without coordinator.url": (
        _write(**{"coordinator.url": None}),
        "coordinator.url: required option",
    ),
    "write without jobId": (_write(jobId=None), "jobId: required for exactly-once writes"),
    "write with a jobId holding a slash": (_write(jobId="etl/1"), "jobId: 'etl/1' must match"),
    "write in overwrite mode": (_write(mode="overwrite"), "mode: a log is only appended to"),
    "write with offsets not JSON": (
        _write(**{"offsets.group": "g", "offsets": "{not json"}),
        "offsets: not JSON",
    ),
    "write with offsets but no offsets.group": (
        _write(offsets='{"t": {"0": 1}}'),
        "offsets, offsets.group: give both or neither",
    ),
    "write with a bad delivery.guarantee": (
        _write(**{"delivery.guarantee": "exactly_twice"}),
        "delivery.guarantee: 'exactly_twice' is not one of",
    ),
    "write with offsets at least once": (
        _write(**{"delivery.guarantee": "at_least_once", "offsets.group": "g", "offsets": "{}"}),
        "offsets: committed with the output only by delivery.guarantee=exactly_once",
    ),
    "write with a pause that is no number": (
        _write(**{"testing.pauseBeforeCommit": "soon"}),
        "testing.pauseBeforeCommit: 'soon' is not a number of seconds",
    ),
    "write with a kill fault that is not JSON": (
        _write(**{"testing.kill": "{after"}),
        "testing.kill: not JSON",
    ),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_a_bad_option_fails_with_an_error_naming_it(
    spark: SparkSession, log: Log, case: str
) -> None:
    topic = log.create_topic(unique("refused"))
    build, message = BAD_OPTIONS[case]
    with pytest.raises(AnalysisException, match=re.escape(message)):
        build(spark, log.url, topic)
    assert log.values(topic, "read_uncommitted") == []
    assert log.transactions("refused/") == {}
