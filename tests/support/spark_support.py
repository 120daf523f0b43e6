"""What the Spark tests share: a plain-HTTP view of the log and the admin API, to check what a
job left behind without the code under test, and Spark drivers in child processes that a test
can SIGKILL. The fixtures live in `tests/spark/conftest.py`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from sdk.spark._protocol import OutputRecord, TaskIdentity, WriteSettings

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DRIVER_SCRIPT = Path(__file__).resolve().parent / "spark_driver.py"
# Local mode with 2 cores and up to 3 attempts per task: a task whose Python worker dies is
# retried, as on a cluster.
LOCAL_MASTER = "local[2,3]"
# Spark's own JDBC writer, the txsql tests' baseline, with Debian's drivers (the README's test
# command installs libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java).
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/sqlite-jdbc.jar")
# Spark's own Kafka connector (`format("kafka")`) and what it needs beyond pyspark's jars, which
# the README's test command resolves with Maven (tests/clients/spark/pom.xml). A user loads the
# same with spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>.
KAFKA_CONNECTOR_LIB = PROJECT_ROOT / "tests" / "clients" / "spark" / "target" / "lib"
KAFKA_CONNECTOR_JARS = tuple(sorted(str(jar) for jar in KAFKA_CONNECTOR_LIB.glob("*.jar")))
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.jars": ",".join(JDBC_JARS + KAFKA_CONNECTOR_JARS),
}


def require_jdbc_jars() -> None:
    """Fail, never skip, without the JDBC drivers: a comparison that cannot run proves nothing."""
    missing = [jar for jar in JDBC_JARS if not Path(jar).is_file()]
    assert not missing, (
        f"{missing} missing: apt-get install -y libpostgresql-jdbc-java libxerial-sqlite-jdbc-java"
    )


def require_kafka_connector() -> None:
    """Fail, never skip, without Spark's Kafka connector."""
    assert any("spark-sql-kafka" in jar for jar in KAFKA_CONNECTOR_JARS), (
        f"Spark's Kafka connector is not in {KAFKA_CONNECTOR_LIB}: run the README's test command "
        "(mvn -f tests/clients/pom.xml package)"
    )


def unique(stem: str) -> str:
    """A topic or job name no other test uses (the Spark tests share one service)."""
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Attempt:
    """One task attempt's transaction, from its id `{job}/{run}/{partition}.{attempt}.{task}`."""

    tid: str
    run: str
    partition: int
    attempt: int
    state: str


class Log:
    """The coordinator as the tests see it: plain HTTP calls, independent of the code under test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def close(self) -> None:
        self.http.close()

    def _ok(self, response: httpx.Response) -> Any:
        assert response.status_code in (200, 201), response.text
        return response.json()

    def create_topic(self, name: str, partitions: int = 1) -> str:
        self._ok(self.http.post("/v1/topics", json={"name": name, "partitions": partitions}))
        return name

    def append(self, topic: str, partition: int, values: list[str]) -> None:
        """Plain appends (no transaction), as text."""
        records = [{"key": None, "value": v, "headers": {}} for v in values]
        path = f"/v1/topics/{topic}/partitions/{partition}/records"
        self._ok(self.http.post(path, json={"records": records}))

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        described: list[dict[str, Any]] = self._ok(self.http.get(f"/v1/topics/{topic}"))[
            "partitions"
        ]
        return described

    def records(
        self, topic: str, partition: int = 0, isolation_level: str = "read_committed"
    ) -> list[dict[str, Any]]:
        """Every record of a partition readable at this isolation level, keys and values as
        base64 (any bytes)."""
        records: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self._ok(
                self.http.get(
                    f"/v1/topics/{topic}/partitions/{partition}/records",
                    params={
                        "offset": offset,
                        "max_records": 10_000,
                        "isolation_level": isolation_level,
                        "encoding": "base64",
                    },
                )
            )
            records.extend(page["records"])
            if page["next_offset"] == offset:
                return records
            offset = page["next_offset"]

    def values(self, topic: str, isolation_level: str = "read_committed") -> list[str]:
        """The values (text) of every partition, in partition then offset order."""
        return [
            base64.b64decode(r["value"]).decode()
            for p in range(len(self.partitions(topic)))
            for r in self.records(topic, p, isolation_level)
        ]

    def offsets(self, topic: str, partition: int, isolation_level: str) -> list[int]:
        return [r["offset"] for r in self.records(topic, partition, isolation_level)]

    def transactions(self, prefix: str) -> dict[str, str]:
        """Every transactional id under `prefix` and its state (the admin view)."""
        doc = self._ok(self.http.get("/v1/admin/transactions", params={"prefix": prefix}))
        return {t["transactional_id"]: t["state"] for t in doc["transactions"]}

    def attempts(self, job: str) -> list[Attempt]:
        """The job's task attempts (its driver's transaction left out), by partition."""
        found = []
        for tid, state in self.transactions(f"{job}/").items():
            if tid == f"{job}/driver":
                continue
            _, run, rest = tid.split("/")
            partition, attempt, _task = (int(n) for n in rest.split("."))
            found.append(Attempt(tid, run, partition, attempt, state))
        return sorted(found, key=lambda a: (a.partition, a.attempt, a.tid))

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        doc = self._ok(self.http.get(f"/v1/groups/{quote(group, safe='')}/offsets"))
        return {o["partition"]: o["offset"] for o in doc["offsets"] if o["topic"] == topic}


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


class DriverProcess:
    """`tests/support/spark_driver.py` in a child process leading its own process group, so that one
    SIGKILL takes the driver, its JVM and every Python worker of that JVM at once."""

    def __init__(self, spec: dict[str, Any], workdir: Path, name: str) -> None:
        self.spec = spec
        self.log = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> DriverProcess:
        path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER_SCRIPT), json.dumps(self.spec)],
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def running(self) -> bool:
        assert self.process is not None
        return self.process.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `predicate` while the driver runs; fail at once if it exits first."""

        def check() -> bool:
            if predicate():
                return True
            if not self.running():
                raise AssertionError(f"the driver exited before {what}:\n{self.tail()}")
            return False

        wait_until(check, timeout, what)

    def wait(self, timeout: float) -> None:
        """Wait for the driver to finish; fail (with its output) unless it succeeded."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the driver did not finish in {timeout:.0f} s:\n{self.tail()}"
            ) from None
        assert code == 0, f"the driver failed ({code}):\n{self.tail()}"

    def kill(self) -> None:
        """SIGKILL the driver's whole process group: nothing gets to clean up."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        # The group's other members (JVM, Python workers) die with the signal; wait until no
        # process of the group is left, so none can still write after the test moves on.
        wait_until(lambda: not _group_alive(self.process.pid), 30, "the driver's processes")


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in the group: orphans reparented to an init
    that does not reap them linger as zombies, and those can no longer do anything."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended while we looked
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            return True
    return False


CRASHING_ATTEMPT = """
import base64, pickle, sys
from sdk.spark._protocol import write_partition
settings, task, records = pickle.loads(base64.b64decode(sys.argv[1]))
write_partition(settings, records, task)
"""


def crash_attempt(settings: WriteSettings, task: TaskIdentity, records: list[OutputRecord]) -> None:
    """Run a task attempt in a child process that `settings.kill` ends (os._exit, as a lost
    executor: no abort, no cleanup) once its first records are in the log."""
    assert settings.kill is not None
    payload = base64.b64encode(pickle.dumps((settings, task, records))).decode()
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_ATTEMPT, payload],
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr.decode(errors="replace")
