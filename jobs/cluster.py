"""Where the jobs run: a local standalone Spark cluster of two workers (`mini_cluster`), on which
Spark really speculates, and the SparkSession the jobs, the demo and the tests share (`session`).

Spark never speculates in local mode nor in local-cluster mode: a speculative copy must run on
another host than the original. Two workers on distinct loopback addresses (127.0.0.2, 127.0.0.3)
are two hosts to Spark, so a straggler gets a copy on the other one.

    with mini_cluster() as cluster:
        spark = session("settlement", cluster.master_url, speculation=True)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.launcher import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

# Aggressive enough that a task sleeping a few seconds gets a copy on the other worker, and the
# copy wins; the values are Spark's own knobs (spark.speculation.*).
SPECULATION_CONF: Mapping[str, str] = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
}

# For the JVMs that only start others or pass messages (the mini cluster's master and workers,
# spark-class's launcher): C1 alone compiles in a fraction of C2's CPU, and the serial collector
# runs no GC threads. Not for drivers and executors: the demo took as long with it as without
# (59 and 62 s here). The tests run every JVM on C1 anyway (tests/conftest.py).
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Spark's own chatter (INFO at startup, WARN per lost task) would bury the jobs' output; the
# failures the demo injects are reported by the demo itself.
LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


def spark_home() -> str:
    """The Spark distribution inside the pyspark package (or $SPARK_HOME when set)."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    import pyspark

    return os.path.dirname(pyspark.__file__)


def local_spark_home() -> str:
    """`spark_home()` for Spark on this machine: when it is the distribution inside the pyspark
    package, the same without its `python` folder (a folder of links to the rest, made once).

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the path of every Python process it
    starts (each task's daemon, and one per step of a Python data source's planning). Python
    keeps no bytecode for what it imports from a zip: each of those processes compiled most of
    pyspark from source again, 45% of their CPU in a small job here. Without the zip they import
    the installed pyspark, the same code, from its bytecode cache. A Spark of the user's own
    ($SPARK_HOME elsewhere) is left as it is."""
    import pyspark

    home, package = spark_home(), os.path.dirname(pyspark.__file__)
    if os.path.realpath(home) != os.path.realpath(package):
        return home
    digest = hashlib.sha1(f"{os.path.realpath(package)} {pyspark.__version__}".encode()).hexdigest()
    local = Path(tempfile.gettempdir()) / f"txlog-spark-home-{os.getuid()}-{digest[:12]}"
    local.mkdir(exist_ok=True)
    for entry in os.listdir(package):
        if entry != "python" and not (local / entry).is_symlink():
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                (local / entry).symlink_to(os.path.join(package, entry))
    return str(local)


def log4j2_file(directory: Path) -> Path:
    path = directory / "txlog-log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J2_PROPERTIES:
        path.write_text(LOG4J2_PROPERTIES)
    return path


def _project_root() -> str:
    """The folder holding the `sdk` and `jobs` packages, for executors' PYTHONPATH (so they
    import the same code as the driver, installed or not)."""
    import sdk

    return str(Path(sdk.__file__).resolve().parent.parent)


@dataclass
class MiniCluster:
    """A running standalone cluster: a master on 127.0.0.1 and one worker per host in `hosts`."""

    master_url: str
    master_ui: str
    workdir: Path
    hosts: tuple[str, ...]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def alive_workers(self) -> int:
        """How many workers the master sees ALIVE (its web UI's JSON), 0 if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=2) as answer:
                state: dict[str, Any] = json.load(answer)
        except (OSError, urllib.error.URLError, ValueError):
            return 0
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def master_answers(self) -> bool:
        """Whether the master's port takes connections (it registers workers there)."""
        host, port = self.master_url.removeprefix("spark://").rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False

    def logs_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            text = path.read_text(errors="replace")[-chars:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        # Each daemon leads its own process group (its JVM, and for a worker the executors it
        # forked): end exactly those groups, gently first.
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        # Executors may outlive their worker's TERM by a moment; they are in the worker's group.
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)


def _daemon_env(workdir: Path) -> dict[str, str]:
    home = local_spark_home()
    python_path = os.pathsep.join(
        p for p in (_project_root(), os.environ.get("PYTHONPATH", "")) if p
    )
    return {
        **os.environ,
        "SPARK_HOME": home,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": python_path,
        "SPARK_LOG_DIR": str(workdir),
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_LOCAL_DIRS": str(workdir / "local"),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_DAEMON_JAVA_OPTS": (
            f"-Dlog4j2.configurationFile=file:{log4j2_file(workdir)} {QUICK_JVM_OPTIONS}"
        ),
        "SPARK_LAUNCHER_OPTS": QUICK_JVM_OPTIONS,
    }


