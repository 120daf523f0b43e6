"""The Spark integration's protocol without Spark, on SQLite and on Postgres: task attempts
(`write_partition`) prepare their own transactions, the driver (`Committer`) commits the
winners with the input offsets and the batch marker in one commit-group and aborts everything
else under the job's prefix. A dead attempt is a child process killed by `testing.kill`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sdk import ConfigError, ProducerFenced, TransactionalIdNotFound
from sdk.spark._protocol import (
    BATCH_GROUP_SUFFIX,
    Committer,
    Fault,
    OutputRecord,
    TaskIdentity,
    TaskOutcome,
    TaskWriter,
    WriteSettings,
    check_job_id,
    write_partition,
)
from tests.support.sdk_support import Coordinator, wait_for
from tests.support.spark_support import crash_attempt

JOB = "settle"


def settings(service: Coordinator, **overrides: Any) -> WriteSettings:
    base = WriteSettings(url=service.url, token=None, topic="out", job_id=JOB, run="r1")
    return dataclasses.replace(base, linger_ms=1, **overrides)


def records(values: list[str], partition: int | None = 0) -> list[OutputRecord]:
    return [(None, None, value, partition, None) for value in values]


def states(service: Coordinator, prefix: str | None = f"{JOB}/") -> dict[str, str]:
    """Transactional ids and their states, under `prefix` (None: all of them)."""
    params = {"prefix": prefix} if prefix is not None else {}
    response = service.http.get("/v1/admin/transactions", params=params)
    assert response.status_code == 200, response.text
    return {t["transactional_id"]: t["state"] for t in response.json()["transactions"]}


def group_offsets(service: Coordinator, group: str) -> dict[tuple[str, int], int]:
    response = service.http.get(f"/v1/groups/{group.replace('/', '%2F')}/offsets")
    assert response.status_code == 200, response.text
    return {(o["topic"], o["partition"]): o["offset"] for o in response.json()["offsets"]}


def stable(service: Coordinator, topic: str) -> bool:
    """No open transaction holds back any partition's LSO."""
    described = service.http.get(f"/v1/topics/{topic}").json()["partitions"]
    return all(p["last_stable_offset"] == p["high_watermark"] for p in described)


def test_the_commit_takes_the_winning_attempts_and_aborts_one_that_died_after_writing(
    service: Coordinator,
) -> None:
    service.create_topic("out", 2)
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        run = settings(service, driver=driver)
        values = [f"a{i}" for i in range(5)]
        crash_attempt(
            dataclasses.replace(run, kill=Fault(after_records=3)),
            TaskIdentity(0, 0, 1),
            records(values),
        )
        assert service.values("out", 2) == {0: [], 1: []}
        assert service.all_values("out", 2, isolation_level="read_uncommitted") == values[:3]
        assert states(service)[f"{JOB}/r1/0.0.1"] == "Ongoing"

        retry = write_partition(run, records(values), TaskIdentity(0, 1, 2))
        other = write_partition(run, records(["b0", "b1"], 1), TaskIdentity(1, 0, 3))
        assert (retry.transactional_id, retry.records) == (f"{JOB}/r1/0.1.2", 5)
        result = committer.commit([retry, other])

    assert sorted(result.committed) == [f"{JOB}/r1/0.1.2", f"{JOB}/r1/1.0.3"]
    assert result.aborted == [f"{JOB}/r1/0.0.1"]
    assert service.values("out", 2) == {0: values, 1: ["b0", "b1"]}
    uncommitted = service.values("out", 2, isolation_level="read_uncommitted")
    assert uncommitted == {0: values[:3] + values, 1: ["b0", "b1"]}
    assert stable(service, "out")


def test_an_attempt_that_prepares_after_its_run_was_committed_aborts_itself(
    service: Coordinator,
) -> None:
    """A late speculative copy: nobody would ever commit it, so it must not pin the LSO."""
    service.create_topic("out")
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        run = settings(service, driver=driver)
        winner = write_partition(run, records(["x"]), TaskIdentity(0, 0, 1))
        committer.commit([winner])

    with pytest.raises(RuntimeError, match="run ended before this attempt prepared"):
        write_partition(run, records(["x"]), TaskIdentity(0, 1, 2))

    assert states(service)[f"{JOB}/r1/0.1.2"] == "CompleteAbort"
    assert service.values("out") == {0: ["x"]}
    assert service.values("out", isolation_level="read_uncommitted") == {0: ["x", "x"]}
    assert stable(service, "out")


