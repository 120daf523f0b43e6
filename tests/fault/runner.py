"""The fault run: two service processes on a fresh Postgres database, transactional producers
(through the fault proxy), read_committed readers and the nemesis; then, with every fault stopped,
a final read and the checker's verdict on the recorded history.

Every process it starts is stopped when it returns or raises, and the database is dropped.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

from tests.fault import evidence
from tests.fault.checker import Report, check
from tests.fault.history import (
    Begin,
    FaultCount,
    Group,
    Recorder,
    SentOffset,
    Txn,
    Write,
    load,
)
from tests.fault.nemesis import (
    NEMESIS_KINDS,
    PATRONI_KINDS,
    Nemesis,
    NemesisTiming,
    Targets,
    restart,
)
from tests.fault.patroni import SETTINGS as PATRONI_SETTINGS
from tests.fault.patroni import PatroniPair
from tests.fault.postgres_pair import PostgresPair
from tests.fault.proxy import FAULT_KINDS, FaultProxy, ProxyFaults
from tests.fault.workers import (
    INPUT_TOPIC,
    TOPIC,
    group_of,
    history_path,
    plans_path,
    producer_of,
)
from tests.support.services import (
    ServiceProcess,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)

SWEEP_INTERVAL_MS = 500  # COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS: timeouts must bite within a run
# The cluster profile's broker lease and heartbeat (Kafka's defaults are 9 s and 2 s).
BROKER_SESSION_TIMEOUT_MS = 1500
BROKER_HEARTBEAT_MS = 250
SETTLE_S = 60.0  # bound on waiting for the last open transactions to end before the final read
# How far a run may go past its end until it did what its profile demands (every fault kind, as
# many times as asked, and `min_committed` transactions): a slow machine runs longer, a stuck
# one fails.
COVERAGE_GRACE_S = 120.0
RECOVERY_S = 60.0  # bound on each producer's first commit once the faults stopped
STOP_PRODUCERS_S = 60.0  # a producer asked to stop finishes its transaction within this
HTTP = httpx.Timeout(10.0)


@dataclass(frozen=True)
class Profile:
    """What a run does. `min_committed` and `min_faults` (by kind; 1 for a kind not named) are
    what a run must do before it ends, so that it cannot pass idle: an amount of work under the
    faults, not a rate: the run goes on past `minutes`, within COVERAGE_GRACE_S, until it is
    done."""

    name: str
    minutes: float
    nemesis: tuple[str, ...]
    proxy: ProxyFaults
    timing: NemesisTiming = field(default_factory=NemesisTiming)
    producers: int = 4
    partitions: int = 6
    txn_timeout_ms: int = 5_000
    producer_think_ms: int = 100
    min_committed: int = 0
    min_faults: Mapping[str, int] = field(default_factory=dict)
    # Which door the producers use: "http" (the SDK, through the fault proxy), "kafka"
    # (confluent-kafka to the services' Kafka listeners; the readers stay on HTTP), or "both"
    # (half the producers through each, with each second instance through its victim's door).
    door: str = "http"
    # With the `failover` nemesis: the run's own Postgres primary and standby, replicating
    # "sync" (synchronous_standby_names '*') or "async", in place of a database on the shared
    # server.
    replication: str | None = None
    # The standby's replication link delays every byte this long each way (another zone).
    link_delay_ms: int = 0
    # With the `patroni-*` and `etcd-restart` nemeses: a primary and a synchronous standby that
    # Patroni keeps, with etcd (`tests.fault.patroni`), in place of a database on the shared
    # server.
    patroni: bool = False
    # 0: two services behind one Kafka listener (one broker, as `serve --workers 2`); n: n
    # services, each a broker with its own listener, as one cluster (docs/pages/cluster.md).
    brokers: int = 0

    def door_of(self, producer: str) -> str:
        """The door of producer `producer` ("p3"), or of a second instance of its id."""
        if self.door != "both":
            return self.door
        return "kafka" if int(producer.removeprefix("p")) % 2 else "http"

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        """Every fault kind this profile injects (each is expected at least once)."""
        network = tuple(k for k in FAULT_KINDS if self.proxy.probability(k) > 0)
        return self.nemesis + network

    def short_of(self, injected: Mapping[str, int], committed: int) -> list[str]:
        """What a run with these fault counts and committed transactions has not yet done of
        what this profile demands: each fault kind injected too few times, and the commits."""
        short = [k for k in self.fault_kinds if injected.get(k, 0) < self.min_faults.get(k, 1)]
        if committed < self.min_committed:
            short.append(f"{self.min_committed} committed transactions")
        return short


_PROXY_FAULTS = ProxyFaults(
    drop_request=0.015, drop_response=0.015, delay=0.03, duplicate_request=0.03
)

PROFILES = {
    "short": Profile(
        name="short",
        minutes=1.0,
        # No Postgres restarts: the test suite shares the server (and its pooled connections).
        nemesis=("kill-service", "pause-producer", "second-instance"),
        proxy=_PROXY_FAULTS,
        timing=NemesisTiming(gap=(1.0, 3.0)),
        min_committed=150,
    ),
    "failover": Profile(
        name="failover",
        minutes=1.0,
        # The primary SIGKILLed, the standby promoted, a new standby built: again and again.
        nemesis=("failover",),
        proxy=_PROXY_FAULTS,
        timing=NemesisTiming(gap=(2.0, 5.0)),
        min_committed=60,
        min_faults={"failover": 5},  # several per run
        replication="sync",
    ),
    "patroni": Profile(
        name="patroni",
        minutes=2.0,
        # Patroni, not the harness, notices each failure and promotes.
        nemesis=PATRONI_KINDS,
        proxy=_PROXY_FAULTS,
        timing=NemesisTiming(gap=(2.0, 5.0)),
        min_committed=60,
        patroni=True,
    ),
    "cluster": Profile(
        name="cluster",
        minutes=1.0,
        # Three brokers: one SIGKILLed (then restarted), one SIGSTOPped past its lease (then
        # resumed), in turn, while transactional librdkafka producers write through them.
        nemesis=("kill-service", "pause-service", "pause-producer", "second-instance"),
        proxy=_PROXY_FAULTS,
        timing=NemesisTiming(gap=(1.0, 3.0)),
        min_committed=100,
        door="kafka",
        brokers=3,
    ),
    "long": Profile(
        name="long",
        minutes=10.0,
        nemesis=NEMESIS_KINDS,
        proxy=_PROXY_FAULTS,
        timing=NemesisTiming(gap=(2.0, 6.0)),
    ),
}


@dataclass
class RunResult:
    report: Report
    profile: Profile
    seed: int
    out: Path

    def summary(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "seed": self.seed,
            "minutes": self.profile.minutes,
            "door": self.profile.door,
            **(
                {
                    "replication": self.profile.replication,
                    "link_delay_ms": self.profile.link_delay_ms,
                }
                if self.profile.replication
                else {}
            ),
            **({"patroni": PATRONI_SETTINGS} if self.profile.patroni else {}),
            "history": str(self.out),
            **self.report.summary(),
        }


class RunError(Exception):
    """The run itself broke (a worker crashed, a service would not start): no verdict."""


def with_postgres_restarts(profile: Profile, enabled: bool) -> Profile:
    kinds = tuple(k for k in profile.nemesis if k != "restart-postgres")
    if enabled:
        kinds += ("restart-postgres",)
    return replace(profile, nemesis=kinds)


def run(profile: Profile, seed: int, out: Path, progress: TextIO = sys.stderr) -> RunResult:
    """One run of `profile` with `seed`, its history in `out`; raises RunError if it broke."""
    with _Run(profile, seed, out, progress) as r:
        return r.execute()


class _Run:
    def __init__(self, profile: Profile, seed: int, out: Path, progress: TextIO) -> None:
        self.profile = profile
        self.seed = seed
        self.out = out
        self.progress = progress
        self.rng = random.Random(seed)
        self.t0 = time.monotonic()
        self.history = out / "history"
        self.plans = out / "plans"
        self.logs = out / "logs"
        for d in (self.history, self.plans, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.database: str | None = None
        self.url: str | None = None  # the store's, whichever kind
        self.pair: PostgresPair | None = None
        self.patroni: PatroniPair | None = None
        self.services: list[ServiceProcess] = []
        self.proxy: FaultProxy | None = None
        self.nemesis: Nemesis | None = None
        self.producers: dict[str, subprocess.Popen[bytes]] = {}
        self.readers: dict[str, subprocess.Popen[bytes]] = {}
        self.children: list[subprocess.Popen[bytes]] = []
        self.children_lock = threading.Lock()
        self.runner_log = Recorder(self.history / "runner.jsonl", "runner", origin=self.t0)

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {message}", file=self.progress, flush=True)

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the run -----------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        p = self.profile
        self.say(f"profile {p.name}, {p.minutes:g} min, seed {self.seed}, history in {self.out}")
        self.say(f"faults: {', '.join(p.fault_kinds)}")
        self.start_services()
        self.proxy = FaultProxy([s.url for s in self.services], p.proxy, self.rng.getrandbits(32))
        self.proxy.start()
        producer_names = [f"p{i}" for i in range(p.producers)]
        self.readers["c0"] = self.spawn("c0", "reader", "--urls", self.proxy.url)
        self.readers["c1"] = self.spawn(
            "c1",
            "reader",
            "--urls",
            ",".join(s.url for s in self.services),
            "--groups",
            ",".join(group_of(n) for n in producer_names),
        )
        for name in producer_names:
            self.producers[name] = self.spawn_producer(name)
        self.nemesis = Nemesis(
            p.nemesis,
            Targets(
                services=self.services,
                proxy=self.proxy,
                producers=self.producers,
                spawn_second=self.spawn_second,
                history=self.history,
                txn_timeout_s=p.txn_timeout_ms / 1000,
                sweep_interval_s=SWEEP_INTERVAL_MS / 1000,
                pair=self.pair,
                patroni=self.patroni,
            ),
            Recorder(self.history / "nemesis.jsonl", "nemesis", origin=self.t0),
            random.Random(self.rng.getrandbits(32)),
            p.timing,
        )
        self.nemesis.start()
        self.say(f"running: {p.producers} producers, 2 readers, proxy {self.proxy.url}")
        self.watch(time.monotonic() + p.minutes * 60)
        self.wind_down()
        return self.verdict()

    def start_services(self) -> None:
        if self.profile.patroni:
            self.patroni = PatroniPair().start()
            url = self.patroni.url
            self.say(f"Patroni pair ({self.patroni.settings}): {url}")
        elif self.profile.replication is not None:
            self.pair = PostgresPair(
                synchronous=self.profile.replication == "sync",
                link_delay_ms=self.profile.link_delay_ms,
            ).start()
            url = self.pair.url
            self.say(
                f"Postgres pair ({self.profile.replication} replication, link delay "
                f"{self.profile.link_delay_ms} ms): {url}"
            )
        else:
            url = self.database = create_postgres_database()
            self.say(f"database {self.database.rpartition('/')[2]}")
        self.url = url
        env = {
            "COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS": str(SWEEP_INTERVAL_MS),
            "COORDINATOR_POOL_SIZE": "5",
        }
        if self.profile.door in ("kafka", "both"):
            # Both services listen on one address (SO_REUSEPORT, as `serve --workers N` does):
            # Kafka's clients know the one broker, node 0, by one address, and a killed
            # service's connections go to the other when they reconnect.
            env["COORDINATOR_KAFKA_LISTENER"] = f"127.0.0.1:{free_port()}"
        if self.profile.brokers:
            # Each service a broker of its own, with a lease short enough for a minute's run.
            env["COORDINATOR_KAFKA_BROKER_SESSION_TIMEOUT_MS"] = str(BROKER_SESSION_TIMEOUT_MS)
            env["COORDINATOR_KAFKA_BROKER_HEARTBEAT_INTERVAL_MS"] = str(BROKER_HEARTBEAT_MS)
        for _ in range(self.profile.brokers or 2):
            # One after the other: the first `serve` migrates the database.
            if self.profile.brokers:
                env["COORDINATOR_KAFKA_LISTENER"] = f"127.0.0.1:{free_port()}"
            service = ServiceProcess(url, self.logs, **env)
            self.services.append(service)
            service.start()
        with httpx.Client(base_url=self.services[0].url, timeout=HTTP) as http:
            for name, partitions in ((TOPIC, self.profile.partitions), (INPUT_TOPIC, 1)):
                answer = http.post("/v1/topics", json={"name": name, "partitions": partitions})
                if answer.status_code != 201:
                    raise RunError(f"creating topic {name}: {answer.status_code} {answer.text}")
        self.say("services: " + ", ".join(s.url for s in self.services))

    def spawn(self, name: str, kind: str, *args: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.fault.workers", kind, "--name", name]
        argv += ["--out", str(self.history), "--t0", repr(self.t0)]
        argv += ["--partitions", str(self.profile.partitions), *args]
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2]
            )
        with self.children_lock:
            self.children.append(process)
        return process

    def producing_args(self, producer: str) -> list[str]:
        assert self.proxy is not None
        return [
            "--url",
            self.proxy.url,
            "--seed",
            str(self.rng.getrandbits(32)),
            "--txn-timeout-ms",
            str(self.profile.txn_timeout_ms),
            "--plans",
            str(self.plans),
            *(
                ["--bootstrap", self.bootstrap()]
                if self.profile.door_of(producer) == "kafka"
                else []
            ),
        ]

    def bootstrap(self) -> str:
        """Every broker's listener (one, shared by both services, but in the cluster profile)."""
        listeners = dict.fromkeys(s.env["COORDINATOR_KAFKA_LISTENER"] for s in self.services)
        return ",".join(listeners)

    def spawn_producer(self, name: str) -> subprocess.Popen[bytes]:
        args = [*self.producing_args(name), "--think-ms", str(self.profile.producer_think_ms)]
        return self.spawn(name, "producer", *args)

    def spawn_second(self, name: str, tid: str) -> subprocess.Popen[bytes]:
        args = self.producing_args(producer_of(tid))
        return self.spawn(name, "second", *args, "--tid", tid)

    def injected(self) -> dict[str, int]:
        assert self.nemesis is not None and self.proxy is not None
        return {**self.nemesis.injected, **self.proxy.counts}

    def not_yet_done(self) -> list[str]:
        """What the profile demands that the run has not done yet (`Profile.short_of`), its
        commits counted by the checker on the history so far, as its verdict will count them."""
        committed = check(load(sorted(self.history.glob("*.jsonl")))).committed
        return self.profile.short_of(self.injected(), committed)

    def watch(self, until: float) -> None:
        """Wait out the run, and past its end until it did what the profile demands (within
        COVERAGE_GRACE_S), so a slow machine runs longer rather than judging too little work;
        fail at once if a worker dies or the nemesis breaks."""
        next_report = time.monotonic() + 15
        latest = until + COVERAGE_GRACE_S
        while (now := time.monotonic()) < until or (now < latest and self.not_yet_done()):
            time.sleep(0.5)
            for name, process in {**self.producers, **self.readers}.items():
                if process.poll() is not None:
                    raise RunError(f"{name} exited with {process.returncode}: {self.tail(name)}")
            assert self.nemesis is not None and self.proxy is not None
            for index, service in enumerate(self.services):
                exited = service.process is not None and service.process.poll() is not None
                if exited and self.proxy.is_up(index):
                    raise RunError(f"service {service.url} died: {service.log.read_text()[-3000:]}")
            if self.nemesis.error is not None:
                raise RunError(f"the nemesis failed: {self.nemesis.error!r}")
            if time.monotonic() >= next_report:
                next_report += 15
                self.say(f"faults so far: {self.injected()}")

    def tail(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def wind_down(self) -> None:
        """Stop every fault, then every writer, and wait until nothing is open any more."""
        assert self.nemesis is not None and self.proxy is not None
        self.say("stopping the nemesis")
        self.nemesis.stop()
        self.nemesis.join(120)
        if self.nemesis.is_alive():
            raise RunError("the nemesis did not stop")
        if self.nemesis.error is not None:
            raise RunError(f"the nemesis failed: {self.nemesis.error!r}")
        self.proxy.disable_faults()
        self.await_recovery()
        self.say("stopping the producers")
        for process in self.producers.values():
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_PRODUCERS_S
        for name, process in self.producers.items():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{name} did not stop in time: killed (its last txn becomes unknown)")
                process.kill()
                process.wait()
            if process.returncode not in (0, -signal.SIGKILL):
                raise RunError(f"{name} exited with {process.returncode}: {self.tail(name)}")
        # Nothing of a producer may reach a service after this, not even a delayed request.
        self.proxy.stop()
        for name, process in self.readers.items():
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired as exc:
                raise RunError(f"reader {name} did not stop") from exc
        for index, service in enumerate(self.services):
            if service.process is None or service.process.poll() is not None:
                restart(service, self.proxy, index)
        self.settle()

    def await_recovery(self) -> None:
        """Every producer commits again once the faults stop: a zombie, a fenced instance, one
        whose service died, each must find its way back by itself."""
        quiet = time.monotonic() - self.t0
        deadline = time.monotonic() + RECOVERY_S
        waiting = set(self.producers)
        while True:
            waiting = {n for n in waiting if not _committed_since(self.history_of(n), quiet)}
            if not waiting:
                return
            if time.monotonic() > deadline:
                stuck = ", ".join(sorted(waiting))
                raise RunError(f"no commit {RECOVERY_S:g}s after the faults stopped: {stuck}")
            time.sleep(0.2)

    def history_of(self, process: str) -> Path:
        return history_path(self.history, process)

    def settle(self) -> None:
        """Wait until no transaction is open (the coordinator times out what the dead left
        open), so that the final read reaches each partition's high watermark."""
        deadline = time.monotonic() + SETTLE_S
        with httpx.Client(base_url=self.services[0].url, timeout=HTTP) as http:
            while True:
                described = http.get(f"/v1/topics/{TOPIC}").json()["partitions"]
                pinned = [p for p in described if p["last_stable_offset"] != p["high_watermark"]]
                listed = http.get("/v1/admin/transactions").json()["transactions"]
                open_ = [t["transactional_id"] for t in listed if t["state"] in _OPEN_STATES]
                if not pinned and not open_:
                    return
                if time.monotonic() > deadline:
                    raise RunError(f"still open after {SETTLE_S:g}s: {open_}, pinned {pinned}")
                time.sleep(0.2)

    def verdict(self) -> RunResult:
        assert self.proxy is not None and self.nemesis is not None
        self.say("final reads")
        names = [*self.producers, *self.nemesis.second_instances]
        self.record_final_groups(names)
        finals = [
            self.spawn(reader, "reader", "--phase", "final", "--urls", service.url)
            # Each reader through a service of its own (the first two of the cluster's three).
            for reader, service in zip(self.readers, self.services, strict=False)
        ]
        for name, process in zip(self.readers, finals, strict=True):
            try:
                code = process.wait(180)
            except subprocess.TimeoutExpired as exc:
                raise RunError(f"the final read of {name} did not end") from exc
            if code != 0:
                raise RunError(f"the final read of {name} failed: {self.tail(name)}")
        for kind, count in self.proxy.counts.items():
            self.runner_log.record(FaultCount(fault=kind, count=count, process="proxy"))
        for name in names:
            self.record_unfinished(name)
        files = sorted(self.history.glob("*.jsonl"))
        report = check(load(files))
        if not report.ok and self.url is not None:
            self.say(f"anomalies: the store's evidence in {evidence.save(self.url, self.out)}")
        return RunResult(report, self.profile, self.seed, self.out)

    def record_final_groups(self, names: list[str]) -> None:
        deadline = time.monotonic() + SETTLE_S
        with httpx.Client(base_url=self.services[1].url, timeout=HTTP) as http:
            for name in names:
                group = group_of(name)
                while True:
                    answer = http.get(
                        f"/v1/groups/{group}/offsets",
                        params={"topic": INPUT_TOPIC, "require_stable": "true"},
                    )
                    if answer.status_code == 200:
                        break
                    if time.monotonic() > deadline:
                        raise RunError(f"group {group}: {answer.status_code} {answer.text}")
                    time.sleep(0.2)
                entries = answer.json()["offsets"] or [
                    {"topic": INPUT_TOPIC, "partition": 0, "offset": -1, "metadata": None}
                ]
                for entry in entries:
                    self.runner_log.record(Group.observed(group, entry, "final"))

    def record_unfinished(self, name: str) -> None:
        """A transaction a producer began but never recorded the end of (it was killed, or
        crashed) is `unknown`, with the writes it had planned."""
        path = self.history_of(name)
        if not path.exists():
            return
        events = load([path])
        begun = {e.txn for e in events if isinstance(e, Begin)}
        ended = {e.txn for e in events if isinstance(e, Txn)}
        missing = begun - ended
        if not missing:
            return
        plans = {}
        plans_file = plans_path(self.plans, name)
        if plans_file.exists():
            for line in plans_file.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError):
                    plan = orjson.loads(line)
                    plans[plan["txn"]] = plan
        with Recorder(path, name, origin=self.t0) as recorder:
            for txn in sorted(missing):
                plan = plans.get(txn, {})
                recorder.record(
                    Txn(
                        producer=name,
                        txn=txn,
                        outcome="unknown",
                        tid=plan.get("tid"),
                        writes=[Write(**w) for w in plan.get("writes", [])],
                        offsets=[SentOffset(**o) for o in plan.get("offsets", [])],
                        error="no outcome recorded",
                    )
                )
                self.say(f"{name} txn {txn}: no outcome recorded; unknown")

    # -- cleanup -----------------------------------------------------------------------------------

    def kill_children(self) -> None:
        with self.children_lock:
            children = list(self.children)
        for process in children:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)  # a stopped process dies only once resumed
                    process.kill()
        for process in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)

    def close(self) -> None:
        """Stop everything this run started, whatever state it is in; drop the database."""
        with _no_interrupts():
            if self.nemesis is not None:
                self.nemesis.stop()
            self.kill_children()
            if self.nemesis is not None:
                # It may be restarting a service or Postgres; let it finish before we stop those.
                self.nemesis.join(150)
                self.kill_children()  # a second instance it started meanwhile
            if self.proxy is not None:
                with contextlib.suppress(Exception):
                    self.proxy.stop(timeout=5)
            for service in self.services:
                service.stop()
            self.runner_log.close()
            if self.database is not None:
                drop_postgres_database(self.database)
                self.database = None
            if self.pair is not None:
                self.pair.stop()
                self.pair = None
            if self.patroni is not None:
                self.patroni.stop()
                self.patroni = None


_OPEN_STATES = {"Ongoing", "Prepared"}


def _committed_since(path: Path, since: float) -> bool:
    """Whether the history file's tail holds a committed txn recorded after `since`."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(lines):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # the first, cut by the seek, or the last, being written
        if event.get("t", 0) <= since:
            return False
        if event.get("kind") == "txn" and event.get("outcome") == "committed":
            return True
    return False


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Cleanup must not be cut short by a second Ctrl-C or SIGTERM (leaked processes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def default_postgres_url() -> None:
    """Point the run at the local test server unless the environment names one."""
    os.environ.setdefault(
        "COORDINATOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
    )
