"""Settlement: per-merchant totals of the payments in a `payments` topic, written to `settlements`
exactly once, with the input offsets committed for the job's consumer group in the same commit.

A payment is a JSON event `{"payment_id", "merchant", "amount": "12.50", "currency"}` (amounts are
decimal strings, never floats). One settlement record per merchant and currency per run:
`{"batch", "merchant", "currency", "total": "1234.50", "total_minor": 123450, "count": 98}`,
keyed by merchant. A malformed payment goes, unchanged, to a dead-letter topic
(`payments-rejected`) in the same transaction. `batch` names the input a run settled, so a
record that appears twice is a duplicate, and the sum of a merchant's records is what it is
owed.

With `--sql-url` the settlements go into a SQL table instead (`--sql-table`, created when
missing) through the `txsql` writer: one row per settlement, one per malformed payment (its raw
text in `rejected`), and the input offsets in the same database transaction of that database,
where the next run reads them. With `--bank-url` every committed settlement is then paid out to
the merchant through `EffectsClient.once` (key `{job_id}/payout/...`): once per settlement,
whatever Spark retries, speculates or reruns.

Batch mode settles what arrived since the group's committed offsets up to the payments' last
stable offsets, pinned before reading, and commits those same offsets with the output: a rerun
settles only new payments, and a failed run settles nothing. Streaming mode settles each
micro-batch (`foreachBatch`) with its batch id, so a replayed batch is not settled twice.

    python -m jobs.settlement --coordinator-url http://127.0.0.1:8080              # batch
    python -m jobs.settlement --coordinator-url http://127.0.0.1:8080 \
        --sql-url sqlite:///ledger.db --bank-url http://127.0.0.1:9000/pay       # SQL, payouts
    python -m jobs.settlement --coordinator-url http://127.0.0.1:8080 --mode stream \\
        --checkpoint /tmp/settlement-checkpoint
    spark-submit jobs/settlement.py --coordinator-url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from jobs.cluster import run_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

Offsets = dict[str, dict[int, int]]

PAYMENT_SCHEMA = "payment_id string, merchant string, amount string, currency string"
EARLIEST = -2
CENTS = Decimal("0.01")


# -- the payments and their settlement, in plain Python -------------------------------------------
# What the Spark job computes, in a form the demo's ground truth and the tests share.


def to_minor(amount: Decimal | str) -> int:
    """An amount in minor units (cents); refuses fractions of a cent, NaN and infinities."""
    try:
        value = Decimal(amount)
    except InvalidOperation:
        raise ValueError(f"not an amount: {amount!r}") from None
    if not value.is_finite() or value != value.quantize(CENTS):
        raise ValueError(f"not an amount in cents: {amount!r}")
    return int(value * 100)


def format_minor(minor: int) -> str:
    """Minor units as a decimal string with two places: 123450 -> '1234.50'."""
    return str((Decimal(minor) / 100).quantize(CENTS))


@dataclass(frozen=True)
class Payment:
    payment_id: str
    merchant: str
    amount_minor: int
    currency: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "payment_id": self.payment_id,
                "merchant": self.merchant,
                "amount": format_minor(self.amount_minor),
                "currency": self.currency,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Payment:
        doc = json.loads(text)
        return cls(doc["payment_id"], doc["merchant"], to_minor(doc["amount"]), doc["currency"])


@dataclass(frozen=True)
class Settlement:
    batch: str
    merchant: str
    currency: str
    total_minor: int
    count: int

    @property
    def key(self) -> tuple[str, str, str]:
        """What must be unique in the settlements topic."""
        return (self.batch, self.merchant, self.currency)

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch": self.batch,
                "merchant": self.merchant,
                "currency": self.currency,
                "total": format_minor(self.total_minor),
                "total_minor": self.total_minor,
                "count": self.count,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Settlement:
        doc = json.loads(text)
        total = to_minor(doc["total"])
        if total != doc["total_minor"]:
            raise ValueError(f"total {doc['total']} and total_minor {doc['total_minor']} differ")
        return cls(doc["batch"], doc["merchant"], doc["currency"], total, doc["count"])


def settle(payments: Iterable[Payment], batch: str) -> list[Settlement]:
    """The settlement of `payments` as one batch, sorted by merchant and currency."""
    totals: dict[tuple[str, str], list[int]] = {}
    for payment in payments:
        tally = totals.setdefault((payment.merchant, payment.currency), [0, 0])
        tally[0] += payment.amount_minor
        tally[1] += 1
    return [
        Settlement(batch, merchant, currency, total, count)
        for (merchant, currency), (total, count) in sorted(totals.items())
    ]


def batch_label(start: Offsets, end: Offsets) -> str:
    """Names a batch run's input: `payments:0@0-120,1@0-98` (earliest written as 0)."""
    parts = []
    for topic in sorted(end):
        ranges = ",".join(
            f"{p}@{max(start.get(topic, {}).get(p, EARLIEST), 0)}-{end[topic][p]}"
            for p in sorted(end[topic])
        )
        parts.append(f"{topic}:{ranges}")
    return ";".join(parts)


