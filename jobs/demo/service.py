"""The embedded coordinator the demo runs, and reading a topic back from it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

# -- the service -------------------------------------------------------------------------------


@contextlib.contextmanager
def embedded_coordinator(
    workdir: Path, database_url: str | None = None, kafka_listener: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`coordinator serve` on a free loopback port, on an SQLite file in `workdir` (or on
    `database_url`), its log in `workdir`, with a Kafka listener on `kafka_listener`
    (HOST:PORT) when given; stopped on the way out. Yields its URL and process."""
    from coordinator.launcher import Launched

    database = database_url or f"sqlite:///{workdir / 'coordinator.db'}"
    listener = ["--kafka-listener", kafka_listener] if kafka_listener else []
    served = Launched(
        workdir,
        database_url=database,
        args=["--log-level", "warning", *listener],
        log=workdir / "coordinator.log",
    )
    with served:
        assert served.process is not None
        yield served.url, served.process


def read_topic(url: str, topic: str) -> list[str]:
    """Every committed record's value of `topic` (read_committed), partition by partition."""
    values: list[str] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        partitions = http.get(f"/v1/topics/{topic}").json()["partitions"]
        for partition in partitions:
            offset = 0
            while True:
                page = http.get(
                    f"/v1/topics/{topic}/partitions/{partition['partition']}/records",
                    params={"offset": offset, "max_records": 10_000},
                ).json()
                values.extend(r["value"] for r in page["records"])
                if page["next_offset"] == offset:
                    break
                offset = page["next_offset"]
    return values
