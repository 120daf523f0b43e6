"""The Spark jobs of the tests that kill a driver or need a cluster: run as
`python tests/spark_driver.py '<spec JSON>'` in a process of its own (a test SIGKILLs it, or its
SparkContext must not meet the test session's). A rerun in the test process calls the same
functions, so it is the same job.

Spec: `{"master": ..., "speculation": false, "conf": {...}, "job": "batch" or "stream", ...}`
with, for "batch", `rows`, `partitions` and `options` (the txlog writer's), and for "stream",
`source`, `checkpoint` and `options`.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery


def numbers(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """Values "0".."rows-1" in `partitions` Spark partitions of consecutive ranges; each row
    goes to the output partition numbered as its Spark partition, so every task attempt writes
    one output partition of its own."""
    return spark.range(rows, numPartitions=partitions).selectExpr(
        "cast(id as string) as value", "spark_partition_id() as partition"
    )


def write_batch(df: DataFrame, options: dict[str, str]) -> None:
    df.write.format("txlog").options(**options).mode("append").save()


def start_stream(
    spark: SparkSession, source: dict[str, str], checkpoint: str, options: dict[str, str]
) -> StreamingQuery:
    """Every record of the source's topics, copied (key, value) to the output topic, in
    micro-batches until nothing is left (Trigger.AvailableNow)."""
    df = spark.readStream.format("txlog").options(**source).load().select("key", "value")
    return (
        df.writeStream.format("txlog")
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def main(spec: dict[str, Any]) -> None:
    from jobs.cluster import session
    from sdk.spark import register

    spark = session(
        "txlog-test-driver",
        spec["master"],
        speculation=spec.get("speculation", False),
        conf=spec.get("conf", {}),
    )
    register(spark)
    try:
        if spec["job"] == "batch":
            write_batch(numbers(spark, spec["rows"], spec["partitions"]), spec["options"])
        else:
            query = start_stream(spark, spec["source"], spec["checkpoint"], spec["options"])
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
    finally:
        spark.stop()
    print("driver done", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