def test_an_attempt_still_writing_when_its_run_commits_is_aborted_and_fails(
    service: Coordinator,
) -> None:
    service.create_topic("out")
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        run = settings(service, driver=driver)
        winner = write_partition(run, records(["x"]), TaskIdentity(0, 0, 1))
        with TaskWriter(run, TaskIdentity(0, 1, 2)) as straggler:
            straggler.produce("out", "x", partition=0)
            straggler.produce("out", "x", partition=0)
            wait_for(
                lambda: len(service.read("out", isolation_level="read_uncommitted")) == 3,
                what="the straggler's records in the log",
            )
            result = committer.commit([winner])
            assert result.aborted == [f"{JOB}/r1/0.1.2"]
            with pytest.raises(ProducerFenced):
                straggler.finish()

    assert service.values("out") == {0: ["x"]}
    assert stable(service, "out")


def test_input_offsets_commit_with_the_output_or_not_at_all(service: Coordinator) -> None:
    service.create_topic("in", 2)
    service.create_topic("out")
    offsets = {"in": {0: 5, 1: 7}}
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        run = settings(service, driver=driver)
        good = write_partition(run, records(["y"]), TaskIdentity(0, 0, 1))
        unknown = dataclasses.replace(good, partition=1, transactional_id=f"{JOB}/r1/1.0.9")
        with pytest.raises(TransactionalIdNotFound):
            committer.commit([good, unknown], offsets_group="g", offsets=offsets)
        # All or none: neither the output nor the offsets.
        assert service.values("out") == {0: []}
        assert group_offsets(service, "g") == {}
        assert states(service)[f"{JOB}/r1/0.0.1"] == "Prepared"

        committer.commit([good], offsets_group="g", offsets=offsets)

    assert service.values("out") == {0: ["y"]}
    assert group_offsets(service, "g") == {("in", 0): 5, ("in", 1): 7}


def test_a_batch_committed_before_is_never_committed_again(service: Coordinator) -> None:
    service.create_topic("out")
    marker = f"{JOB}{BATCH_GROUP_SUFFIX}"

    def attempt(run: str, values: list[str], task: int) -> TaskOutcome:
        return write_partition(
            settings(service, run=run), records(values), TaskIdentity(0, 0, task)
        )

    with Committer(service.url, None, JOB) as committer:
        first = committer.commit([attempt("b0", ["a0", "a1"], 1)], batch=("out", 0))
        assert not first.skipped and first.committed == [f"{JOB}/b0/0.0.1"]
        # Batch 0 replayed (a restart from a checkpoint that missed its commit): aborted.
        replay = committer.commit([attempt("b0-again", ["a0", "a1"], 2)], batch=("out", 0))
        assert replay.skipped and replay.committed == []
        assert replay.aborted == [f"{JOB}/b0-again/0.0.2"]
        assert group_offsets(service, marker) == {("out", 0): 1}
        second = committer.commit([attempt("b1", ["b0"], 3)], batch=("out", 1))
        assert not second.skipped
        stale = committer.commit([attempt("b0-late", ["a0", "a1"], 4)], batch=("out", 0))
        assert stale.skipped

    assert service.values("out") == {0: ["a0", "a1", "b0"]}
    assert service.values("out", isolation_level="read_uncommitted") == {
        0: ["a0", "a1", "a0", "a1", "b0", "a0", "a1"]
    }
    assert group_offsets(service, marker) == {("out", 0): 2}
    assert stable(service, "out")


def test_a_micro_batch_attempt_that_prepares_after_its_batch_committed_withdraws(
    service: Coordinator,
) -> None:
    """A late speculative copy, or a task of a batch Spark replays from its checkpoint, finds
    its batch already committed: it aborts its own transaction at once (no LSO held back until
    the next batch) and hands the driver nothing to commit, without failing the task."""
    service.create_topic("out")
    streaming = settings(service, marker=("out", None))
    with Committer(service.url, None, JOB) as committer:
        winner = write_partition(
            dataclasses.replace(streaming, run="b0"), records(["a0"]), TaskIdentity(0, 0, 1, 0)
        )
        assert winner.transactional_id is not None
        committer.commit([winner], batch=("out", 0))

    late = write_partition(
        dataclasses.replace(streaming, run="b0"), records(["a0"]), TaskIdentity(0, 1, 2, 0)
    )
    assert late.transactional_id is None and late.records == 0
    assert states(service)[f"{JOB}/b0/0.1.2"] == "CompleteAbort"
    assert stable(service, "out")
    # The next batch's tasks are not mistaken for late ones.
    current = write_partition(
        dataclasses.replace(streaming, run="b1"), records(["b0"]), TaskIdentity(0, 0, 3, 1)
    )
    assert current.transactional_id == f"{JOB}/b1/0.0.3"
    assert states(service)[f"{JOB}/b1/0.0.3"] == "Prepared"
    assert service.values("out", isolation_level="read_uncommitted") == {0: ["a0", "a0", "b0"]}
    assert service.values("out") == {0: ["a0"]}


