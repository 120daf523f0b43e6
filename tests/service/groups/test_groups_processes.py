"""Consumer groups across processes, on SQLite and on Postgres: two `coordinator serve` processes
on one store, and consumers as processes of their own, each heartbeating to one of the two.
Two and then three consumers split six partitions evenly; one closes and its partitions move at
once; one is SIGKILLed and its partitions move after its session timeout. Every consumer records
what it owned when, and a checker over those histories finds no partition with two owners at any
moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ownership import Interval, double_owners, intervals, owned_now, read_history
from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.slow

SIX = set(range(6))
# A session no member loses while alive, however starved of CPU the machine is: a member whose
# heartbeats stop for a session loses its partitions at the service before it hears so, and
# while it has not heard, it and their next owner both hold them (as in Kafka, where fencing
# keeps that window harmless). Only a member killed on purpose asks for the short one.
LIVE_SESSION_MS = 60_000
# Short group timeouts, set by configuration: the service's default session timeout (what the
# member killed on purpose asks for), and a quick sweep.
SERVICE_ENV = {
    "COORDINATOR_GROUP_SESSION_TIMEOUT_MS": "1500",
    "COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS": "100",
    "COORDINATOR_GROUP_CHECK_INTERVAL_MS": "100",
    "COORDINATOR_GROUP_HEARTBEAT_INTERVAL_MS": "100",
}


@pytest.fixture(params=["sqlite", "postgres"])
def services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    url = f"sqlite:///{tmp_path / 'groups.db'}" if request.param == "sqlite" else None
    url = url or create_postgres_database()
    first = ServiceProcess(url, tmp_path, **SERVICE_ENV).start()  # migrates the store
    second = ServiceProcess(url, tmp_path, **SERVICE_ENV)
    try:
        second.start()
        created = httpx.post(f"{first.url}/v1/topics", json={"name": "t", "partitions": 6})
        assert created.status_code == 201, created.text
        yield [first, second]
    finally:
        for service in (first, second):
            service.stop()
        if request.param == "postgres":
            drop_postgres_database(url)
    for log in tmp_path.glob("service-*.log"):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, text[-4000:]


class Member:
    """A consumer process (`tests.support.group_member`) and its history file."""

    def __init__(
        self,
        name: str,
        service: ServiceProcess,
        workdir: Path,
        session_timeout_ms: int = LIVE_SESSION_MS,
    ) -> None:
        self.name = name
        self.history = workdir / f"{name}.jsonl"
        self.log = (workdir / f"{name}.log").open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.group_member",
                "--url",
                service.url,
                "--group",
                "g",
                "--topic",
                "t",
                "--name",
                name,
                "--history",
                str(self.history),
                "--session-timeout-ms",
                str(session_timeout_ms),
            ],
            cwd=Path(__file__).resolve().parents[3],
            env=os.environ.copy(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def events(self) -> list[dict[str, Any]]:
        return read_history(self.history) if self.history.exists() else []

    def owned(self) -> set[int]:
        return owned_now(self.events(), self.name)

    def close(self) -> None:
        """SIGTERM: the member closes its consumer (leaving the group) and exits."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0, self.name

    def kill(self) -> int:
        """SIGKILL, no goodbye; returns the moment it was surely dead."""
        self.process.kill()
        self.process.wait(timeout=30)
        return time.monotonic_ns()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.log.close()


def wait_until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def shares(members: list[Member]) -> list[set[int]]:
    return [m.owned() for m in members]


def split_evenly(members: list[Member]) -> Callable[[], bool]:
    def done() -> bool:
        owned = shares(members)
        sizes = sorted(len(o) for o in owned)
        return set().union(*owned) == SIX and sizes[-1] - sizes[0] <= 1 and sum(sizes) == 6

    return done