def pending(start: Offsets, end: Offsets) -> int:
    """Offsets between the committed positions and the pinned ends (markers included): 0 means
    there is nothing to settle."""
    return sum(
        max(0, last - max(start.get(topic, {}).get(p, EARLIEST), 0))
        for topic, partitions in end.items()
        for p, last in partitions.items()
    )


# -- the Spark job ---------------------------------------------------------------------------------


def _totals_and_rejected(payments: DataFrame, partitions: int) -> tuple[DataFrame, DataFrame]:
    """Payments as the txlog source reads them -> per-merchant-and-currency totals (`merchant`,
    `currency`, `total` decimal, `count`) in `partitions` tasks (hashed by merchant: one shuffle,
    not coalesced by AQE, so a task's output is known in advance), and the malformed payments
    as they were (`key`, `value`)."""
    from pyspark.sql import functions as F

    parsed = payments.select(
        "key",
        "value",
        F.from_json(F.col("value").cast("string"), PAYMENT_SCHEMA).alias("p"),
    )
    # An amount in cents, written out: "12.5" and "-3.00" pass, "12.345" and "1e3" do not.
    good = (
        F.col("p.merchant").isNotNull()
        & F.col("p.currency").isNotNull()
        & F.coalesce(F.col("p.amount").rlike(r"^-?[0-9]{1,16}(\.[0-9]{1,2})?$"), F.lit(False))
    )
    valid = parsed.where(good).select(
        F.col("p.merchant").alias("merchant"),
        F.col("p.currency").alias("currency"),
        F.col("p.amount").cast("decimal(18,2)").alias("amount"),
    )
    totals = (
        valid.repartition(partitions, "merchant")
        .groupBy("merchant", "currency")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("count"))
    )
    return totals, parsed.where(~good).select("key", "value")


def settlement_records(
    payments: DataFrame,
    batch: str,
    partitions: int = 4,
    *,
    output_topic: str = "settlements",
    rejected_topic: str = "payments-rejected",
) -> DataFrame:
    """Payments -> records (`topic`, `key`, `value`) for the txlog writer: one settlement per
    merchant and currency to `output_topic`, and every malformed payment, as it was, to
    `rejected_topic` (a dead letter: money is never dropped silently). Both commit in the same
    transaction."""
    from pyspark.sql import functions as F

    totals, rejected = _totals_and_rejected(payments, partitions)
    settlements = totals.select(
        F.lit(output_topic).alias("topic"),
        F.col("merchant").cast("binary").alias("key"),
        F.to_json(
            F.struct(
                F.lit(batch).alias("batch"),
                F.col("merchant"),
                F.col("currency"),
                F.col("total").cast("decimal(38,2)").cast("string").alias("total"),
                (F.col("total") * 100).cast("long").alias("total_minor"),
                F.col("count"),
            )
        )
        .cast("binary")
        .alias("value"),
    )
    return settlements.unionByName(rejected.select(F.lit(rejected_topic).alias("topic"), "*"))


