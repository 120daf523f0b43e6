"""The nemesis: a seeded schedule of process-level faults during a fault run (the fault proxy
injects the network-level ones). One fault at a time, each recorded as a `fault` event.

- `kill-service`: SIGKILL one service process, then restart it on the same port.
- `pause-producer`: SIGSTOP a producer for longer than its transaction timeout, so the
  coordinator aborts its open transaction, then SIGCONT it: a zombie that must find out.
- `second-instance`: a short process that takes over a live producer's transactional id.
- `restart-postgres`: restart the Postgres server under everything (`pg_ctlcluster`).
- `failover`: SIGKILL the run's own Postgres primary (every process of it), promote its
  standby, and build a new standby from the promoted one (`postgres_pair.PostgresPair`).
- `patroni-kill-postgres`, `patroni-kill-patroni`, `patroni-pause-primary`, `etcd-restart`: on
  a pair that Patroni keeps (`patroni.PatroniPair`), SIGKILL the leader's Postgres, SIGKILL its
  Patroni, SIGSTOP both past the leader lock's TTL, or restart etcd; Patroni fails over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.fault.history import Fault, Recorder
from tests.fault.patroni import PatroniPair
from tests.fault.postgres_pair import PostgresPair
from tests.fault.proxy import FaultProxy
from tests.fault.workers import history_path, tid_of
from tests.support.services import ServiceProcess, free_port

PATRONI_KINDS = (
    "patroni-kill-postgres",
    "patroni-kill-patroni",
    "patroni-pause-primary",
    "etcd-restart",
)
# Where each service is a broker of its own (the cluster profile): one paused past its lease.
CLUSTER_KINDS = ("pause-service",)
NEMESIS_KINDS = (
    "kill-service",
    "pause-producer",
    "second-instance",
    "restart-postgres",
    "failover",
)
SECOND_INSTANCE_WAIT_S = 30.0  # a second instance gives up after 15 s; then it is killed
RESTART_ATTEMPTS = 5
IN_TXN_WAIT_S = 2.0  # how long the nemesis waits for a producer to be inside a transaction

log = logging.getLogger("fault.nemesis")


@dataclass(frozen=True)
class NemesisTiming:
    """Seconds: the quiet gap between faults, how long a killed service stays down, and how far
    past its transaction timeout (plus one sweep interval) a producer stays paused."""

    gap: tuple[float, float] = (1.0, 3.0)
    down: tuple[float, float] = (0.2, 2.0)
    pause_beyond_timeout: tuple[float, float] = (1.0, 3.0)
    first_after: float = 3.0
    # How long `pause-service` keeps a service stopped (past its broker lease, in the cluster
    # profile, so its partitions move while it sleeps).
    service_paused: tuple[float, float] = (2.0, 4.0)


@dataclass
class Targets:
    """What the nemesis may hurt, and how it starts a second instance: `spawn_second(name, tid)`."""

    services: list[ServiceProcess]
    proxy: FaultProxy
    producers: dict[str, subprocess.Popen[bytes]]
    spawn_second: Callable[[str, str], subprocess.Popen[bytes]]
    history: Path  # the directory of the history files
    txn_timeout_s: float
    sweep_interval_s: float
    pair: PostgresPair | None = None  # the run's own primary and standby, for `failover`
    patroni: PatroniPair | None = None  # the pair Patroni keeps, for the `patroni-*` kinds


def postgres_cluster() -> tuple[str, str]:
    """(version, name) of the local cluster, as `pg_ctlcluster` wants them."""
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    if not versions:
        raise RuntimeError("no Postgres cluster under /etc/postgresql")
    return versions[-1], "main"


class Nemesis(threading.Thread):
    """Injects `kinds` in shuffled rounds (each round every kind once, so a short run still
    sees each kind) with seeded gaps, until `stop()`; it always ends a fault it started (resumes
    the paused producer, restarts the killed service) before it returns."""

    def __init__(
        self,
        kinds: tuple[str, ...],
        targets: Targets,
        recorder: Recorder,
        rng: random.Random,
        timing: NemesisTiming,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        unknown = set(kinds) - set(NEMESIS_KINDS) - set(PATRONI_KINDS) - set(CLUSTER_KINDS)
        if unknown:
            raise ValueError(f"unknown nemesis kinds: {sorted(unknown)}")
        self.kinds = kinds
        self.targets = targets
        self.recorder = recorder
        self.rng = rng
        self.timing = timing
        self.error: BaseException | None = None
        self.injected: dict[str, int] = dict.fromkeys(kinds, 0)
        self.second_instances: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            if self._halt.wait(self.timing.first_after):
                return
            while True:
                round_ = list(self.kinds)
                self.rng.shuffle(round_)
                for kind in round_:
                    if self._halt.is_set():
                        return
                    self._inject(kind)
                    if self._halt.wait(self.rng.uniform(*self.timing.gap)):
                        return
        except BaseException as exc:
            log.exception("the nemesis failed")
            self.error = exc

    def _inject(self, kind: str) -> None:
        log.info("nemesis: %s", kind)
        {
            "kill-service": self._kill_service,
            "pause-service": self._pause_service,
            "pause-producer": self._pause_producer,
            "second-instance": self._second_instance,
            "restart-postgres": self._restart_postgres,
            "failover": self._failover,
            "patroni-kill-postgres": lambda: self._patroni(kind, "kill_postgres"),
            "patroni-kill-patroni": lambda: self._patroni(kind, "kill_patroni"),
            "patroni-pause-primary": lambda: self._patroni(kind, "pause_primary"),
            "etcd-restart": lambda: self._patroni(kind, "restart_etcd"),
        }[kind]()
        self.injected[kind] += 1

    def _record(self, fault: str, **detail: object) -> None:
        self.recorder.record(Fault(fault=fault, detail=dict(detail)))

    def _kill_service(self) -> None:
        index = self.rng.randrange(len(self.targets.services))
        down = self.rng.uniform(*self.timing.down)
        service = self.targets.services[index]
        # Marked down first, so that a dead service the proxy still calls up is one that crashed.
        self.targets.proxy.set_up(index, False)
        service.kill()
        self._record("kill-service", service=index, port=service.port, down_s=round(down, 3))
        time.sleep(down)
        restart(service, self.targets.proxy, index)

    def _pause_service(self) -> None:
        """SIGSTOP one service, then SIGCONT it: a broker that sleeps past its lease wakes to
        find its partitions moved, and must not write for them (the store fences it)."""
        index = self.rng.randrange(len(self.targets.services))
        paused = self.rng.uniform(*self.timing.service_paused)
        service = self.targets.services[index]
        if service.process is None or service.process.poll() is not None:
            return
        self.targets.proxy.set_up(index, False)
        os.kill(service.pid, signal.SIGSTOP)
        self._record("pause-service", service=index, port=service.port, paused_s=round(paused, 3))
        try:
            time.sleep(paused)
        finally:
            os.kill(service.pid, signal.SIGCONT)
            self.targets.proxy.set_up(index, True)

    def _pause_producer(self) -> None:
        live = {n: p for n, p in self.targets.producers.items() if p.poll() is None}
        if not live:
            return
        name = self.rng.choice(sorted(live))
        process = live[name]
        beyond = self.rng.uniform(*self.timing.pause_beyond_timeout)
        pause = self.targets.txn_timeout_s + self.targets.sweep_interval_s + beyond
        # A zombie is a producer paused inside a transaction: wait (a little) for it to be in one.
        path = history_path(self.targets.history, name)
        deadline = time.monotonic() + IN_TXN_WAIT_S
        while not (in_txn := _last_kind(path) == "begin") and time.monotonic() < deadline:
            time.sleep(0.005)
        process.send_signal(signal.SIGSTOP)
        try:
            self._record("pause-producer", producer=name, pause_s=round(pause, 3), in_txn=in_txn)
            # Not cut short by stop(): the pause must outlive the transaction timeout.
            time.sleep(pause)
        finally:
            process.send_signal(signal.SIGCONT)

    def _second_instance(self) -> None:
        victim = self.rng.choice(sorted(self.targets.producers))
        name = f"s{len(self.second_instances)}"
        self.second_instances.append(name)
        tid = tid_of(victim)
        process = self.targets.spawn_second(name, tid)
        self._record("second-instance", producer=victim, tid=tid, instance=name)
        try:
            process.wait(SECOND_INSTANCE_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("second instance %s overran; killing it", name)
            process.kill()
            process.wait()

    def _restart_postgres(self) -> None:
        version, cluster = postgres_cluster()
        mode = self.rng.choice(("fast", "immediate"))
        started = time.monotonic()
        subprocess.run(
            [
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                "-m",
                mode,
                version,
                cluster,
                "restart",
            ],
            check=True,
            timeout=120,
            capture_output=True,
        )
        took = time.monotonic() - started
        self._record("restart-postgres", mode=mode, seconds=round(took, 3))

    def _failover(self) -> None:
        if self.targets.pair is None:
            raise RuntimeError("the failover nemesis needs the run's own Postgres pair")
        took = self.targets.pair.failover()
        self._record("failover", **took)

    def _patroni(self, kind: str, fault: str) -> None:
        if self.targets.patroni is None:
            raise RuntimeError(f"the {kind} nemesis needs the run's Patroni pair")
        took = getattr(self.targets.patroni, fault)()
        self._record(kind, **took)


def _last_kind(path: Path) -> str | None:
    """The kind of the last event in a history file (read from its end: it grows all run)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            kind: str = orjson.loads(line)["kind"]
            return kind
    return None


def restart(service: ServiceProcess, proxy: FaultProxy, index: int) -> None:
    """Start a killed service again, on its port if it can be had (a client connection may hold
    it for a while as its local port), else on a new one; then tell the proxy it is back."""
    for attempt in range(RESTART_ATTEMPTS):
        try:
            service.start()
            break
        except (RuntimeError, TimeoutError) as exc:
            if attempt == RESTART_ATTEMPTS - 1:
                raise
            log.warning("restart of %s failed (%s); trying again", service.url, exc)
            service.kill()
            if attempt >= 1:
                service.port = free_port()
                service.log = Path(service.workdir) / f"service-{service.port}.log"
            time.sleep(0.5)
    proxy.set_upstream(index, service.url)
    proxy.set_up(index, True)