def _spawn(workdir: Path, name: str, arguments: list[str]) -> subprocess.Popen[bytes]:
    env = _daemon_env(workdir)
    command = [os.path.join(env["SPARK_HOME"], "bin", "spark-class"), *arguments]
    with (workdir / f"{name}.log").open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _check_started(cluster: MiniCluster, deadline: float, start_timeout: float) -> None:
    exited = [p.args for p in cluster.processes if p.poll() is not None]
    if exited or time.monotonic() > deadline:
        why = "a daemon exited" if exited else f"not up within {start_timeout:.0f} s"
        raise RuntimeError(f"Spark mini cluster: {why}\n{cluster.logs_tail()}")


@contextlib.contextmanager
def mini_cluster(
    hosts: tuple[str, ...] = WORKER_HOSTS,
    cores: int = 1,
    memory: str = "1g",
    workdir: Path | None = None,
    start_timeout: float = 90.0,
) -> Iterator[MiniCluster]:
    """A standalone master and one worker per loopback address in `hosts`, each with `cores`
    cores; yields once every worker has registered, stops them all on the way out (errors and
    Ctrl-C included). Daemon logs go to `workdir` (a temporary folder, removed, unless given)."""
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="txlog-cluster-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    cluster = MiniCluster(
        master_url=f"spark://127.0.0.1:{port}",
        master_ui=f"http://127.0.0.1:{ui_port}",
        workdir=root,
        hosts=hosts,
    )
    try:
        cluster.processes.append(
            _spawn(
                root,
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui_port),
                ],
            )
        )
        # A worker that finds no master yet retries its registration only after 5 to 15 s: start
        # the workers once the master answers.
        deadline = time.monotonic() + start_timeout
        while not cluster.master_answers():
            _check_started(cluster, deadline, start_timeout)
            time.sleep(0.1)
        for index, host in enumerate(hosts):
            cluster.processes.append(
                _spawn(
                    root,
                    f"worker-{index}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(root / "work"),
                        cluster.master_url,
                    ],
                )
            )
        while cluster.alive_workers() < len(hosts):
            _check_started(cluster, deadline, start_timeout)
            time.sleep(0.1)
        yield cluster
    finally:
        cluster.stop()
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


def kafka_connector_package() -> str:
    """Spark's Kafka connector at this pyspark's version, as `spark.jars.packages` names it."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def session(
    app_name: str,
    master: str | None = None,
    *,
    speculation: bool = False,
    conf: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
) -> SparkSession:
    """A quiet SparkSession for the jobs: no UI, 4 shuffle partitions, Spark's logs at ERROR;
    `speculation` turns on `SPECULATION_CONF`. With a `master` (this machine: local[...] or the
    mini cluster), also this Python and the project's code on the executors, driver on loopback,
    and `local_spark_home()` as SPARK_HOME.
    `master` None leaves it, and the rest, to spark-submit (or Spark's default, local[*])."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
    }
    if master is not None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LAUNCHER_OPTS", QUICK_JVM_OPTIONS)  # spark-submit's first JVM
        os.environ["SPARK_HOME"] = local_spark_home()  # the driver's, and so its Python workers'
        log4j2 = log4j2_file(log_dir or Path(tempfile.gettempdir()))
        java_options = f"-Dlog4j2.configurationFile=file:{log4j2}"
        builder = builder.master(master)
        settings.update(
            {
                "spark.pyspark.python": sys.executable,
                "spark.executorEnv.PYTHONPATH": _project_root(),
                "spark.driver.extraJavaOptions": java_options,
                "spark.executor.extraJavaOptions": java_options,
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "768m",
            }
        )
    if speculation:
        settings.update(SPECULATION_CONF)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def add_spark_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """The options every job shares: where Spark runs, and how a streaming run goes on."""
    parser.add_argument(
        "--master", help="Spark master (default: spark-submit's, else Spark's local[*])"
    )
    parser.add_argument("--checkpoint", help="stream mode: checkpoint folder (required)")
    parser.add_argument(
        "--processing-time",
        help=f"stream mode: micro-batch interval, e.g. '5 seconds' (default: {verb} what is "
        "there and stop, Trigger.AvailableNow)",
    )
    parser.add_argument(
        "--run-seconds", type=int, help="stream mode with --processing-time: stop after this"
    )


def run_query(
    writer: DataStreamWriter, processing_time: str | None, run_seconds: int | None, what: str
) -> None:
    """Start a streaming query: without `processing_time`, process what is there and stop
    (Trigger.AvailableNow); with it, run for `run_seconds` (forever if None). A query that
    failed raises, naming `what`."""
    if processing_time is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime=processing_time).start()
        if run_seconds is None:
            query.awaitTermination()
        else:
            query.awaitTermination(run_seconds)
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the {what} stream failed: {query.exception()}")
