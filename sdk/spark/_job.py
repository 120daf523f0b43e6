"""Exactly-once output for hand-written `foreachPartition` code: each task attempt writes in
its own transaction; the winners reach the driver through an accumulator (Spark applies only
the successful attempt's update of each task), and `commit()` commits them as one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import SparkSession

from sdk.spark._offsets import Offsets
from sdk.spark._protocol import (
    CommitResult,
    Committer,
    TaskIdentity,
    TaskOutcome,
    TaskWriter,
    WriteSettings,
    check_job_id,
)

__all__ = ["TransactionalJob"]


class _Outcomes(AccumulatorParam):  # type: ignore[type-arg]
    def zero(self, value: list[TaskOutcome]) -> list[TaskOutcome]:
        return []

    def addInPlace(self, value1: list[TaskOutcome], value2: list[TaskOutcome]) -> list[TaskOutcome]:
        value1.extend(value2)
        return value1


class TransactionalJob:
    """One run of a job writing with `foreachPartition`, exactly once.

        job = TransactionalJob(spark, job_id="settle", coordinator_url=url)
        df.foreachPartition(job.partition_writer(lambda rows, out: [
            out.produce("settlements", value=r.value, key=r.key) for r in rows]))
        job.commit(offsets_group="settle", offsets={"payments": {0: 120}})  # or job.abort()

    Creating it aborts what an earlier crashed run of the same `job_id` left open. The function
    given to `partition_writer` gets the partition's rows and a `TaskWriter` whose
    `produce(topic, value, key, partition, headers)` writes in the task attempt's transaction.
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        job_id: str,
        coordinator_url: str,
        token: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        self.job_id = check_job_id(job_id)
        self._url, self._token = coordinator_url, token
        with self._committer() as committer:
            _, driver = committer.abort_all()
        self._settings = WriteSettings(
            url=coordinator_url,
            token=token,
            topic=None,
            job_id=job_id,
            run=uuid.uuid4().hex[:12],
            transaction_timeout_ms=transaction_timeout_ms,
            driver=driver,
        )
        self._outcomes = spark.sparkContext.accumulator([], _Outcomes())
        self._done = False

    def _committer(self) -> Committer:
        return Committer(self._url, self._token, self.job_id)

    def partition_writer(
        self, write: Callable[[Iterator[Any], Any], object]
    ) -> Callable[[Iterable[Any]], None]:
        """The function to give `foreachPartition`."""
        settings, outcomes = self._settings, self._outcomes

        def run(rows: Iterable[Any]) -> None:
            with TaskWriter(settings, TaskIdentity.current()) as out:
                write(iter(rows), out)
                outcomes.add([out.finish()])

        return run

    @property
    def outcomes(self) -> list[TaskOutcome]:
        """The winning attempts so far (driver only)."""
        return list(self._outcomes.value)

    def commit(
        self, *, offsets_group: str | None = None, offsets: Offsets | None = None
    ) -> CommitResult:
        """Commit every winning attempt's output, and `offsets` for `offsets_group`, as one;
        abort every other attempt of this job. Call once, after the action returned."""
        self._finish()
        with self._committer() as committer:
            return committer.commit(
                list(self._outcomes.value), offsets_group=offsets_group, offsets=offsets
            )

    def abort(self) -> CommitResult:
        """Throw away everything this run wrote."""
        self._finish()
        with self._committer() as committer:
            result, _ = committer.abort_all()
            return result

    def _finish(self) -> None:
        if self._done:
            raise RuntimeError(f"job {self.job_id!r}: this run was already committed or aborted")
        self._done = True
