"""`coordinator groups ...` (kafka-consumer-groups.sh for this service) against a real
`coordinator serve` on SQLite and on Postgres: list, describe (offsets and lag per partition with
its owner, members, state), delete, and reset-offsets (dry run by default, only for a group with
no members, offsets kept within the log's bounds)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

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
    yield from serve_on_fresh_store(request.param, tmp_path_factory.mktemp("cli-groups"), "groups")


@pytest.fixture
def name() -> str:
    """A prefix of this test's own: the services are shared by the module's tests."""
    return f"g{uuid.uuid4().hex[:8]}-"


class World:
    """A topic with records, and a group with one member and committed offsets."""

    def __init__(self, service: ServiceProcess, name: str) -> None:
        self.http = httpx.Client(base_url=service.url, timeout=30)
        self.topic, self.group, self.member = f"{name}t", f"{name}group", f"{name}member"
        self.ok("POST", "/v1/topics", json={"name": self.topic, "partitions": 2})
        for partition, count in ((0, 10), (1, 4)):
            records = [{"value": str(i)} for i in range(count)]
            self.ok(
                "POST",
                f"/v1/topics/{self.topic}/partitions/{partition}/records",
                json={"records": records},
            )
        self.epoch = self.heartbeat(0, subscribed_topics=[self.topic], client_id="reader")[
            "member_epoch"
        ]
        self.ok(
            "POST",
            f"/v1/groups/{self.group}/offsets",
            json={
                "member_id": self.member,
                "member_epoch": self.epoch,
                "offsets": [{"topic": self.topic, "partition": 0, "offset": 6}],
            },
        )

    def ok(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.http.request(method, path, **kwargs)
        assert response.is_success, response.text
        body: dict[str, Any] = response.json()
        return body

    def heartbeat(self, epoch: int, **body: Any) -> dict[str, Any]:
        return self.ok(
            "POST",
            f"/v1/groups/{self.group}/heartbeat",
            json={"member_id": self.member, "member_epoch": epoch, **body},
        )

    def leave(self) -> None:
        self.heartbeat(-1)

    def committed(self) -> dict[int, int]:
        offsets = self.ok("GET", f"/v1/groups/{self.group}/offsets")["offsets"]
        return {o["partition"]: o["offset"] for o in offsets}


@pytest.fixture
def world(service: ServiceProcess, name: str) -> Iterator[World]:
    made = World(service, name)
    try:
        yield made
    finally:
        made.http.close()


def run(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, *argv: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["groups", "--url", service.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_each_group_with_its_state_and_members(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, world: World
) -> None:
    code, out, _ = run(capsys, service, "list")
    assert code == 0
    (row,) = [r for r in table(out) if r["GROUP"] == world.group]
    assert row == {"GROUP": world.group, "TYPE": "consumer", "STATE": "Stable", "MEMBERS": "1"}
    code, out, _ = run(capsys, service, "list", "--state", "Empty")
    assert world.group not in out
    code, out, _ = run(capsys, service, "--json", "list")
    assert world.group in [g["group_id"] for g in json.loads(out)["groups"]]


def test_describe_shows_offsets_lag_and_owner_members_and_state(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, world: World
) -> None:
    code, out, _ = run(capsys, service, "describe", "--group", world.group)
    assert code == 0
    rows = table(out)
    assert [(r["TOPIC"], r["PARTITION"]) for r in rows] == [(world.topic, "0"), (world.topic, "1")]
    first, second = rows
    assert (first["CURRENT-OFFSET"], first["LOG-END-OFFSET"], first["LAG"]) == ("6", "10", "4")
    assert (first["CONSUMER-ID"], first["CLIENT-ID"]) == (world.member, "reader")
    assert (second["CURRENT-OFFSET"], second["LAG"], second["CONSUMER-ID"]) == (
        "-",
        "-",
        world.member,
    )
    code, out, _ = run(capsys, service, "describe", "--group", world.group, "--members")
    (member,) = table(out)
    assert (member["CONSUMER-ID"], member["#PARTITIONS"]) == (world.member, "2")
    assert member["ASSIGNMENT"] == f"{world.topic}-0,{world.topic}-1"
    code, out, _ = run(capsys, service, "describe", "--group", world.group, "--state")
    (state,) = table(out)
    assert (state["STATE"], state["#MEMBERS"], state["TYPE"]) == ("Stable", "1", "consumer")
    code, _, err = run(capsys, service, "describe", "--group", f"{world.group}-none")
    assert code == 1 and "GROUP_ID_NOT_FOUND" in err


def test_reset_offsets_is_a_dry_run_by_default_and_only_for_a_group_without_members(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, world: World
) -> None:
    reset = ["reset-offsets", "--group", world.group, "--topic", world.topic, "--to-earliest"]
    code, _, err = run(capsys, service, *reset, "--execute")
    assert code == 1 and "inactive" in err and "Stable" in err
    world.leave()
    code, out, err = run(capsys, service, *reset)
    assert code == 0 and "dry run" in err
    assert [(r["PARTITION"], r["NEW-OFFSET"]) for r in table(out)] == [("0", "0"), ("1", "0")]
    assert world.committed() == {0: 6}
    code, out, _ = run(capsys, service, *reset, "--execute")
    assert code == 0 and world.committed() == {0: 0, 1: 0}

    def reset_to(*how: str, topic: str = world.topic) -> dict[int, int]:
        code, _, err = run(
            capsys, service, "reset-offsets", "--group", world.group, "--topic", topic, *how,
            "--execute",
        )  # fmt: skip
        assert code == 0, err
        return world.committed()

    assert reset_to("--to-latest") == {0: 10, 1: 4}
    assert reset_to("--shift-by", "-3") == {0: 7, 1: 1}
    assert reset_to("--shift-by", "-5") == {0: 2, 1: 0}  # kept within the log
    assert reset_to("--to-offset", "8") == {0: 8, 1: 4}
    assert reset_to("--to-offset", "1", topic=f"{world.topic}:1") == {0: 8, 1: 1}
    code, out, _ = run(
        capsys, service, "--json", "reset-offsets", "--group", world.group, "--all-topics",
        "--to-earliest",
    )  # fmt: skip
    answer = json.loads(out)
    assert answer["executed"] is False and [o["offset"] for o in answer["offsets"]] == [0, 0]


def test_delete_refuses_a_group_with_members_then_deletes_it(
    capsys: pytest.CaptureFixture[str], service: ServiceProcess, world: World
) -> None:
    code, _, err = run(capsys, service, "delete", "--group", world.group)
    assert code == 1 and "NON_EMPTY_GROUP" in err
    world.leave()
    code, out, _ = run(capsys, service, "delete", "--group", world.group)
    assert code == 0 and "was successful" in out
    code, _, err = run(capsys, service, "describe", "--group", world.group)
    assert code == 1 and "GROUP_ID_NOT_FOUND" in err


def test_help_names_every_groups_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["groups", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for subcommand in ("list", "describe", "delete", "reset-offsets"):
        assert subcommand in out
    with pytest.raises(SystemExit):
        main(["groups", "reset-offsets", "--group", "g", "--all-topics"])  # no target: refused
    assert "one of the arguments" in capsys.readouterr().err