def test_a_new_run_aborts_what_a_crashed_run_left_open_and_its_driver_cannot_commit(
    service: Coordinator,
) -> None:
    service.create_topic("out", 2)
    old_committer = Committer(service.url, None, JOB)
    _, old_driver = old_committer.abort_all()
    old = settings(service, driver=old_driver)
    prepared = write_partition(old, records(["p0", "p1"], 0), TaskIdentity(0, 0, 1))
    crash_attempt(
        dataclasses.replace(old, kill=Fault(after_records=1)),
        TaskIdentity(1, 0, 2),
        records(["d0", "d1"], 1),
    )
    assert states(service) == {
        f"{JOB}/driver": "CompleteCommit",
        f"{JOB}/r1/0.0.1": "Prepared",
        f"{JOB}/r1/1.0.2": "Ongoing",
    }
    assert not stable(service, "out")

    with Committer(service.url, None, JOB) as committer:
        result, new_driver = committer.abort_all()  # what a new run does before writing
    assert sorted(result.aborted) == [f"{JOB}/r1/0.0.1", f"{JOB}/r1/1.0.2"]
    assert new_driver != old_driver
    assert stable(service, "out")

    # The old driver, still alive after all, can no longer commit its run's output.
    with pytest.raises(ProducerFenced):
        old_committer.commit([prepared])
    old_committer.close()
    assert service.values("out", 2) == {0: [], 1: []}
    assert service.values("out", 2, isolation_level="read_uncommitted") == {
        0: ["p0", "p1"],
        1: ["d0"],
    }


def test_a_jobs_prefix_does_not_cover_a_job_whose_name_extends_it(service: Coordinator) -> None:
    service.create_topic("out")
    neighbour = settings(service, job_id=f"{JOB}-eu")
    theirs = write_partition(neighbour, records(["theirs"]), TaskIdentity(0, 0, 1))
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        ours = write_partition(
            settings(service, driver=driver), records(["ours"]), TaskIdentity(0, 0, 2)
        )
        result = committer.commit([ours])
    assert result.aborted == []
    assert states(service, f"{JOB}-eu/")[theirs.transactional_id or ""] == "Prepared"


def test_an_at_least_once_attempt_appends_without_a_transaction(service: Coordinator) -> None:
    service.create_topic("out")
    plain = settings(service, job_id=None)
    outcome = write_partition(plain, records(["v0", "v1"]), TaskIdentity(0, 0, 1))
    assert outcome == TaskOutcome(partition=0, attempt=0, records=2)
    assert service.values("out") == {0: ["v0", "v1"]}
    assert states(service, None) == {}


def test_an_attempt_without_records_leaves_no_transaction(service: Coordinator) -> None:
    service.create_topic("out")
    with Committer(service.url, None, JOB) as committer:
        _, driver = committer.abort_all()
        empty = write_partition(settings(service, driver=driver), [], TaskIdentity(0, 0, 1))
        assert empty == TaskOutcome(partition=0, attempt=0, records=0)
        result = committer.commit([empty, None])
    assert result.committed == [] and result.aborted == []
    assert states(service) == {f"{JOB}/driver": "CompleteCommit"}


@pytest.mark.parametrize(
    "job_id",
    [None, "", "etl/1", "etl 1", "x" * 129],
    ids=["missing", "empty", "slash", "space", "too-long"],
)
def test_a_job_id_must_be_a_plain_stable_name(job_id: str | None) -> None:
    with pytest.raises(ConfigError, match="jobId: "):
        check_job_id(job_id)
    assert check_job_id("settle-eu_2.v1") == "settle-eu_2.v1"
