"""The `txshare` Python Data Source: `spark.readStream` over a share group (KIP-932, a queue),
whose micro-batch output and acknowledgements commit together, so several Spark jobs drain one
queue exactly once.

Each micro-batch is planned on the driver: the job's member of the share group (member id
`{jobId}`) acquires records, and takes their acceptance into a transaction of the job's,
`{jobId}/share`, which it prepares. The batch's offsets (Spark's checkpoint) are the acquired
ranges; the tasks read those records from the log. The txlog sink of the same `jobId` commits
that transaction with the batch's output in one commit-group (`sdk.spark._protocol`): the
records are Acknowledged exactly when the output is committed. A job killed mid-batch leaves the
prepared transaction: its rerun replays the batch from the checkpoint (the same ranges) and
commits it then; another job never gets those records meanwhile. A batch the job gives up (its
transaction aborted by the next plan's, or by an operator) releases them for any job.

With a sink other than txlog (foreachBatch, say), the source commits the transaction itself when
Spark commits the batch (`commit`): the acknowledgements then follow the output, at least once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from sdk._errors import ConfigError, FencedMemberEpoch, KafkaException, UnknownMemberId
from sdk._http import HttpClient, api_path
from sdk.spark._offsets import client
from sdk.spark._protocol import check_job_id, share_tid
from sdk.spark._source import SCHEMA, OffsetRange, _ReadSettings, _required

__all__ = ["TxshareDataSource"]

Range = tuple[str, int, int, int]  # topic, partition, first offset, last offset


@dataclass
class AcquiredRanges(InputPartition):
    """One partition's acquired ranges of a micro-batch."""

    topic: str
    partition: int
    ranges: list[tuple[int, int]]


def _max_records(options: Any) -> int:
    value = options.get("maxRecordsPerTrigger", "1000")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"maxRecordsPerTrigger: {value!r} is not a whole number") from None
    if not 1 <= number <= 10_000:
        raise ConfigError(f"maxRecordsPerTrigger: {number}, 1 to 10000")
    return number


class TxshareStreamReader(DataSourceStreamReader):
    def __init__(self, options: Any) -> None:
        self.url = _required(options, "coordinator.url")
        self.token = options.get("coordinator.token")
        self.group = _required(options, "shareGroup")
        self.topics = sorted(
            {t.strip() for t in _required(options, "subscribe").split(",") if t.strip()}
        )
        self.job_id = check_job_id(_required(options, "jobId"))
        self.max_records = _max_records(options)
        self.tid = share_tid(self.job_id)
        self.member = self.job_id
        self.epoch = 0
        self._reading = _ReadSettings(self.url, self.token, tuple(self.topics), "read_uncommitted")

    @contextlib.contextmanager
    def _http(self) -> Iterator[HttpClient]:
        http = client(self.url, self.token)
        try:
            yield http
        finally:
            http.close()

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "ranges": []}

    def _join(self, http: HttpClient) -> None:
        """Join the group, or heartbeat: the member's session lasts from plan to plan."""
        path = api_path("share-groups", self.group, "heartbeat")
        body: dict[str, Any] = {"member_id": self.member, "member_epoch": self.epoch}
        if self.epoch == 0:
            body["subscribed_topics"] = self.topics
        try:
            self.epoch = http.call("POST", path, body=body)["member_epoch"]
        except (UnknownMemberId, FencedMemberEpoch):
            self.epoch = 0
            body = {"member_id": self.member, "member_epoch": 0, "subscribed_topics": self.topics}
            self.epoch = http.call("POST", path, body=body)["member_epoch"]

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Plan the next batch: acquire records (at most `limit`'s rows per partition), and
        take their acceptance into the job's share transaction, prepared. Nothing acquired: no
        batch."""
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else 10_000
        with self._http() as http:
            self._join(http)
            # A newer epoch of the share transaction: whatever an earlier plan left open (a batch
            # that never reached its commit) is aborted, and its records released.
            ident = http.call("POST", api_path("init-pid"), body={"transactional_id": self.tid})
            answer = http.call(
                "POST",
                api_path("share-groups", self.group, "fetch"),
                body={
                    "member_id": self.member,
                    "max_records": most,
                    "records": False,
                    "acquire_mode": "record_limit",
                },
            )
            acquired = [
                (a["topic"], a["partition"], a["first_offset"], a["last_offset"])
                for a in answer["acquired"]
            ]
            if not acquired:
                return start
            caller = {
                "producer_id": ident["producer_id"],
                "producer_epoch": ident["producer_epoch"],
            }
            acks = [
                {"topic": t, "partition": p, "first_offset": o, "type": "accept"}
                for t, p, first, last in acquired
                for o in range(first, last + 1)
            ]
            http.call(
                "POST",
                api_path("transactions", self.tid, "share-acknowledgements"),
                body={
                    **caller,
                    "group_id": self.group,
                    "member_id": self.member,
                    "acknowledgements": acks,
                },
            )
            http.call("POST", api_path("transactions", self.tid, "prepare"), body=caller)
        return {"seq": int(start.get("seq", 0)) + 1, "ranges": [list(r) for r in acquired]}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        by_partition: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for topic, partition, first, last in end.get("ranges", []):
            by_partition.setdefault((topic, partition), []).append((first, last))
        return [
            AcquiredRanges(topic, partition, sorted(ranges))
            for (topic, partition), ranges in sorted(by_partition.items())
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, AcquiredRanges)
        for first, last in partition.ranges:
            part = OffsetRange(partition.topic, partition.partition, first, last + 1)
            yield from self._reading.read(part)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the batch. The txlog sink of this job committed the acknowledgements
        with its output; with another sink they are committed here, after it."""
        with self._http() as http:
            try:
                described = http.call("GET", api_path("transactions", self.tid))
            except KafkaException:
                return
            if described["state"] != "Prepared":
                return
            caller = {
                "producer_id": described["producer_id"],
                "producer_epoch": described["producer_epoch"],
            }
            http.call(
                "POST", api_path("transactions", self.tid, "end"), body={**caller, "commit": True}
            )


class TxshareDataSource(DataSource):
    """`format("txshare")`: options `coordinator.url`, `coordinator.token`, `shareGroup`,
    `subscribe` (topics, comma-separated), `jobId` (the txlog sink's, which commits the
    acknowledgements with the output) and `maxRecordsPerTrigger` (per partition, default
    1000). Columns as `txlog`'s."""

    @classmethod
    def name(cls) -> str:
        return "txshare"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxshareStreamReader(self.options)
