"""`coordinator transactions ...` against a real `coordinator serve` (SQLite and Postgres): tables,
`--json`, filters, abort fences, and every failure is exit status 1 with a line that says why."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import update

from coordinator.cli import main
from coordinator.core.settings import Settings
from coordinator.log.models import ProducerState
from coordinator.store.engines import open_store
from tests.support.cli import table
from tests.support.services import (
    ServiceProcess,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)

ADMIN_TOKEN = "ops-admin-token"
PRODUCER_TOKEN = "etl-producer-token"


# -- services, one per store for the whole module -------------------------------------------------


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServiceProcess]]:
    """The module's services, started side by side to keep it quick: on SQLite, on Postgres, and
    on SQLite with a tokens file. Every store is fresh; its `serve` migrates it."""
    root = tmp_path_factory.mktemp("cli")
    tokens = root / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": ADMIN_TOKEN, "principal": "ops", "roles": ["admin"]},
                    {
                        "token": PRODUCER_TOKEN,
                        "principal": "etl",
                        "roles": ["producer"],
                        "transactional_id_prefixes": [""],
                        "topic_prefixes": [""],
                    },
                ]
            }
        )
    )
    postgres_url = create_postgres_database()
    running = {
        "sqlite": ServiceProcess(f"sqlite:///{root / 'plain.db'}", root),
        "postgres": ServiceProcess(postgres_url, root),
        "auth": ServiceProcess(
            f"sqlite:///{root / 'auth.db'}", root, COORDINATOR_AUTH_TOKENS_FILE=str(tokens)
        ),
    }
    try:
        with ThreadPoolExecutor(len(running)) as pool:
            list(pool.map(ServiceProcess.start, running.values()))
        yield running
    finally:
        for service in running.values():
            service.stop()
        drop_postgres_database(postgres_url)
    for service in running.values():
        text = service.log.read_text(errors="replace")
        assert "Traceback" not in text, text[-4000:]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest, services: dict[str, ServiceProcess]) -> ServiceProcess:
    return services[request.param]


@pytest.fixture(scope="module")
def auth_service(services: dict[str, ServiceProcess]) -> ServiceProcess:
    return services["auth"]


@pytest.fixture
def name() -> str:
    """A prefix of this test's own: the services are shared by the module's tests."""
    return f"c{uuid.uuid4().hex[:8]}-"


# -- setting things up over HTTP ------------------------------------------------------------------


class Http:
    def __init__(self, service: ServiceProcess, token: str | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=service.url, headers=headers, timeout=30.0)

    def ok(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.client.request(method, path, **kwargs)
        assert response.is_success, response.text
        body: dict[str, Any] = response.json()
        return body

    def topic(self, topic: str, partitions: int = 1) -> None:
        self.ok("POST", "/v1/topics", json={"name": topic, "partitions": partitions})

    def open_transaction(self, tid: str, *partitions: tuple[str, int]) -> dict[str, int]:
        """InitPid, then AddPartitions when given some: the caller's pid and epoch."""
        answer = self.ok("POST", "/v1/init-pid", json={"transactional_id": tid})
        caller = {"producer_id": answer["producer_id"], "producer_epoch": answer["producer_epoch"]}
        if partitions:
            body = {**caller, "partitions": [{"topic": t, "partition": p} for t, p in partitions]}
            self.ok("POST", f"/v1/transactions/{quote(tid, safe='')}/partitions", json=body)
        return caller

    def produce(self, tid: str, caller: dict[str, int], topic: str, sequence: int) -> None:
        body = {
            **caller,
            "base_sequence": sequence,
            "transactional_id": tid,
            "records": [{"value": "v"}],
        }
        self.ok("POST", f"/v1/topics/{topic}/partitions/0/records", json=body)


@pytest.fixture
def http(service: ServiceProcess) -> Iterator[Http]:
    h = Http(service)
    with h.client:
        yield h


# -- running the command --------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["transactions", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def ids(text: str) -> list[str]:
    return [row["TransactionalId"] for row in table(text)]


# -- help (no service) ----------------------------------------------------------------------------


