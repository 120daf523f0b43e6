"""Mirror: copy one topic into another exactly once, with a transform on the way (the
MirrorMaker case), on one coordinator.

Every source record becomes at most one target record (none if `--where` filters it out):
key, value and headers carried over, the value (or key) rewritten by a Spark SQL expression,
and a `mirror.source` header naming the source record (`topic/partition/offset`), so each can
be traced back and a copy that appears twice is visible. With `--preserve-partitions` a record
keeps its partition number (the target needs as many partitions).

Batch mode copies what the group has not copied yet, up to the source's last stable offsets
pinned before reading, and commits those offsets with the output in one commit: a rerun copies
only new records. Streaming mode writes with the txlog streaming sink, whose every micro-batch
commits once (a batch replayed from the checkpoint after a crash is recognised, not rewritten).

    python -m jobs.mirror --coordinator-url http://127.0.0.1:8080 --source payments \\
        --target payments-eu --value-expr "upper(value)"
    python -m jobs.mirror --coordinator-url http://127.0.0.1:8080 --source payments \\
        --target payments-copy --mode stream --checkpoint /tmp/mirror-checkpoint
    spark-submit jobs/mirror.py --coordinator-url http://127.0.0.1:8080 --source a --target b
    # A Kafka team's shape: Spark's own Kafka source (read_committed) from the coordinator's
    # Kafka listener, the txlog streaming sink into the coordinator, exactly once per batch.
    python -m jobs.mirror --coordinator-url http://127.0.0.1:8080 --source payments \
        --target payments-copy --mode stream --checkpoint /tmp/ck \
        --kafka-bootstrap-servers 127.0.0.1:9092
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs.cluster import run_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_HEADER = "mirror.source"
EARLIEST = -2


@dataclass(frozen=True)
class Transform:
    """What happens to a record on its way: Spark SQL expressions over the source's columns
    (`key` and `value` as strings, `topic`, `partition`, `offset`, `timestamp`, `headers`)."""

    value: str = "value"
    key: str = "key"
    where: str | None = None  # a predicate: records it rejects are skipped (their offsets too)
    preserve_partitions: bool = False


def mirrored(records: DataFrame, transform: Transform) -> DataFrame:
    """Source records as the txlog source reads them -> target records for the txlog writer:
    `key`, `value`, `headers` (with `mirror.source` set), and `partition` when preserved."""
    from pyspark.sql import functions as F

    text = records.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "topic",
        "partition",
        "offset",
        "timestamp",
        "headers",
    )
    if transform.where:
        text = text.where(F.expr(transform.where))
    origin = F.struct(
        F.lit(SOURCE_HEADER).alias("key"),
        F.concat_ws("/", "topic", F.col("partition").cast("string"), F.col("offset").cast("string"))
        .cast("binary")
        .alias("value"),
    )
    # A mirror of a mirror: the newest origin replaces the older one (one value per name).
    kept = F.filter(F.coalesce("headers", F.array()), lambda h: h["key"] != F.lit(SOURCE_HEADER))
    columns = [
        F.expr(transform.key).alias("key"),
        F.expr(transform.value).alias("value"),
        F.concat(kept, F.array(origin)).alias("headers"),
    ]
    if transform.preserve_partitions:
        columns.append(F.col("partition"))
    return text.select(*columns)


@dataclass(frozen=True)
class Route:
    url: str
    source: str
    target: str
    job_id: str = "mirror"
    group: str = "mirror"
    token: str | None = None
    # Read the source with Spark's own Kafka source (`format("kafka")`, read_committed) from
    # these bootstrap servers, e.g. the coordinator's Kafka listener, instead of `txlog`.
    bootstrap: str | None = None
    # Read the source as a queue: this share group's records (KIP-932), each batch's
    # acknowledgements committed with its copy (`txshare`); several mirrors may drain it.
    share_group: str | None = None

    def auth(self) -> dict[str, str]:
        return {"coordinator.token": self.token} if self.token else {}

    def stream_source(
        self,
        spark: SparkSession,
        starting_offsets: str,
        reader_options: Mapping[str, str] | None = None,
    ) -> DataFrame:
        """The source as a stream: `txlog`, or Spark's Kafka source with `bootstrap`. Both read
        committed records only and give the same columns (headers included). With
        `share_group`, `txshare`: the group's records, as a queue."""
        if self.share_group is not None:
            return (
                spark.readStream.format("txshare")
                .option("coordinator.url", self.url)
                .option("shareGroup", self.share_group)
                .option("subscribe", self.source)
                .option("jobId", self.job_id)
                .options(**self.auth())
                .options(**dict(reader_options or {}))
                .load()
            )
        if self.bootstrap is None:
            return (
                spark.readStream.format("txlog")
                .option("coordinator.url", self.url)
                .option("subscribe", self.source)
                .option("startingOffsets", starting_offsets)
                .options(**self.auth())
                .options(**dict(reader_options or {}))
                .load()
            )
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.source)
            .option("startingOffsets", starting_offsets)
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .options(**dict(reader_options or {}))
            .load()
        )


