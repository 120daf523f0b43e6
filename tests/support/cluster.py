"""Several `coordinator serve` processes on one store as one Kafka cluster, as an operator runs
them on one machine: each with its own HTTP port and Kafka listener, short leases set by
configuration so a test sees moves within a second or two."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from coordinator.launcher import free_port
from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database

# A broker's lease and heartbeat in these tests (the defaults are Kafka's 9 s and 2 s).
SESSION_TIMEOUT_MS = 1500
HEARTBEAT_INTERVAL_MS = 250


class Cluster:
    """`size` processes on `url`'s store: `brokers[i]` serves Kafka at `kafka_ports[i]`."""

    def __init__(self, url: str, workdir: Path, size: int = 3, **env: str) -> None:
        self.url = url
        self.kafka_ports = [free_port() for _ in range(size)]
        self.brokers = [
            ServiceProcess(
                url,
                workdir,
                COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
                COORDINATOR_KAFKA_BROKER_SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
                COORDINATOR_KAFKA_BROKER_HEARTBEAT_INTERVAL_MS=str(HEARTBEAT_INTERVAL_MS),
                **env,
            )
            for port in self.kafka_ports
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.kafka_ports)

    def start(self) -> Cluster:
        # The first migrates the store; the others start once it has.
        self.brokers[0].start()
        for broker in self.brokers[1:]:
            broker.spawn()
        for broker in self.brokers[1:]:
            broker.wait_healthy()
        return self

    def kill(self, i: int) -> None:
        self.brokers[i].kill()

    def pause(self, i: int) -> None:
        os.kill(self.brokers[i].pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        os.kill(self.brokers[i].pid, signal.SIGCONT)

    def restart(self, i: int) -> None:
        self.brokers[i].kill()
        self.brokers[i].start()

    def stop(self) -> None:
        for i, broker in enumerate(self.brokers):
            with contextlib.suppress(ProcessLookupError, AssertionError):
                self.resume(i)
            broker.stop()

    def kill_then_pause(self, alive: Callable[[], None], rounds: int = 2) -> None:
        """The faults of a run, in turn, `rounds` times: broker 1 SIGKILLed and started again,
        then broker 2 SIGSTOPped past its lease and resumed; `alive()` checks the clients
        between them."""
        for _ in range(rounds):
            self.kill(1)
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 1.5)  # its lease runs out; its partitions move
            alive()
            self.brokers[1].start()
            alive()
            self.pause(2)
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)
            alive()
            self.resume(2)

    def logs(self) -> str:
        return "\n".join(b.log_tail(20_000) for b in self.brokers)


@contextlib.contextmanager
def cluster_on(backend: str, workdir: Path, size: int = 3, **env: str) -> Iterator[Cluster]:
    """A cluster on a fresh store of `backend`; its logs must hold no traceback."""
    postgres = backend == "postgres"
    url = create_postgres_database() if postgres else f"sqlite:///{workdir / 'cluster.db'}"
    running = Cluster(url, workdir, size, **env)
    try:
        yield running.start()
    finally:
        running.stop()
        if postgres:
            drop_postgres_database(url)
    assert "Traceback" not in running.logs(), running.logs()
