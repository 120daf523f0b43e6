"""Kafka's own Java producer as the benchmarks run it: `kafka-producer-perf-test`
(`org.apache.kafka.tools.ProducerPerformance`, Kafka's own measure of a producer), from the jars
the README's test command builds in tests/clients/java (kafka-clients and kafka-tools, pinned in
its pom), against any Kafka listener."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from _support import MB
from reference_broker import java_command

JAVA_CLIENT = Path(__file__).resolve().parents[1] / "tests" / "clients" / "java" / "target"
PERF_TEST = "org.apache.kafka.tools.ProducerPerformance"
# Its summary of what came after the warm-up records, e.g. "240000 steady state records sent,
# 56390.97 records/sec (55.07 MB/sec), ...".
STEADY = re.compile(r"steady state records sent, ([\d.]+) records/sec")


def perf_test_command(*args: str) -> list[str]:
    if not (JAVA_CLIENT / "lib").is_dir():
        raise RuntimeError(
            "the Java client is not built: run the README's test command "
            "(mvn -f tests/clients/pom.xml package, with Java 17 and Maven)"
        )
    classpath = f"{JAVA_CLIENT / 'classes'}:{JAVA_CLIENT / 'lib'}/*"
    return java_command(classpath, PERF_TEST, *args, needed_by="kafka-producer-perf-test")


def java_producers(
    bootstrap: str,
    topic: str,
    producers: int,
    records: int,
    record_bytes: int,
    properties: dict[str, str],
) -> float:
    """MB/s of `producers` Java producers (acks=all, idempotent, the producer's defaults but
    `properties`) run at once, each sending `records` records of `record_bytes` bytes as fast as
    it can (the first fifth a warm-up): the sum of their steady-state rates."""
    settings = {"acks": "all", "enable.idempotence": "true", **properties}
    command = perf_test_command(
        "--bootstrap-server", bootstrap,
        "--topic", topic,
        "--num-records", str(records),
        "--warmup-records", str(records // 5),
        "--record-size", str(record_bytes),
        "--throughput", "-1",
        "--reporting-interval", str(3_600_000),
        "--command-property", *(f"{k}={v}" for k, v in settings.items()),
    )  # fmt: skip
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(producers)
    ]
    total = 0.0
    for run in runs:
        out, err = run.communicate(timeout=600)
        found = STEADY.search(out)
        if run.returncode != 0 or found is None:
            raise RuntimeError(f"kafka-producer-perf-test failed ({run.returncode}): {err[-2000:]}")
        total += float(found.group(1)) * record_bytes / MB
    return total