def settlement_rows(payments: DataFrame, batch: str, partitions: int = 4) -> DataFrame:
    """Payments -> rows for a SQL table (the txsql writer): `batch`, `merchant`, `currency`,
    `total` (a decimal string), `total_minor`, `count` per settlement, and one row per
    malformed payment with its raw text in `rejected` (the rest null), in the same commit."""
    from pyspark.sql import functions as F

    totals, rejected = _totals_and_rejected(payments, partitions)
    settlements = totals.select(
        F.lit(batch).alias("batch"),
        "merchant",
        "currency",
        F.col("total").cast("decimal(38,2)").cast("string").alias("total"),
        (F.col("total") * 100).cast("long").alias("total_minor"),
        F.col("count").cast("long").alias("count"),
        F.lit(None).cast("string").alias("rejected"),
    )
    dead = rejected.select(
        F.lit(batch).alias("batch"),
        *(F.lit(None).cast("string").alias(c) for c in ("merchant", "currency", "total")),
        *(F.lit(None).cast("long").alias(c) for c in ("total_minor", "count")),
        F.col("value").cast("string").alias("rejected"),
    )
    return settlements.unionByName(dead)


@dataclass(frozen=True)
class Source:
    """Where a job reads and writes, and as whom."""

    url: str
    input_topic: str = "payments"
    output_topic: str = "settlements"
    job_id: str = "settlement"
    group: str = "settlement"
    token: str | None = None
    rejected_topic: str = "payments-rejected"
    # Settlements into this SQL database (any SQLAlchemy URL) through txsql, not the topic.
    sql_url: str | None = None
    sql_table: str = "settlements"
    # Read the payments with Spark's own Kafka source (`format("kafka")`, read_committed) from
    # these bootstrap servers, the coordinator's Kafka listener, instead of with txlog.
    bootstrap: str | None = None

    @property
    def reader_format(self) -> str:
        return "txlog" if self.bootstrap is None else "kafka"

    def reader_options(self) -> dict[str, str]:
        if self.bootstrap is not None:
            return {
                "kafka.bootstrap.servers": self.bootstrap,
                "subscribe": self.input_topic,
                "kafka.isolation.level": "read_committed",
            }
        options = {"coordinator.url": self.url, "subscribe": self.input_topic}
        if self.token:
            options["coordinator.token"] = self.token
        return options

    def writer_options(self) -> dict[str, str]:
        if self.sql_url is not None:
            return {"url": self.sql_url, "dbtable": self.sql_table, "jobId": self.job_id}
        options = {"coordinator.url": self.url, "topic": self.output_topic, "jobId": self.job_id}
        if self.token:
            options["coordinator.token"] = self.token
        return options

    def committed(self, end: Offsets | None = None) -> Offsets:
        """Where the last committed run ended: the group's offsets at the coordinator, or, for
        SQL output, the offsets committed with the rows in that database (every partition of
        `end` without one from the earliest)."""
        from sdk.spark import committed_offsets, sql_committed_offsets

        if self.sql_url is None:
            return committed_offsets(self.url, self.group, [self.input_topic], token=self.token)
        stored = sql_committed_offsets(self.sql_url, self.group)
        partitions = (end or {}).get(self.input_topic, {})
        known = stored.get(self.input_topic, {})
        return {self.input_topic: {p: known.get(p, EARLIEST) for p in partitions} | known}


@dataclass(frozen=True)
class BatchRun:
    """What a batch run settled: the input offsets it read (and committed) and its label."""

    batch: str
    start: Offsets
    end: Offsets
    offsets: int  # offsets in [start, end): the payments settled, and any markers among them

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "start": self.start, "end": self.end, "offsets": self.offsets}