def run_batch(
    spark: SparkSession,
    route: Route,
    transform: Transform,
    *,
    writer_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Copy what the group has not copied yet; commit the source offsets with the copy.
    Returns the offsets range read (`offsets` 0: nothing new; records `where` rejects and
    markers are in the range but not copied)."""
    from jobs.settlement import pending
    from sdk.spark import committed_offsets, latest_offsets, offsets_json

    start = committed_offsets(route.url, route.group, [route.source], token=route.token)
    end = latest_offsets(route.url, [route.source], token=route.token)
    outcome = {"start": start, "end": end, "offsets": pending(start, end)}
    if outcome["offsets"] == 0:
        return outcome
    records = (
        spark.read.format("txlog")
        .option("coordinator.url", route.url)
        .option("subscribe", route.source)
        .option("startingOffsets", offsets_json(start))
        .option("endingOffsets", offsets_json(end))
        .options(**route.auth())
        .load()
    )
    (
        mirrored(records, transform)
        .write.format("txlog")
        .mode("append")
        .option("coordinator.url", route.url)
        .option("topic", route.target)
        .option("jobId", route.job_id)
        .option("offsets.group", route.group)
        .option("offsets", offsets_json(end))
        .options(**route.auth())
        .options(**dict(writer_options or {}))
        .save()
    )
    return outcome


def run_stream(
    spark: SparkSession,
    route: Route,
    transform: Transform,
    checkpoint: str,
    *,
    processing_time: str | None = None,
    run_seconds: int | None = None,
    writer_options: Mapping[str, str] | None = None,
    reader_options: Mapping[str, str] | None = None,
) -> None:
    """Copy as a stream into the txlog streaming sink (each micro-batch one commit, the batch
    id with it, so a batch replayed from the checkpoint after a crash is not written twice).
    Without `processing_time`, copies what is there and stops (Trigger.AvailableNow). A first
    start, without a checkpoint, begins at the group's committed offsets (those of a batch
    mirror); after that the checkpoint says where the stream is."""
    from sdk.spark import committed_offsets, offsets_json

    start = (
        {}  # a queue has no offsets: its share group hands out the records
        if route.share_group is not None
        else committed_offsets(route.url, route.group, [route.source], token=route.token)
    )
    stream = route.stream_source(spark, offsets_json(start), reader_options)
    writer = (
        mirrored(stream, transform)
        .writeStream.format("txlog")
        .option("coordinator.url", route.url)
        .option("topic", route.target)
        .option("jobId", route.job_id)
        .option("checkpointLocation", checkpoint)
        .options(**route.auth())
        .options(**dict(writer_options or {}))
    )
    run_query(writer, processing_time, run_seconds, "mirror")


def build_parser() -> argparse.ArgumentParser:
    from jobs.cluster import add_spark_arguments

    parser = argparse.ArgumentParser(
        prog="python -m jobs.mirror",
        description="Copy a topic into another exactly once, transforming each record with "
        "Spark SQL expressions; the source offsets commit with the copy.",
    )
    parser.add_argument("--coordinator-url", required=True, help="the coordinator's base URL")
    parser.add_argument("--token", help="bearer token (needs the transactional id prefix JOB_ID/)")
    parser.add_argument("--source", required=True, help="topic to copy from")
    parser.add_argument("--target", required=True, help="topic to copy into (must exist)")
    parser.add_argument("--mode", choices=["batch", "stream"], default="batch", help="(batch)")
    parser.add_argument(
        "--kafka-bootstrap-servers",
        metavar="HOST:PORT",
        help="stream mode: read the source with Spark's own Kafka source (format kafka, "
        "read_committed) from these servers, e.g. the coordinator's Kafka listener; needs the "
        "connector on the session (spark.jars.packages="
        "org.apache.spark:spark-sql-kafka-0-10_2.13:SPARK_VERSION)",
    )
    parser.add_argument(
        "--job-id",
        help="stable name of the job across reruns (default: mirror-SOURCE-TARGET, with "
        "-stream in stream mode); its transactions are JOB_ID/...",
    )
    parser.add_argument("--group", help="consumer group of the source (default: the job id)")
    parser.add_argument(
        "--share-group",
        help="stream mode: read the source as a queue, this share group's records (KIP-932; "
        "set its share.auto.offset.reset first), each micro-batch's acknowledgements "
        "committed with its copy; several mirrors of one share group split the records",
    )
    parser.add_argument(
        "--value-expr",
        default="value",
        help="Spark SQL for the new value over key, value (strings), topic, partition, offset, "
        'timestamp, headers; e.g. "upper(value)" (value: unchanged)',
    )
    parser.add_argument("--key-expr", default="key", help="Spark SQL for the new key (key)")
    parser.add_argument("--where", help="Spark SQL predicate: records it rejects are skipped")
    parser.add_argument(
        "--preserve-partitions",
        action="store_true",
        help="write each record to its source partition number (default: by key, as produce)",
    )
    add_spark_arguments(parser, "copy")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "stream" and not args.checkpoint:
        print("--mode stream needs --checkpoint", file=sys.stderr)
        return 2
    if args.kafka_bootstrap_servers and args.mode != "stream":
        print("--kafka-bootstrap-servers reads a stream: add --mode stream", file=sys.stderr)
        return 2
    if args.share_group and args.mode != "stream":
        print("--share-group reads a stream: add --mode stream", file=sys.stderr)
        return 2
    from jobs.cluster import kafka_connector_package, session
    from sdk.spark import register

    suffix = "-stream" if args.mode == "stream" else ""
    job_id = args.job_id or f"mirror-{args.source}-{args.target}{suffix}"
    route = Route(
        args.coordinator_url,
        args.source,
        args.target,
        job_id,
        args.group or job_id,
        args.token,
        args.kafka_bootstrap_servers,
        args.share_group,
    )
    transform = Transform(args.value_expr, args.key_expr, args.where, args.preserve_partitions)
    conf = {}
    if args.kafka_bootstrap_servers and args.master:
        conf["spark.jars.packages"] = kafka_connector_package()
    spark = session(f"mirror-{args.mode}", args.master, conf=conf)
    try:
        register(spark)
        if args.mode == "batch":
            outcome = run_batch(spark, route, transform)
            print(json.dumps({"mode": "batch", "job_id": job_id, **outcome}))
        else:
            run_stream(
                spark,
                route,
                transform,
                args.checkpoint,
                processing_time=args.processing_time,
                run_seconds=args.run_seconds,
            )
            print(json.dumps({"mode": "stream", "job_id": job_id}))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