def group(service: ServiceProcess) -> dict[str, Any]:
    response = httpx.get(f"{service.url}/v1/groups/g", timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_members_split_six_partitions_hand_them_over_and_never_share_one(
    services: list[ServiceProcess], tmp_path: Path
) -> None:
    one, two = services
    started: list[Member] = []

    def start(
        name: str, service: ServiceProcess, session_timeout_ms: int = LIVE_SESSION_MS
    ) -> Member:
        member = Member(name, service, tmp_path, session_timeout_ms)
        started.append(member)
        return member

    try:
        short = int(SERVICE_ENV["COORDINATOR_GROUP_SESSION_TIMEOUT_MS"])
        a, b = start("a", one), start("b", two, short)  # b is killed: its session must end
        wait_until(split_evenly([a, b]), "a and b own three partitions each")
        assert [len(s) for s in shares([a, b])] == [3, 3]

        c = start("c", one)
        wait_until(split_evenly([a, b, c]), "a, b and c own two partitions each")
        assert [len(s) for s in shares([a, b, c])] == [2, 2, 2]

        c.close()  # closing leaves the group before the process ends: nothing waits for a timeout
        assert len(group(two)["members"]) == 2
        wait_until(split_evenly([a, b]), "c's partitions moved to a and b")

        died = b.kill()
        wait_until(lambda: a.owned() == SIX, "b's partitions moved to a after its session timeout")
        (survivor,) = group(one)["members"]
        assert survivor["client_id"] == "a"

        a.close()
        events = [e for m in started for e in m.events()]
        found = intervals(events, ends={"b": died})
        assert double_owners(found) == []
        # The histories are not trivial: whatever b or c held also had another owner (before or
        # after), and every partition had an owner.
        moved = {i.partition for i in found if i.member in ("b", "c")}
        assert moved and all(len({i.member for i in found if i.partition == p}) >= 2 for p in moved)
        assert {i.partition for i in found} == SIX
        assert group(two)["state"] == "Empty"
    finally:
        for member in started:
            member.stop()


def test_the_checker_finds_two_owners_of_a_partition() -> None:
    def event(member: str, t: int, kind: str, edge: str, *partitions: int) -> dict[str, Any]:
        return {"member": member, "t": t, "event": kind, "edge": edge, "partitions": partitions}

    handed_over = [
        event("a", 1, "assign", "start", 0, 1),
        event("a", 5, "revoke", "end", 1),
        event("b", 6, "assign", "start", 1),
    ]
    assert double_owners(intervals(handed_over)) == []
    too_early = [*handed_over[:2], event("b", 4, "assign", "start", 1)]
    assert double_owners(intervals(too_early)) == [
        (Interval("a", 1, 1, 5), Interval("b", 1, 4, 2**63))
    ]
    killed_late = [event("a", 1, "assign", "start", 0), event("b", 3, "assign", "start", 0)]
    assert double_owners(intervals(killed_late, ends={"a": 2})) == []
    assert len(double_owners(intervals(killed_late, ends={"a": 4}))) == 1


def test_members_start_in_parallel_and_the_service_log_stays_clean(
    services: list[ServiceProcess], tmp_path: Path
) -> None:
    """Five members joining at once through both processes: concurrent joins, one even split."""
    with ThreadPoolExecutor(5) as pool:
        members = list(
            pool.map(
                lambda i: Member(f"m{i}", services[i % 2], tmp_path),
                range(5),
            )
        )
    try:
        wait_until(split_evenly(members), "five members split six partitions")
        assert sorted(len(s) for s in shares(members)) == [1, 1, 1, 1, 2]
        for member in members:
            member.close()
        events = [e for m in members for e in m.events()]
        assert double_owners(intervals(events)) == []
    finally:
        for member in members:
            member.stop()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_classic_group_spread_over_two_processes_runs_one_barrier(
    backend: str, tmp_path: Path
) -> None:
    # Kafka's classic protocol across processes: each consumer talks to another process's Kafka
    # listener, so a JoinGroup parked in one process learns of the other's join from the store
    # (its poll), and the leader's assignment reaches the member parked in the other process.
    import kafka

    from tests.support.services import free_port

    url = f"sqlite:///{tmp_path / 'classic.db'}" if backend == "sqlite" else None
    url = url or create_postgres_database()
    ports = [free_port(), free_port()]
    env = {**SERVICE_ENV, "COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS": "200"}
    services = [
        ServiceProcess(url, tmp_path, COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{p}", **env)
        for p in ports
    ]
    consumers: list[Any] = []
    try:
        for service in services:
            service.start()
        created = httpx.post(f"{services[0].url}/v1/topics", json={"name": "c", "partitions": 4})
        assert created.status_code == 201, created.text
        consumers = [
            kafka.KafkaConsumer(
                "c",
                bootstrap_servers=f"127.0.0.1:{port}",
                group_id="classic",
                heartbeat_interval_ms=100,
                session_timeout_ms=6000,
            )
            for port in ports
        ]
        deadline = time.monotonic() + 30
        while True:
            for consumer in consumers:
                consumer.poll(50)
            owned = sorted(sorted(tp.partition for tp in c.assignment()) for c in consumers)
            if owned == [[0, 1], [2, 3]]:  # range, by the leader, whichever process it is on
                break
            assert time.monotonic() < deadline, owned
        description = httpx.get(f"{services[1].url}/v1/groups/classic").json()
        assert description["type"] == "classic" and description["state"] == "Stable"
    finally:
        for consumer in consumers:
            consumer.close()
        for service in services:
            service.stop()
        if backend == "postgres":
            drop_postgres_database(url)
    for log in tmp_path.glob("service-*.log"):
        assert "Traceback" not in log.read_text(errors="replace")
