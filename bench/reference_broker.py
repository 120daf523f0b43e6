"""Apache Kafka itself on loopback: the reference broker the coordinator is compared with.

One KRaft node, broker and controller combined, its log in a temporary folder removed when it
stops; its jars are the ones `mvn package` resolved from `bench/reference/pom.xml` (the README's
test command does it), nothing else is downloaded. Its settings are a dict (`settings`), printed
with every figure a benchmark makes on it.

    from reference_broker import ReferenceBroker
    with ReferenceBroker() as kafka:
        print(kafka.bootstrap, kafka.describe())

    python bench/reference_broker.py            # runs one until Ctrl-C, printing its address
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from coordinator.launcher import free_port

HERE = Path(__file__).resolve().parent
LIB = HERE / "reference" / "target" / "lib"
READY_S = 90.0


def kafka_version() -> str:
    """The version of the resolved broker (from its jar's name)."""
    jars = sorted(LIB.glob("kafka_2.13-*.jar"))
    if not jars:
        raise RuntimeError(
            f"the reference broker is not resolved in {LIB}: run the README's test command "
            "(mvn -f tests/clients/pom.xml package)"
        )
    return jars[-1].name.removeprefix("kafka_2.13-").removesuffix(".jar")


def java_command(
    classpath: str, main: str, *args: str, needed_by: str, heap: str | None = None
) -> list[str]:
    """A JVM running `main` on `classpath`, its logging at warnings."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(f"no java on PATH: {needed_by} needs Java 17")
    heap_option = [f"-Xmx{heap}"] if heap else []
    quiet = "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"
    return [java, *heap_option, quiet, "-cp", classpath, main, *args]


class ReferenceBroker:
    def __init__(self, port: int | None = None, **overrides: str) -> None:
        self.port = port or free_port()
        self.controller_port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="reference-kafka-"))
        self.process: subprocess.Popen[bytes] | None = None
        # Kafka's defaults but for what one node needs (replication factors of 1) and a first
        # rebalance that does not wait for more members; `overrides` on top.
        self.settings: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.streams.initial.rebalance.delay.ms": "0",
            # A one-node broker delivers nothing to share consumers unless its share-group state
            # topic asks for one replica.
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            **overrides,
        }

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        """What to print beside a figure made on this broker."""
        return {"kafka": kafka_version(), "bootstrap": self.bootstrap, "settings": self.settings}

    def _java(self, main: str, *args: str) -> list[str]:
        kafka_version()  # resolved, or a clear error
        return java_command(f"{LIB}/*", main, *args, heap="1g", needed_by="the reference broker")

    def start(self) -> ReferenceBroker:
        config = self.root / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # `--cluster-id=ID` in one argument: a random id may start with "-" (about one in 64),
        # which the tool's parser would take for an option.
        formatted = subprocess.run(
            self._java(
                "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(config)
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {formatted.stderr[-2000:]}")
        with (self.root / "broker.log").open("ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._await_ready()
        return self

    def _await_ready(self) -> None:
        """Until the broker answers Metadata with itself as a broker (confluent-kafka's admin
        client asks)."""
        import confluent_kafka.admin as admin

        client = admin.AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + READY_S
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the reference broker exited: {self.log_tail()}")
            with contextlib.suppress(Exception):
                if client.list_topics(timeout=1).brokers:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the reference broker did not start: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, size: int = 3000) -> str:
        path = self.root / "broker.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        self.process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReferenceBroker:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run Apache Kafka (KRaft, one node, broker and controller) on loopback until "
        "Ctrl-C, its log in a temporary folder; print its address and settings as JSON."
    )
    parser.add_argument("--port", type=int, help="the PLAINTEXT listener's port (default: free)")
    args = parser.parse_args(argv)
    with ReferenceBroker(args.port) as broker:
        stopping = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
        print(json.dumps(broker.describe()), flush=True)
        signal.sigwait(stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
