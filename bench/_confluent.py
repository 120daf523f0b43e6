"""confluent-kafka (librdkafka) producers as the benchmarks run them, against any Kafka
listener: the coordinator's (bench/kafka.py) or Apache Kafka's (bench/side_by_side.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import confluent_kafka as ck
from _support import MB, Window, in_processes
from produce import Payload, Tally, merged


def kafka_producer(
    bootstrap: str,
    partition: int,
    payload: Payload,
    start: float,
    end: float,
    topic: str,
    batch_records: int | None = None,
) -> Tally:
    """Produce to one partition of `topic` until `end`; counts what is acknowledged between
    start and end, and samples librdkafka's statistics meanwhile (what bounds a producer that
    waits on its answers: their round trip, how many are out, how big its batches are), and
    the process's CPU time inside the window.

    `batch_records` None: librdkafka batches as it does by default (up to 10,000 records or
    1 MB a batch, 100,000 records queued), so a batch grows with what waits while a request is
    out. A number: batches of at most that many records, 20 batches queued."""
    tally = Tally()
    failures: list[Any] = []
    clock = time.perf_counter

    def sampled(text: str) -> None:
        if not start <= clock() <= end:
            return
        stats = json.loads(text)
        for broker in stats.get("brokers", {}).values():
            if broker.get("nodeid", -1) >= 0 and broker["rtt"]["cnt"]:
                tally.request_rtt_ms.append(broker["rtt"]["avg"] / 1000)
                tally.in_flight.append(broker["waitresp_cnt"])
        batches = stats.get("topics", {}).get(topic, {}).get("batchsize", {})
        if batches.get("cnt"):
            tally.batch_bytes.append(batches["avg"])

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "log_level": 3,
        "statistics.interval.ms": 1000,
        "stats_cb": sampled,
    }
    if batch_records is not None:
        config["batch.num.messages"] = batch_records
        config["queue.buffering.max.messages"] = 20 * batch_records
    producer = ck.Producer(config)
    size = len(payload.values[0])

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            failures.append(error)
        elif start <= clock() <= end:
            tally.records += 1
            tally.value_bytes += size

    i = 0
    cpu_at_start = None
    while clock() < end:
        if cpu_at_start is None and clock() >= start:
            cpu_at_start = time.process_time()
        try:
            producer.produce(
                topic,
                payload.values[i % len(payload.values)],
                partition=partition,
                on_delivery=delivered,
            )
            i += 1
        except BufferError:
            producer.poll(0.005)
        producer.poll(0)
    if cpu_at_start is not None:
        # Every thread of the process: Python's produce() and callbacks, librdkafka's own.
        tally.client_cpu_s = time.process_time() - cpu_at_start
    producer.flush(30)
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, e.g. {failures[0]}")
    tally.batches = tally.records // len(payload.values)
    return tally


def producers_in_processes(
    bootstrap: str,
    topic: str,
    producers: int,
    partitions: int,
    payload: Payload,
    window: Window,
    batch_records: int | None = None,
) -> Tally:
    """`producers` of `kafka_producer`, each in a process of its own (so the load generator,
    librdkafka's Python produce() per record, is not one interpreter's GIL), on partitions in
    turn; their tallies merged."""
    tallies = in_processes(
        [
            (
                kafka_producer,
                (
                    bootstrap,
                    i % partitions,
                    payload,
                    window.start,
                    window.end,
                    topic,
                    batch_records,
                ),
            )
            for i in range(producers)
        ]
    )
    return merged(tallies)


def transactional_round(
    bootstrap: str,
    payload: Payload,
    seconds: float,
    commit_ms: float,
    transactional: bool,
    n: int,
    topic: str,
    commits: list[float] | None = None,
) -> float:
    """MB/s of one producer for `seconds`: idempotent, or committing every `commit_ms` (each
    commit's milliseconds appended to `commits`, EndTxn's latency as the client sees it)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": len(payload.values),
        "log_level": 3,
    }
    if transactional:
        config["transactional.id"] = f"bench-txn-{n}"
    producer = ck.Producer(config)
    if transactional:
        producer.init_transactions(30)
    size = len(payload.values[0])
    acknowledged = 0

    def delivered(error: Any, _: Any) -> None:
        nonlocal acknowledged
        if error is not None:
            raise RuntimeError(str(error))
        acknowledged += size

    clock = time.perf_counter
    began = clock()
    end = began + seconds
    i = 0
    while clock() < end:
        if transactional:
            producer.begin_transaction()
        round_end = min(end, clock() + commit_ms / 1000)
        while clock() < round_end:
            try:
                producer.produce(
                    topic,
                    payload.values[i % len(payload.values)],
                    partition=0,
                    on_delivery=delivered,
                )
                i += 1
            except BufferError:
                producer.poll(0.005)
            producer.poll(0)
        if transactional:
            committing = clock()
            producer.commit_transaction(30)
            if commits is not None:
                commits.append(1000 * (clock() - committing))
        else:
            producer.flush(30)
    producer.flush(30)
    return acknowledged / MB / (clock() - began)
