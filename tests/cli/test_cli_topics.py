"""`coordinator topics ...` (kafka-topics.sh, kafka-configs.sh and kafka-delete-records.sh for
this service) against a real `coordinator serve` on SQLite and on Postgres: list, describe,
create with configs, alter-configs, delete-records, and delete (a dry run unless --execute)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from coordinator.cli import main
from tests.support.cli import table
from tests.support.services import ServiceProcess, serve_on_fresh_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A `coordinator serve` on a fresh store, shared by the module's tests (their names differ)."""
    yield from serve_on_fresh_store(request.param, tmp_path_factory.mktemp("cli-topics"), "topics")


@pytest.fixture
def topic() -> str:
    """A name of this test's own: the services are shared by the module's tests."""
    return f"t{uuid.uuid4().hex[:8]}"


def run(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, *argv: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["topics", "--url", service.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def produce(service: ServiceProcess, topic: str, count: int) -> None:
    for i in range(count):
        response = httpx.post(
            f"{service.url}/v1/topics/{topic}/partitions/0/records",
            json={"records": [{"key": "k", "value": str(i)}]},
        )
        assert response.status_code == 200, response.text


def test_create_with_configs_then_list_and_describe(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, topic: str
) -> None:
    code, out, err = run(
        capsys,
        service,
        "create",
        "--topic",
        topic,
        "--partitions",
        "2",
        "--config",
        "retention.ms=60000",
        "--config",
        "cleanup.policy=compact,delete",
    )
    assert (code, err) == (0, "")
    assert out.strip() == f"Created topic {topic} with 2 partition(s)."
    code, out, _ = run(capsys, service, "list")
    assert {"TOPIC": topic, "PARTITIONS": "2"} in table(out)
    produce(service, topic, 3)
    code, out, _ = run(capsys, service, "describe", "--topic", topic)
    assert code == 0
    summary, partitions, configs = out.split("\n", 1)[0], *out.split("\n", 1)[1].split("\n\n")
    assert summary == (
        f"Topic: {topic}\tPartitionCount: 2\t"
        "Configs: cleanup.policy=compact,delete,retention.ms=60000"
    )
    assert table(partitions) == [
        {
            "PARTITION": "0",
            "LOG-START-OFFSET": "0",
            "HIGH-WATERMARK": "3",
            "LAST-STABLE-OFFSET": "3",
        },
        {
            "PARTITION": "1",
            "LOG-START-OFFSET": "0",
            "HIGH-WATERMARK": "0",
            "LAST-STABLE-OFFSET": "0",
        },
    ]
    rows = {r["CONFIG"]: r for r in table(configs)}
    assert rows["retention.ms"] == {"CONFIG": "retention.ms", "VALUE": "60000", "SOURCE": "TOPIC"}
    assert rows["retention.bytes"]["SOURCE"] == "DEFAULT"
    code, out, _ = run(capsys, service, "--json", "describe", "--topic", topic)
    described = json.loads(out)
    assert described["name"] == topic and len(described["configs"]) == len(rows)


def test_alter_configs_sets_and_deletes_all_or_nothing(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, topic: str
) -> None:
    assert run(capsys, service, "create", "--topic", topic)[0] == 0
    code, out, _ = run(
        capsys,
        service,
        "alter-configs",
        "--topic",
        topic,
        "--add-config",
        "retention.bytes=1000,cleanup.policy=[compact,delete]",
    )
    assert code == 0
    rows = {r["CONFIG"]: (r["VALUE"], r["SOURCE"]) for r in table(out)}
    assert rows["retention.bytes"] == ("1000", "TOPIC")
    assert rows["cleanup.policy"] == ("compact,delete", "TOPIC")
    code, out, err = run(
        capsys,
        service,
        "alter-configs",
        "--topic",
        topic,
        "--add-config",
        "retention.ms=soon",
        "--delete-config",
        "retention.bytes",
    )
    assert code == 1 and out == ""
    assert err.startswith("error: INVALID_CONFIG") and "retention.ms" in err
    code, out, _ = run(
        capsys,
        service,
        "--json",
        "alter-configs",
        "--topic",
        topic,
        "--delete-config",
        "retention.bytes,cleanup.policy",
    )
    sources = {c["name"]: c["source"] for c in json.loads(out)["configs"]}
    assert sources["retention.bytes"] == sources["cleanup.policy"] == "DEFAULT"
    code, _, err = run(capsys, service, "alter-configs", "--topic", topic)
    assert code == 1 and "nothing to change" in err


def test_delete_records_moves_the_low_watermark(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, topic: str
) -> None:
    assert run(capsys, service, "create", "--topic", topic)[0] == 0
    produce(service, topic, 4)
    code, out, _ = run(capsys, service, "delete-records", "--topic", topic, "--offset", "0:2")
    assert code == 0
    assert table(out) == [{"TOPIC": topic, "PARTITION": "0", "LOW-WATERMARK": "2"}]
    code, out, _ = run(
        capsys, service, "--json", "delete-records", "--topic", topic, "--offset", "0:-1"
    )
    assert json.loads(out) == {"partitions": [{"partition": 0, "log_start_offset": 4}]}
    code, _, err = run(capsys, service, "delete-records", "--topic", topic, "--offset", "0:99")
    assert code == 1 and err.startswith("error: OFFSET_OUT_OF_RANGE")


def test_delete_is_a_dry_run_unless_executed(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, topic: str
) -> None:
    assert run(capsys, service, "create", "--topic", topic)[0] == 0
    code, out, err = run(capsys, service, "delete", "--topic", topic)
    assert (code, out) == (0, "") and "--execute" in err
    assert topic in [r["TOPIC"] for r in table(run(capsys, service, "list")[1])]
    code, out, _ = run(capsys, service, "delete", "--topic", topic, "--execute")
    assert (code, out.strip()) == (0, f"Deleted topic {topic}.")
    assert topic not in run(capsys, service, "list")[1]
    code, _, err = run(capsys, service, "delete", "--topic", topic, "--execute")
    assert code == 1 and err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION")


def test_bad_input_is_refused_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, topic: str
) -> None:
    code, _, err = run(
        capsys, service, "create", "--topic", topic, "--config", "retention.ms=forever"
    )
    assert code == 1 and err.startswith("error: INVALID_CONFIG")
    assert topic not in run(capsys, service, "list")[1]
    code, _, err = run(capsys, service, "describe", "--topic", topic)
    assert code == 1 and err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION")
    with pytest.raises(SystemExit):
        main(["topics", "delete-records", "--topic", topic, "--offset", "zero"])
    assert "PARTITION:OFFSET" in capsys.readouterr().err
