"""A consumer group member as its own process, for the process-level group tests: it subscribes,
polls until SIGTERM (then closes, leaving the group), and appends to a history file every
partition it owns from the moment `on_assign` starts until `on_revoke`/`on_lost` returned.

    python -m tests.support.group_member --url URL --group G --topic T --name NAME --history FILE

Times are `time.monotonic_ns()`, which on Linux is one clock for every process of the machine, so
histories of different processes compare.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TextIO

from sdk import Consumer, TopicPartition


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--url", "--group", "--topic", "--name", "--history"):
        parser.add_argument(option, required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=1500)
    args = parser.parse_args()
    # A line at a time: a SIGKILL loses none of what was recorded.
    with Path(args.history).open("a", buffering=1) as history:
        run(args, history)


def run(args: argparse.Namespace, history: TextIO) -> None:
    def record(event: str, edge: str, partitions: list[TopicPartition]) -> None:
        line = {
            "member": args.name,
            "t": time.monotonic_ns(),
            "event": event,
            "edge": edge,
            "partitions": sorted(tp.partition for tp in partitions),
        }
        history.write(json.dumps(line) + "\n")

    def callback(event: str, edge: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def recorded(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            record(event, "start", partitions)
            if edge == "end":
                record(event, "end", partitions)

        return recorded

    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    consumer = Consumer(
        {
            "coordinator.url": args.url,
            "group.id": args.group,
            "client.id": args.name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": 50,
            "fetch.wait.max.ms": 20,
        }
    )
    consumer.subscribe(
        [args.topic],
        on_assign=callback("assign", "start"),
        on_revoke=callback("revoke", "end"),
        on_lost=callback("lost", "end"),
    )
    record("started", "start", [])
    while not stopping:
        consumer.poll(0.05)
    consumer.close()
    record("closed", "end", [])


if __name__ == "__main__":
    main()