def _settlement_writer(
    payments: DataFrame,
    batch: str,
    source: Source,
    partitions: int,
    writer_options: Mapping[str, str] | None,
) -> DataFrameWriter:
    """The settlement of `payments` as a txlog write (or txsql, for SQL output), options set but
    for the offsets."""
    if source.sql_url is not None:
        frame, output = settlement_rows(payments, batch, partitions), "txsql"
    else:
        frame = settlement_records(
            payments,
            batch,
            partitions,
            output_topic=source.output_topic,
            rejected_topic=source.rejected_topic,
        )
        output = "txlog"
    return (
        frame.write.format(output)
        .mode("append")
        .options(**source.writer_options())
        .options(**dict(writer_options or {}))
    )


def run_batch(
    spark: SparkSession,
    source: Source,
    *,
    partitions: int = 4,
    delivery_guarantee: str = "exactly_once",
    writer_options: Mapping[str, str] | None = None,
) -> BatchRun:
    """Settle the payments the group has not settled yet; commit their offsets with the output.

    `delivery_guarantee="at_least_once"` writes plain appends instead and commits the offsets
    afterwards, outside the output's transaction (Spark's Kafka sink: for comparison only).
    `writer_options` go to the txlog writer as they are (e.g. `testing.kill`)."""
    from sdk.spark import latest_offsets, offsets_json

    if source.sql_url is not None and delivery_guarantee != "exactly_once":
        raise ValueError("SQL output is written exactly once (txsql) only")
    end = latest_offsets(source.url, [source.input_topic], token=source.token)
    start = source.committed(end)
    run = BatchRun(batch_label(start, end), start, end, pending(start, end))
    if run.offsets == 0:
        return run
    payments = (
        spark.read.format(source.reader_format)
        .options(**source.reader_options())
        .option("startingOffsets", offsets_json(start))
        .option("endingOffsets", offsets_json(end))
        .load()
    )
    writer = _settlement_writer(payments, run.batch, source, partitions, writer_options)
    if delivery_guarantee == "exactly_once":
        writer.option("offsets.group", source.group).option("offsets", offsets_json(end)).save()
    else:
        writer.option("delivery.guarantee", delivery_guarantee).save()
        commit_group_offsets(source, end)
    return run


def commit_group_offsets(source: Source, offsets: Offsets) -> None:
    """A plain (non-transactional) group commit, as an at-least-once job does after writing."""
    from sdk import Consumer, TopicPartition

    config: dict[str, object] = {"coordinator.url": source.url, "group.id": source.group}
    if source.token:
        config["coordinator.token"] = source.token
    with Consumer(config) as consumer:
        consumer.commit(
            offsets=[
                TopicPartition(topic, partition, offset)
                for topic, ends in offsets.items()
                for partition, offset in ends.items()
            ],
            asynchronous=False,
        )


def run_stream(
    spark: SparkSession,
    source: Source,
    checkpoint: str,
    *,
    partitions: int = 4,
    processing_time: str | None = None,
    run_seconds: int | None = None,
    writer_options: Mapping[str, str] | None = None,
) -> int:
    """Settle the payments as a stream: each micro-batch is settled as one batch, written with
    its batch id and the offsets it read, so a batch replayed after a crash is a no-op. Without
    `processing_time` it settles what is there and stops (Trigger.AvailableNow); with it, it
    runs for `run_seconds` (forever if None). A first start, without a checkpoint, begins at the
    group's committed offsets. Returns the number of micro-batches this call settled."""
    from pyspark.sql import functions as F

    from sdk.spark import latest_offsets, offsets_json

    start = source.committed(latest_offsets(source.url, [source.input_topic], token=source.token))
    stream = (
        spark.readStream.format(source.reader_format)
        .options(**source.reader_options())
        .option("startingOffsets", offsets_json(start))
        .load()
    )
    settled: list[int] = []

    def settle_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            ends = batch.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()
            if not ends:
                return
            offsets: Offsets = {}
            for row in ends:
                offsets.setdefault(row["topic"], {})[row["partition"]] = row["last"] + 1
            (
                _settlement_writer(batch, f"stream-{batch_id}", source, partitions, writer_options)
                .option("batchId", str(batch_id))
                .option("offsets.group", source.group)
                .option("offsets", offsets_json(offsets))
                .save()
            )
            settled.append(batch_id)
        finally:
            batch.unpersist()

    writer = stream.writeStream.foreachBatch(settle_batch).option("checkpointLocation", checkpoint)
    run_query(writer, processing_time, run_seconds, "settlement")
    return len(settled)


