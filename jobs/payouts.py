"""The settlement job's payouts: each committed settlement paid to its merchant once, whatever Spark
retries or runs twice, through `EffectsClient.once` with a key per settlement."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobs.settlement import Settlement, Source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def payout_key(job_id: str, settlement: Settlement) -> str:
    """The side-effect key of a settlement's payout: under the job's prefix (a token for the job
    covers it), one per batch, merchant and currency."""
    batch = hashlib.sha1(settlement.batch.encode()).hexdigest()[:12]
    return f"{job_id}/payout/{batch}/{settlement.merchant}/{settlement.currency}"


def committed_settlements(spark: SparkSession | None, source: Source) -> list[Settlement]:
    """Every settlement committed so far: from the SQL table (no Spark needed), or read_committed
    from the topic through `spark`'s txlog source."""
    if source.sql_url is not None:
        from sqlalchemy import text

        from sdk.spark._sql import engine_for

        engine = engine_for(source.sql_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(
                    text(
                        "SELECT batch, merchant, currency, total_minor, count "
                        f"FROM {source.sql_table} WHERE rejected IS NULL"
                    )
                ).all()
        finally:
            engine.dispose()
        return [Settlement(b, m, c, int(t), int(n)) for b, m, c, t, n in rows]
    if spark is None:
        raise ValueError("reading settlements from the topic needs a SparkSession")
    records = (
        spark.read.format("txlog")
        .options(**{**source.reader_options(), "subscribe": source.output_topic})
        .load()
        .select("value")
        .collect()
    )
    return [Settlement.from_json(bytes(r.value)) for r in records]


def pay_settlements(
    spark: SparkSession,
    source: Source,
    bank_url: str,
    *,
    partitions: int = 4,
    faults: Mapping[str, Sequence[float]] | None = None,
) -> int:
    """Pay every committed settlement to its merchant at `bank_url`, in `partitions` Spark tasks,
    each payout through `EffectsClient.once` (key: `payout_key`): a payout done before, by an
    earlier run, a failed attempt or a speculative copy, is not made again. The bank gets
    `{"key", "merchant", "currency", "amount_minor", "fencing_token"}` (the key is its
    idempotency key; it may refuse a token lower than one it saw). Returns the number of
    settlements. `faults` (demo and tests): `{"kill": [partition, attempt, n]}` ends that
    attempt after its n-th payout, `{"stall": [partition, attempt, n, seconds]}` stalls it."""
    settlements = committed_settlements(spark, source)
    if not settlements:
        return 0
    url, token, job_id = source.url, source.token, source.job_id
    kill = list((faults or {}).get("kill", [])) or None
    stall = list((faults or {}).get("stall", [])) or None
    rows = [(payout_key(job_id, s), s.merchant, s.currency, s.total_minor) for s in settlements]

    def pay(partition: Iterable[Any]) -> None:
        import os
        import time

        import httpx
        from pyspark import TaskContext

        from sdk import EffectsClient

        context = TaskContext.get()
        where = [context.partitionId(), context.attemptNumber()] if context else [0, 0]
        config: dict[str, object] = {"coordinator.url": url}
        if token:
            config["coordinator.token"] = token
        with EffectsClient(config) as effects, httpx.Client(timeout=30) as bank:
            for n, (key, merchant, currency, amount) in enumerate(partition, start=1):
                payout = {"key": key, "merchant": merchant, "currency": currency}
                payout["amount_minor"] = amount

                def transfer(fencing_token: int, payout: dict[str, Any] = payout) -> Any:
                    body = {**payout, "fencing_token": fencing_token}
                    answer = bank.post(bank_url, json=body)
                    answer.raise_for_status()
                    return answer.json()

                effects.once(key, transfer, lease_ms=60_000, timeout=180)
                if kill is not None and [*where, n] == kill:
                    os._exit(1)  # a lost executor, after its n-th payout was stored
                if stall is not None and [*where, n] == stall[:3]:
                    time.sleep(stall[3])  # a straggler, between two payouts

    schema = "key string, merchant string, currency string, amount long"
    frame = spark.createDataFrame(rows, schema).repartition(partitions)
    frame.foreachPartition(pay)
    return len(settlements)
