"""The SDK installs alone: the project's wheel, with no extra (and with `[spark]` for sdk.spark),
in a fresh virtualenv that has none of the server's dependencies, produces, consumes and reads
with `txlog` against a service started from the full install, as a Spark executor would.

The wheel is built once (pip, in its own build environment); the
venv installs it and its dependencies with pip, from the registry or pip's cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.support.services import ServiceProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What an executor must not need: the server's own dependencies.
SERVER_ONLY = ["fastapi", "uvicorn", "alembic", "asyncpg", "aiosqlite", "kio", "pydantic"]

CLIENT = """
import json, sys
from sdk import Consumer, Producer, TopicPartition
from sdk.spark import register
from pyspark.sql import SparkSession

url, topic = sys.argv[1], sys.argv[2]
with Producer(coordinator_url=url, transactional_id="alone") as producer:
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, f"v{i}", key=f"k{i}", partition=0)
    producer.commit_transaction()
consumed = []
with Consumer(coordinator_url=url, group_id="alone", auto_offset_reset="earliest") as consumer:
    consumer.assign([TopicPartition(topic, 0)])
    while len(consumed) < 5 and (message := consumer.poll(5.0)) is not None:
        consumed.append(message.value().decode())
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
register(spark)
rows = (spark.read.format("txlog").option("coordinator.url", url).option("subscribe", topic)
        .load().selectExpr("CAST(value AS STRING) AS value").collect())
spark.stop()
print(json.dumps({"consumed": consumed, "read": sorted(r.value for r in rows)}))
"""


def _run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=600, **kwargs
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", out, ROOT)  # fmt: skip
    [built] = out.glob("txn_coordinator-*.whl")
    return built


def _missing(python: Path, modules: list[str]) -> list[str]:
    probe = (
        "import importlib.util, sys; "
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    return _run(python, "-c", probe, *modules).stdout.split()


def test_the_sdk_installs_alone_and_produces_consumes_and_reads_with_txlog(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python, pip = (
        venv / "bin" / "python",
        # No byte-compiling of what is installed (pyspark's thousands of files): Python
        # compiles what it imports.
        ["-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"],
    )
    # The plain install: the SDK, without the server (nor Spark).
    _run(python, *pip, wheel)
    assert _missing(python, [*SERVER_ONLY, "sqlalchemy", "pyspark"]) == [
        *SERVER_ONLY,
        "sqlalchemy",
        "pyspark",
    ]
    _run(python, "-c", "import sdk, sdk.recordbatch; sdk.Producer; sdk.Consumer")
    # The server's command says what is missing instead of a traceback.
    done = subprocess.run([venv / "bin" / "coordinator", "serve"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install 'txn-coordinator[server]'" in done.stderr
    assert "Traceback" not in done.stderr
    # With sdk.spark, as an executor installs it: still none of the server's dependencies.
    _run(python, *pip, f"{wheel}[spark]")
    assert _missing(python, SERVER_ONLY) == SERVER_ONLY
    with ServiceProcess(f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path) as served:
        created = httpx.post(f"{served.url}/v1/topics", json={"name": "alone", "partitions": 1})
        assert created.status_code == 201
        script = tmp_path / "client.py"
        script.write_text(textwrap.dedent(CLIENT))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Run from a folder without the project's sources, which must not be importable there.
        done = _run(python, script, served.url, "alone", cwd=tmp_path, env=env)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [f"v{i}" for i in range(5)]
    assert answer == {"consumed": expected, "read": expected}
