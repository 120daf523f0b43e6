"""The Kafka listener's produce throughput, against the HTTP binary path and raw INSERTs, and the
cost of transactions measured with Kafka's own transactional producer.

What it measures, in one run on one machine, on a fresh Postgres database each:

1. kafka (prebuilt batches): `coordinator serve --kafka-listener` in a child process;
   `--producers` idempotent producers speaking Kafka's protocol from this process (InitProducerId,
   then Produce v9 requests built once, only the batch's producer id, epoch, sequence and CRC and
   the correlation id spliced in, one request in flight each): the HTTP phase's load through the
   other door, so `kafka_vs_http` compares the doors, not a client library with a door.
1b. kafka (confluent-kafka): `--producers` confluent-kafka
   (librdkafka) producers, each in a process of its own (one interpreter's GIL would bound the
   load, not the listener) and on its own partition, send 1 KB records (`--record-bytes`) with
   acks=all and idempotence on, as fast as they are acknowledged: first batched as librdkafka
   does by default (`linger.ms` 5, up to 10,000 records or 1 MB a batch), then with batches of
   at most `--batch-records` (`batch.num.messages`), the prebuilt batches' size. MB counted from
   delivery reports inside the measured window. `confluent_vs_prebuilt` is each over the
   prebuilt batches' MB/s.
2. http: bench/produce.py's service phase: the same records as Kafka record batches over
   `POST .../records` (`application/vnd.kafka.record-batch`), one request in flight per producer.
3. raw: bench/produce.py's baseline: the same bytes, one asyncpg INSERT per batch.
4. txn_overhead: one confluent-kafka producer, idempotent, then transactional (a commit every
   `--commit-ms`), alternating for `--rounds` rounds (AB, BA, ...), each for `--overhead-seconds`;
   txn_overhead = 1 - median transactional MB/s / median idempotent MB/s.

Ratios (last stdout line, JSON): kafka_vs_raw = kafka MB/s (prebuilt) / raw MB/s, kafka_vs_http
= kafka MB/s (prebuilt) / http MB/s (confluent_kafka_vs_http with librdkafka's), and
txn_overhead; the service's CPU ms per MB delivered in each produce phase.

    python bench/kafka.py --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _confluent import producers_in_processes, transactional_round
from _support import (
    MB,
    BatchTemplate,
    BenchFailure,
    Window,
    add_postgres_url,
    cancel_on_sigterm,
    checkpoint,
    cpu_in_window,
    log,
    plain_url,
    positive_float,
    positive_int,
    run_bench,
    scratch_database,
    serving,
)
from produce import (
    SERVE,
    SERVE_OPTIONS,
    Figures,
    Payload,
    Tally,
    merged,
    raw_writer,
    run_raw,
    run_service,
)

from coordinator.kafka.wire import payload_type
from coordinator.launcher import free_port

TOPIC = "bench-kafka"


# -- prebuilt Produce requests: the door, not the client ----------------------------------------


def _frame(api_key: int, version: int, body: Any, correlation_id: int) -> bytes:
    """A request frame, size prefix included, encoded by kio."""
    request_type = payload_type(api_key, version, EntityType.request)
    header_type = request_type.__header_schema__
    buffer = io.BytesIO()
    header = header_type(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id="bench",
    )
    entity_writer(header_type)(buffer, header)
    entity_writer(request_type)(buffer, body)
    encoded = buffer.getvalue()
    return len(encoded).to_bytes(4, "big") + encoded


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes, api: tuple[int, int]
) -> Any:
    writer.write(frame)
    size = int.from_bytes(await reader.readexactly(4), "big")
    answer = await reader.readexactly(size)
    response_type = payload_type(*api, EntityType.response)
    _, used = entity_reader(response_type.__header_schema__)(answer, 0)
    return entity_reader(response_type)(answer, used)[0]


async def prebuilt_producer(port: int, partition: int, payload: Payload, window: Window) -> Tally:
    """An idempotent producer speaking Kafka's protocol with prebuilt record batches (the HTTP
    phase's load: one request in flight, the batch built once, only its producer id, epoch,
    sequence and CRC spliced in), so the figure is the listener's, not a client library's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        init_type = payload_type(22, 4, EntityType.request)
        init = await _call(
            reader,
            writer,
            _frame(
                22,
                4,
                init_type(
                    transactional_id=None,
                    transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=-1,
                    producer_epoch=-1,
                ),
                0,
            ),
            (22, 4),
        )
        if init.error_code != ErrorCode.none:
            raise BenchFailure(f"InitProducerId: {init.error_code}")
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        template = BatchTemplate(payload.values)
        first = template.at(pid, epoch, 0)
        module: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
        produce = payload_type(0, 9, EntityType.request)(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(
                module.TopicProduceData(
                    name=TOPIC,
                    partition_data=(module.PartitionProduceData(index=partition, records=first),),
                ),
            ),
        )
        frame = bytearray(_frame(0, 9, produce, 1))
        at = frame.find(first)
        batch_records = len(payload.values)
        batch_bytes = sum(len(v) for v in payload.values)
        clock = time.perf_counter
        tally = Tally()
        sequence = 0
        while True:
            sent = clock()
            if sent >= window.end:
                return tally
            frame[8:12] = (sequence // batch_records + 1).to_bytes(4, "big")  # correlation id
            frame[at : at + len(first)] = template.at(pid, epoch, sequence)
            answer = await _call(reader, writer, bytes(frame), (0, 9))
            done = clock()
            result = answer.responses[0].partition_responses[0]
            if result.error_code != ErrorCode.none:
                raise BenchFailure(f"produce pid {pid} seq {sequence}: {result.error_code}")
            sequence += batch_records
            tally.count(window, sent, done, 1, batch_records, batch_bytes)
    finally:
        writer.close()


# -- confluent-kafka ------------------------------------------------------------------------------


def run_kafka(
    bootstrap: str,
    args: argparse.Namespace,
    payload: Payload,
    window: Window,
    batch_records: int | None,
) -> tuple[Tally, float]:
    """Each producer in a process of its own, so the load generator (librdkafka's Python
    produce() per record) is not one interpreter's GIL."""
    return producers_in_processes(
        bootstrap, TOPIC, args.producers, args.partitions, payload, window, batch_records
    ), args.seconds


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    server_url = plain_url(args.postgres_url)
    payload = Payload.build(args.batch_records, args.record_bytes)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    options = [*SERVE_OPTIONS, "--kafka-listener", bootstrap]
    async with (
        scratch_database(server_url, "bench_") as (_, database_url),
        serving(database_url, "bench-kafka-", SERVE, options) as service,
    ):
        async with httpx.AsyncClient(base_url=service.url) as client:
            response = await client.post(
                "/v1/topics", json={"name": TOPIC, "partitions": args.partitions}
            )
            response.raise_for_status()
        await checkpoint(database_url)
        confluent: dict[str, tuple[Tally, float, float]] = {}
        for batching, records in (("own", None), ("fixed", args.batch_records)):
            log(f"kafka phase, librdkafka's {batching} batches: {args.seconds:g} s")
            # Spawning the client processes takes a moment of its own: the window starts after.
            window = Window.after(args.warmup + 2.0, args.seconds)
            service_cpu = asyncio.create_task(cpu_in_window(service.pid, window))
            tally, seconds = await asyncio.to_thread(
                run_kafka, bootstrap, args, payload, window, records
            )
            confluent[batching] = (tally, seconds, await service_cpu)
            await checkpoint(database_url)
        log(f"kafka phase, prebuilt batches: {args.warmup:g} s warm-up + {args.seconds:g} s")
        window = Window.after(args.warmup, args.seconds)
        prebuilt_cpu = asyncio.create_task(cpu_in_window(service.pid, window))
        prebuilt_tallies = await asyncio.gather(
            *(
                prebuilt_producer(port, i % args.partitions, payload, window)
                for i in range(args.producers)
            )
        )
        prebuilt_cpu_s = await prebuilt_cpu
        log(f"txn_overhead: {args.rounds} rounds of 2 x {args.overhead_seconds:g} s")
        idempotent: list[float] = []
        transactional: list[float] = []
        for n in range(args.rounds):
            order = (False, True) if n % 2 == 0 else (True, False)
            for txn in order:
                mb_s = await asyncio.to_thread(
                    transactional_round,
                    bootstrap,
                    payload,
                    args.overhead_seconds,
                    args.commit_ms,
                    txn,
                    n,
                    TOPIC,
                )
                (transactional if txn else idempotent).append(mb_s)
    async with scratch_database(server_url, "bench_") as (_, database_url):
        async with serving(database_url, "bench-kafka-http-", SERVE, SERVE_OPTIONS) as service:
            await checkpoint(database_url)
            log(f"http phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
            http_tally, http_seconds, http_cpu_s, _ = await run_service(
                service, args.producers, args, payload
            )
        await checkpoint(database_url)
        log(f"raw phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
        raw_tally, raw_seconds = await run_raw(
            database_url, args.producers, args, payload, raw_writer
        )
    kafka_tally, kafka_seconds, kafka_cpu_s = confluent["own"]
    kafka = Figures.of(kafka_tally, kafka_seconds)
    fixed_tally, fixed_seconds, fixed_cpu_s = confluent["fixed"]
    fixed = Figures.of(fixed_tally, fixed_seconds)
    fixed_cpu_ms_per_mb = 1000 * fixed_cpu_s / (fixed_tally.value_bytes / MB or 1)
    batch_kb = statistics.median(kafka_tally.batch_bytes or [float("nan")]) / 1024
    prebuilt_tally = merged(list(prebuilt_tallies))
    prebuilt = Figures.of(prebuilt_tally, args.seconds)
    prebuilt_cpu_ms_per_mb = 1000 * prebuilt_cpu_s / (prebuilt_tally.value_bytes / MB or 1)
    http = Figures.of(http_tally, http_seconds)
    raw = Figures.of(raw_tally, raw_seconds)
    overhead = 1 - statistics.median(transactional) / statistics.median(idempotent)
    kafka_cpu_ms_per_mb = 1000 * kafka_cpu_s / (kafka_tally.value_bytes / MB or 1)
    http_cpu_ms_per_mb = 1000 * http_cpu_s / (http_tally.value_bytes / MB or 1)
    print()
    print(
        f"produce: {args.producers} producers, {args.partitions} partitions, "
        f"{args.record_bytes} B records, {args.batch_records} per batch, {args.seconds:g} s"
    )
    for name, f, cpu in (
        ("kafka (prebuilt batches)", prebuilt, prebuilt_cpu_ms_per_mb),
        ("kafka (confluent-kafka)", kafka, kafka_cpu_ms_per_mb),
        (f"  its batches of {args.batch_records}", fixed, fixed_cpu_ms_per_mb),
        ("http (record batches)", http, http_cpu_ms_per_mb),
        ("raw (INSERT)", raw, float("nan")),
    ):
        print(
            f"  {name:<26}{f.records_per_s:>12,.0f} records/s{f.mb_per_s:>10.2f} MB/s"
            f"{f.p50_ms:>8.1f} ms p50   service CPU {cpu:.1f} ms/MB"
        )
    print(
        f"kafka_vs_raw: {prebuilt.mb_per_s / raw.mb_per_s:.3f}  "
        f"kafka_vs_http: {prebuilt.mb_per_s / http.mb_per_s:.3f}  (prebuilt batches; "
        f"confluent-kafka: {kafka.mb_per_s / raw.mb_per_s:.3f}, "
        f"{kafka.mb_per_s / http.mb_per_s:.3f})"
    )
    print(
        f"confluent_vs_prebuilt: {kafka.mb_per_s / prebuilt.mb_per_s:.3f} (librdkafka's own "
        f"batches, {batch_kb:.0f} KB on average), "
        f"{fixed.mb_per_s / prebuilt.mb_per_s:.3f} (at most {args.batch_records} records)"
    )
    print(
        f"txn_overhead (confluent-kafka, commit every {args.commit_ms:g} ms): {overhead:.4f} "
        f"(idempotent {statistics.median(idempotent):.2f} MB/s, "
        f"transactional {statistics.median(transactional):.2f} MB/s)"
    )
    print(
        json.dumps(
            {
                "kafka_mb_per_s": round(prebuilt.mb_per_s, 3),
                "confluent_kafka_mb_per_s": round(kafka.mb_per_s, 3),
                "http_mb_per_s": round(http.mb_per_s, 3),
                "raw_mb_per_s": round(raw.mb_per_s, 3),
                "kafka_vs_raw": round(prebuilt.mb_per_s / raw.mb_per_s, 4),
                "kafka_vs_http": round(prebuilt.mb_per_s / http.mb_per_s, 4),
                "confluent_kafka_vs_http": round(kafka.mb_per_s / http.mb_per_s, 4),
                "confluent_vs_prebuilt": round(kafka.mb_per_s / prebuilt.mb_per_s, 4),
                "confluent_batch_kb": round(batch_kb, 1),
                "confluent_fixed_batches_mb_per_s": round(fixed.mb_per_s, 3),
                "confluent_fixed_batches_vs_prebuilt": round(fixed.mb_per_s / prebuilt.mb_per_s, 4),
                "kafka_service_cpu_ms_per_mb": round(prebuilt_cpu_ms_per_mb, 2),
                "confluent_kafka_service_cpu_ms_per_mb": round(kafka_cpu_ms_per_mb, 2),
                "http_service_cpu_ms_per_mb": round(http_cpu_ms_per_mb, 2),
                "idempotent_mb_per_s": round(statistics.median(idempotent), 3),
                "transactional_mb_per_s": round(statistics.median(transactional), 3),
                "txn_overhead": round(overhead, 4),
                "producers": args.producers,
                "record_bytes": args.record_bytes,
                "seconds": args.seconds,
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce throughput through the Kafka listener (confluent-kafka) vs the HTTP "
        "binary path vs raw INSERTs, and txn_overhead with confluent-kafka's transactional "
        "producer. The last stdout line is a JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--producers", type=positive_int, default=4, help="concurrent producers")
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument("--seconds", type=positive_float, default=15.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per phase")
    parser.add_argument("--rounds", type=positive_int, default=3, help="txn_overhead rounds")
    parser.add_argument("--overhead-seconds", type=positive_float, default=5.0, help="per mode")
    parser.add_argument("--commit-ms", type=positive_float, default=100.0, help="commit interval")
    args = parser.parse_args(argv)
    args.partitions = args.producers
    args.format = "binary"
    return args


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