def test_help_names_every_subcommand_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["transactions", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for word in ["list", "describe", "describe-producers", "abort", "find-hanging"]:
        assert f"\n    {word}" in out
    for option in ["--url", "--token", "--json", "COORDINATOR_URL", "COORDINATOR_TOKEN"]:
        assert option in out
    expected = {
        "list": ["--state", "--prefix", "--older-than-ms", "Ongoing"],
        "describe": ["--transactional-id"],
        "describe-producers": ["--topic", "--partition"],
        "abort": ["--transactional-id", "PRODUCER_FENCED"],
        "find-hanging": ["--max-transaction-timeout-ms", "900000"],
    }
    for subcommand, words in expected.items():
        with pytest.raises(SystemExit):
            main(["transactions", subcommand, "--help"])
        out = capsys.readouterr().out
        for word in [*words, "--url", "--token", "--json"]:
            assert word in out, (subcommand, word)


def test_unreachable_url_exits_1_naming_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--url", url, "list")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot reach the coordinator at {url}")


# -- against a running service --------------------------------------------------------------------


@pytest.mark.slow
def test_list_prints_a_table_or_the_json_answer_and_filters(
    service: ServiceProcess, http: Http, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"{name}t"
    http.topic(topic, partitions=6)
    ongoing = http.open_transaction(f"{name}ongoing", *((topic, p) for p in range(6)))
    http.open_transaction(f"{name}empty")
    http.open_transaction(f"{name}other")

    code, out, err = run(capsys, "--url", service.url, "list", "--prefix", name)
    assert (code, err) == (0, "")
    rows = table(out)
    assert [r["TransactionalId"] for r in rows] == [
        f"{name}empty",
        f"{name}ongoing",
        f"{name}other",
    ]
    assert list(rows[1]) == [
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "State",
        "TimeoutMs",
        "StartedAt",
        "Age",
        "Partitions",
    ]
    assert rows[1]["ProducerId"] == str(ongoing["producer_id"])
    assert rows[1]["ProducerEpoch"] == "0"
    assert rows[1]["State"] == "Ongoing"
    assert rows[1]["TimeoutMs"] == "60000"
    assert rows[1]["StartedAt"].endswith("Z")
    # A list shows the first few partitions of a wide transaction; describe shows them all.
    assert rows[1]["Partitions"] == f"{topic}-0,{topic}-1,{topic}-2,{topic}-3,+2 more"
    assert rows[0]["State"] == "Empty"
    assert rows[0]["StartedAt"] == rows[0]["Age"] == rows[0]["Partitions"] == "-"

    # The connection options go after the subcommand too; --json prints the API's answer as is.
    code, out, _ = run(capsys, "list", "--prefix", name, "--json", "--url", service.url)
    assert code == 0
    answer = http.client.get("/v1/admin/transactions", params={"prefix": name})
    assert out == answer.text + "\n"

    def listed(*filters: str) -> list[str]:
        code, out, err = run(capsys, "--url", service.url, "list", "--prefix", name, *filters)
        assert (code, err) == (0, ""), err
        return ids(out)

    assert listed("--state", "Ongoing") == [f"{name}ongoing"]
    assert listed("--state", "Empty") == [f"{name}empty", f"{name}other"]
    assert listed("--older-than-ms", "0") == [f"{name}ongoing"]
    assert listed("--older-than-ms", "3600000") == []
    code, out, _ = run(capsys, "--url", service.url, "list", "--prefix", f"{name}zzz")
    assert (code, table(out)) == (0, [])


@pytest.mark.slow
def test_describe_shows_one_transaction_with_all_its_partitions(
    service: ServiceProcess, http: Http, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"{name}t"
    http.topic(topic, partitions=6)
    tid = f"{name}wide"
    caller = http.open_transaction(tid, *((topic, p) for p in range(6)))

    code, out, err = run(capsys, "--url", service.url, "describe", "--transactional-id", tid)
    assert (code, err) == (0, "")
    [row] = table(out)
    assert row["TransactionalId"] == tid
    assert row["ProducerId"] == str(caller["producer_id"])
    assert row["State"] == "Ongoing"
    assert row["Partitions"] == ",".join(f"{topic}-{p}" for p in range(6))
    assert row["Groups"] == "-"

    code, out, _ = run(
        capsys, "--url", service.url, "--json", "describe", "--transactional-id", tid
    )
    assert code == 0
    assert json.loads(out) == http.ok("GET", f"/v1/transactions/{tid}")


@pytest.mark.slow
def test_describe_producers_shows_each_producers_state_on_the_partition(
    service: ServiceProcess, http: Http, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"{name}t"
    http.topic(topic)
    tid = f"{name}p"
    caller = http.open_transaction(tid, (topic, 0))
    http.produce(tid, caller, topic, 0)
    http.produce(tid, caller, topic, 1)

    argv = ["describe-producers", "--topic", topic, "--partition", "0"]
    code, out, err = run(capsys, "--url", service.url, *argv)
    assert (code, err) == (0, "")
    [row] = table(out)
    assert row["ProducerId"] == str(caller["producer_id"])
    assert row["ProducerEpoch"] == "0"
    assert row["LastSequence"] == "1"
    assert row["LastTimestamp"].endswith("Z")
    assert row["CurrentTransactionStartOffset"] == "0"

    code, out, _ = run(capsys, "--url", service.url, "--json", *argv)
    assert json.loads(out)["producers"][0]["current_txn_start_offset"] == 0

    code, out, err = run(capsys, "--url", service.url, *argv[:-1], "7")
    assert (code, out) == (1, "")
    assert err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")


@pytest.mark.slow
def test_find_hanging_reports_old_open_transactions_and_pinned_partitions(
    service: ServiceProcess, http: Http, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"{name}t"
    http.topic(topic)
    # An id with every character a URL treats specially: the CLI quotes it as a path segment.
    tid = f"{name}stuck/1%2F?a=b#c d"
    caller = http.open_transaction(tid, (topic, 0))
    http.produce(tid, caller, topic, 0)

    code, out, err = run(capsys, "--url", service.url, "find-hanging")
    assert (code, err) == (0, "")
    assert out.startswith("no hanging transactions: none open for more than 900000 ms")

    # Every open transaction is older than 0 ms: ours hangs by that measure.
    code, out, _ = run(
        capsys, "--url", service.url, "find-hanging", "--max-transaction-timeout-ms", "0"
    )
    title, _, rest = out.partition("\n")
    assert title == "Transactions open for more than 0 ms:"
    assert tid in ids(rest)

    # A partition pinned by a producer with no open transaction can only come from a store changed
    # behind the service's back: make one and see it reported.
    plain = http.ok("POST", "/v1/init-pid", json={"transactional_id": None})["producer_id"]
    body = {"producer_id": plain, "producer_epoch": 0, "base_sequence": 0}
    http.ok(
        "POST",
        f"/v1/topics/{topic}/partitions/0/records",
        json={**body, "records": [{"value": "p"}]},
    )
    asyncio.run(_pin(service.database_url, plain, first_offset=1))
    code, out, _ = run(capsys, "--url", service.url, "find-hanging")
    title, _, rest = out.partition("\n")
    assert title.startswith("Partitions whose last stable offset is held by a producer")
    assert {
        "Topic": topic,
        "Partition": "0",
        "ProducerId": str(plain),
        "StartOffset": "1",
    } in table(rest)
    code, out, _ = run(capsys, "--url", service.url, "--json", "find-hanging")
    assert json.loads(out)["transactions"] == []


async def _pin(database_url: str, producer_id: int, first_offset: int) -> None:
    db = open_store(Settings(database_url=database_url))
    try:
        async with db.write() as session:
            await session.execute(
                update(ProducerState)
                .where(ProducerState.producer_id == producer_id)
                .values(current_txn_first_offset=first_offset)
            )
    finally:
        await db.dispose()


@pytest.mark.slow
def test_abort_completes_the_transaction_and_fences_its_producer(
    service: ServiceProcess, http: Http, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"{name}t"
    http.topic(topic)
    # An id with every character a URL treats specially: the CLI quotes it as a path segment.
    tid = f"{name}stuck/1%2F?a=b#c d"
    caller = http.open_transaction(tid, (topic, 0))
    http.produce(tid, caller, topic, 0)

    code, out, err = run(capsys, "--url", service.url, "abort", "--transactional-id", tid)
    assert (code, err) == (0, "")
    assert out == (
        f"aborted {tid}: CompleteAbort; producer {caller['producer_id']} is fenced, "
        f"its epoch is now {caller['producer_epoch'] + 1}\n"
    )
    code, out, _ = run(capsys, "--url", service.url, "describe", "--transactional-id", tid)
    assert table(out)[0]["State"] == "CompleteAbort"
    end = http.client.post(
        f"/v1/transactions/{quote(tid, safe='')}/end", json={**caller, "commit": True}
    )
    assert (end.status_code, end.json()["code"]) == (409, "PRODUCER_FENCED")

    # Nothing is open any more: a second abort is refused, with the service's code.
    code, out, err = run(capsys, "--url", service.url, "abort", "--transactional-id", tid)
    assert (code, out) == (1, "")
    assert err.startswith("error: INVALID_TXN_STATE: ")

    other = f"{name}json"
    fresh = http.open_transaction(other, (topic, 0))
    code, out, _ = run(capsys, "--url", service.url, "--json", "abort", "--transactional-id", other)
    assert json.loads(out) == {
        "state": "CompleteAbort",
        "producer_id": fresh["producer_id"],
        "producer_epoch": fresh["producer_epoch"] + 1,
    }


@pytest.mark.slow
def test_unknown_transactional_id_exits_1_with_its_code(
    service: ServiceProcess, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for subcommand in ["describe", "abort"]:
        for output in [[], ["--json"]]:
            argv = ["--url", service.url, *output, subcommand, "--transactional-id", f"{name}x"]
            code, out, err = run(capsys, *argv)
            assert (code, out) == (1, "")
            assert err.startswith("error: TRANSACTIONAL_ID_NOT_FOUND: ")
            assert f"{name}x" in err


# -- authentication -------------------------------------------------------------------------------


@pytest.mark.slow
def test_token_is_needed_and_taken_from_flag_or_environment(
    auth_service: ServiceProcess,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Http(auth_service, ADMIN_TOKEN).client as client:
        response = client.post("/v1/init-pid", json={"transactional_id": f"{name}a"})
        assert response.status_code == 200, response.text
    listing = ["--url", auth_service.url, "list", "--prefix", name]

    code, out, err = run(capsys, *listing)
    assert (code, out) == (1, "")
    assert err.startswith("error: UNAUTHENTICATED: ")
    assert "HTTP 401" in err and "--token" in err

    code, out, err = run(capsys, *listing, "--token", "not-a-known-token")
    assert code == 1
    assert err.startswith("error: UNAUTHENTICATED: ") and "HTTP 401" in err

    code, out, err = run(capsys, *listing, "--token", PRODUCER_TOKEN)
    assert code == 1
    assert err.startswith("error: CLUSTER_AUTHORIZATION_FAILED: ")
    assert "HTTP 403" in err and "admin role" in err

    code, out, err = run(capsys, *listing, "--token", ADMIN_TOKEN)
    assert (code, err) == (0, "")
    assert ids(out) == [f"{name}a"]

    monkeypatch.setenv("COORDINATOR_URL", auth_service.url)
    monkeypatch.setenv("COORDINATOR_TOKEN", ADMIN_TOKEN)
    code, out, err = run(capsys, "describe", "--transactional-id", f"{name}a")
    assert (code, err) == (0, "")
    assert ids(out) == [f"{name}a"]


@pytest.mark.slow
def test_installed_command_reads_url_and_token_from_the_environment(
    auth_service: ServiceProcess, name: str, tmp_path: Path
) -> None:
    with Http(auth_service, ADMIN_TOKEN).client as client:
        response = client.post("/v1/init-pid", json={"transactional_id": f"{name}a"})
        assert response.status_code == 200, response.text
        expected = client.get("/v1/admin/transactions", params={"prefix": name}).text
    env = {**os.environ, "COORDINATOR_URL": auth_service.url, "COORDINATOR_TOKEN": ADMIN_TOKEN}
    argv = [sys.executable, "-m", "coordinator", "transactions", "list", "--prefix", name]
    done = subprocess.run(
        [*argv, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr, done.stdout) == (0, "", expected + "\n")
    env.pop("COORDINATOR_TOKEN")
    refused = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: UNAUTHENTICATED: ")