# -- the command line ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from jobs.cluster import add_spark_arguments

    parser = argparse.ArgumentParser(
        prog="python -m jobs.settlement",
        description="Settle payments per merchant exactly once: totals to the output topic, input "
        "offsets committed for the group in the same transaction.",
    )
    parser.add_argument("--coordinator-url", required=True, help="the coordinator's base URL")
    parser.add_argument("--token", help="bearer token (needs the transactional id prefix JOB_ID/)")
    parser.add_argument("--mode", choices=["batch", "stream"], default="batch", help="(batch)")
    parser.add_argument("--input", default="payments", help="topic of payments (payments)")
    parser.add_argument("--output", default="settlements", help="topic of settlements")
    parser.add_argument(
        "--rejected",
        default="payments-rejected",
        help="dead-letter topic for malformed payments, written in the same transaction "
        "(payments-rejected)",
    )
    parser.add_argument(
        "--job-id",
        help="stable name of the job across reruns (settlement; settlement-stream with --mode "
        "stream): its transactions are JOB_ID/...",
    )
    parser.add_argument("--group", default="settlement", help="consumer group of the input")
    parser.add_argument("--partitions", type=int, default=4, help="write tasks (4)")
    parser.add_argument(
        "--sql-url",
        help="write the settlements into this SQL database (a SQLAlchemy URL, e.g. "
        "postgresql://etl@db/ledger or sqlite:///ledger.db) through txsql, the input offsets "
        "with them, instead of the output topic",
    )
    parser.add_argument("--sql-table", default="settlements", help="table of --sql-url")
    parser.add_argument(
        "--bank-url",
        help="after the commit, pay every committed settlement out at this URL (POST), once "
        "per settlement through the coordinator's side effects",
    )
    add_spark_arguments(parser, "settle")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from jobs import payouts

    args = build_parser().parse_args(argv)
    from jobs.cluster import session
    from sdk.spark import register

    default_job = "settlement-stream" if args.mode == "stream" else "settlement"
    source = Source(
        url=args.coordinator_url,
        input_topic=args.input,
        output_topic=args.output,
        rejected_topic=args.rejected,
        job_id=args.job_id or default_job,
        group=args.group,
        token=args.token,
        sql_url=args.sql_url,
        sql_table=args.sql_table,
    )
    if args.mode == "stream" and not args.checkpoint:
        print("--mode stream needs --checkpoint", file=sys.stderr)
        return 2
    spark = session(f"settlement-{args.mode}", args.master)
    try:
        register(spark)
        if args.mode == "batch":
            run = run_batch(spark, source, partitions=args.partitions)
            what = "nothing new to settle" if run.offsets == 0 else f"settled {run.batch}"
            print(what, file=sys.stderr)
            paid = payouts.pay_settlements(spark, source, args.bank_url) if args.bank_url else 0
            print(json.dumps({"mode": "batch", **run.to_dict(), "payouts": paid}))
        else:
            batches = run_stream(
                spark,
                source,
                args.checkpoint,
                partitions=args.partitions,
                processing_time=args.processing_time,
                run_seconds=args.run_seconds,
            )
            paid = payouts.pay_settlements(spark, source, args.bank_url) if args.bank_url else 0
            print(json.dumps({"mode": "stream", "batches": batches, "payouts": paid}))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
