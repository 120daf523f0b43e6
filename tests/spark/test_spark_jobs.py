"""The jobs of `jobs/` on Spark (`local[2,3]`): settlement in batch and streaming mode, and the
mirror. Each settles or copies every input exactly once across reruns, commits its input
offsets with its output, and never drops a record (malformed payments go to the dead letter).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs import mirror
from jobs.demo import StandInBank
from jobs.payouts import committed_settlements, pay_settlements
from jobs.settlement import (
    Payment,
    Settlement,
    Source,
    run_batch,
    run_stream,
    settle,
)
from sdk.spark import sql_committed_offsets
from tests.support.spark_support import Log, unique

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def payments(first: int, count: int) -> list[Payment]:
    return [Payment(f"p{i}", f"m{i % 4}", 100 + i, "EUR") for i in range(first, first + count)]


def append_payments(log: Log, topic: str, batch: list[Payment]) -> None:
    for partition in range(2):
        log.append(topic, partition, [p.to_json() for p in batch[partition::2]])


def settlements(log: Log, topic: str) -> list[Settlement]:
    return [Settlement.from_json(v) for v in log.values(topic)]


def totals(found: list[Settlement]) -> dict[str, tuple[int, int]]:
    """Per merchant: (amount, payment count) over every settlement record."""
    result: dict[str, tuple[int, int]] = {}
    for s in found:
        total, count = result.get(s.merchant, (0, 0))
        result[s.merchant] = (total + s.total_minor, count + s.count)
    return result


def truth(batch: list[Payment]) -> dict[str, tuple[int, int]]:
    return totals(settle(batch, "truth"))


def source(log: Log, name: str) -> Source:
    topics = [f"{name}-{t}" for t in ("payments", "settlements", "rejected")]
    log.create_topic(topics[0], 2)
    log.create_topic(topics[1], 2)
    log.create_topic(topics[2], 1)
    return Source(
        log.url,
        input_topic=topics[0],
        output_topic=topics[1],
        job_id=name,
        group=name,
        rejected_topic=topics[2],
    )


def test_spark_s_python_workers_import_the_installed_pyspark_not_a_zip(spark: SparkSession) -> None:
    """`jobs.cluster.session` runs Spark from `local_spark_home()`: its Python workers import
    pyspark from the installed package and its bytecode cache, not from pyspark.zip."""
    import pyspark

    def where(_: int) -> str:
        import pyspark

        return str(pyspark.__file__)

    assert spark.sparkContext.parallelize([0], 1).map(where).collect() == [pyspark.__file__]


def test_batch_settlement_settles_each_payment_once_across_reruns_and_rejects_bad_ones(
    spark: SparkSession, log: Log
) -> None:
    src = source(log, unique("settle"))
    first = payments(0, 40)
    append_payments(log, src.input_topic, first)
    bad = ["not json", json.dumps({"payment_id": "x", "merchant": "m1", "amount": "1.005"})]
    log.append(src.input_topic, 0, bad)

    run = run_batch(spark, src, partitions=3)
    assert run.offsets == 42
    assert totals(settlements(log, src.output_topic)) == truth(first)
    assert sorted(log.values(src.rejected_topic)) == sorted(bad)
    assert log.group_offsets(src.group, src.input_topic) == {0: 22, 1: 20}

    again = run_batch(spark, src, partitions=3)  # nothing new: nothing written
    assert again.offsets == 0
    assert len(settlements(log, src.output_topic)) == 4

    second = payments(40, 10)
    append_payments(log, src.input_topic, second)
    run_batch(spark, src, partitions=3)
    found = settlements(log, src.output_topic)
    assert totals(found) == truth(first + second)
    assert all(n == 1 for n in Counter(s.key for s in found).values())
    assert log.group_offsets(src.group, src.input_topic) == {0: 27, 1: 25}


def test_settlement_into_a_sql_table_pays_each_settlement_once_across_reruns(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    """SQL output (txsql, SQLite) with the offsets in the same database, and payouts through
    `once`: a rerun settles only new payments, and pays only the new settlements."""
    name = unique("settle-sql")
    src = Source(
        log.url,
        input_topic=log.create_topic(f"{name}-payments", 2),
        job_id=name,
        group=name,
        sql_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    )
    first = payments(0, 20)
    append_payments(log, src.input_topic, first)
    log.append(src.input_topic, 1, ["not json"])
    with StandInBank() as bank:
        run_batch(spark, src, partitions=2)
        assert pay_settlements(spark, src, bank.url, partitions=2) == 4
        assert sql_committed_offsets(str(src.sql_url), src.group) == {
            src.input_topic: {0: 10, 1: 11}
        }

        second = payments(20, 8)
        append_payments(log, src.input_topic, second)
        assert run_batch(spark, src, partitions=2).offsets == 8  # only the new payments
        assert pay_settlements(spark, src, bank.url, partitions=2) == 8
        assert run_batch(spark, src, partitions=2).offsets == 0

    found = committed_settlements(None, src)
    assert totals(found) == truth(first + second)
    assert len(bank.calls) == len(found) == 8  # each settlement paid once, none twice
    assert bank.paid_per_merchant() == {
        (m, "EUR"): total for m, (total, _) in truth(first + second).items()
    }


def test_streaming_settlement_resumes_from_its_checkpoint_without_settling_twice(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    src = source(log, unique("stream"))
    checkpoint = str(tmp_path / "checkpoint")
    first = payments(0, 30)
    append_payments(log, src.input_topic, first)
    assert run_stream(spark, src, checkpoint, partitions=2) >= 1
    assert totals(settlements(log, src.output_topic)) == truth(first)

    second = payments(30, 12)
    append_payments(log, src.input_topic, second)
    assert run_stream(spark, src, checkpoint, partitions=2) >= 1
    found = settlements(log, src.output_topic)
    assert totals(found) == truth(first + second)
    assert all(n == 1 for n in Counter(s.key for s in found).values())
    # The input offsets of every micro-batch were committed with its settlements.
    assert log.group_offsets(src.group, src.input_topic) == {0: 21, 1: 21}


def test_mirror_copies_each_record_once_transformed_and_traceable(
    spark: SparkSession, log: Log
) -> None:
    name = unique("mirror")
    source_topic = log.create_topic(f"{name}-source", 2)
    target = log.create_topic(f"{name}-target", 2)
    log.append(source_topic, 0, ["a", "b"])
    log.append(source_topic, 1, ["c", "skip-me"])
    route = mirror.Route(log.url, source_topic, target, job_id=name, group=name)
    transform = mirror.Transform(
        value="upper(value)", where="value != 'skip-me'", preserve_partitions=True
    )

    assert mirror.run_batch(spark, route, transform)["offsets"] == 4
    log.append(source_topic, 0, ["d"])
    mirror.run_batch(spark, route, transform)
    assert mirror.run_batch(spark, route, transform)["offsets"] == 0

    copied = {p: log.records(target, p) for p in range(2)}
    values = {p: [base64.b64decode(r["value"]).decode() for r in rs] for p, rs in copied.items()}
    assert values == {0: ["A", "B", "D"], 1: ["C"]}
    origins = [
        base64.b64decode(r["headers"]["mirror.source"]).decode()
        for rs in copied.values()
        for r in rs
    ]
    assert sorted(origins) == sorted(
        [f"{source_topic}/0/0", f"{source_topic}/0/1", f"{source_topic}/0/2", f"{source_topic}/1/0"]
    )
    assert log.group_offsets(name, source_topic) == {0: 3, 1: 2}


def test_settlement_runs_as_a_module_and_under_spark_submit(log: Log) -> None:
    """The two ways the issue names: `python -m jobs.settlement` and `spark-submit
    jobs/settlement.py`, the second settling only what the first did not."""
    src = source(log, unique("submit"))
    arguments = [
        "--coordinator-url",
        log.url,
        "--input",
        src.input_topic,
        "--output",
        src.output_topic,
        "--rejected",
        src.rejected_topic,
        "--job-id",
        src.job_id,
        "--group",
        src.group,
        "--partitions",
        "2",
    ]
    first, second = payments(0, 10), payments(10, 6)
    append_payments(log, src.input_topic, first)
    module = [sys.executable, "-m", "jobs.settlement", *arguments, "--master", "local[2]"]
    done = subprocess.run(module, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["offsets"] == 10

    append_payments(log, src.input_topic, second)
    submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or shutil.which(
        "spark-submit"
    )
    assert submit is not None, "pyspark installs spark-submit next to the interpreter"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    command = [submit, "--master", "local[2]", "jobs/settlement.py", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["offsets"] == 6
    assert totals(settlements(log, src.output_topic)) == truth(first + second)
