"""Authentication and authorisation (docs/pages/http-api.md, Conventions and Configuration): tokens,
roles, prefixes; 401 without a valid token, 403 with the resource's code without the right, and a
refused call changes nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import assert_problem
from tests.support.auth_tokens import TOKENS
from tests.support.services import store_rows


@pytest.fixture
def settings_overrides(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": list(TOKENS.values())}))
    return {"auth_tokens_file": path}


@pytest.fixture
async def clients(app: Any) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    transport = httpx.ASGITransport(app=app)
    made = {
        name: httpx.AsyncClient(
            transport=transport,
            base_url="http://coordinator",
            headers={"Authorization": f"Bearer {entry['token']}"},
        )
        for name, entry in TOKENS.items()
    }
    made["anonymous"] = httpx.AsyncClient(transport=transport, base_url="http://coordinator")
    yield made
    for client in made.values():
        await client.aclose()


async def setup_world(admin: httpx.AsyncClient) -> dict[str, int]:
    for name in ("payments", "other"):
        assert (await admin.post("/v1/topics", json={"name": name})).status_code == 201
    ids = {}
    for tid in ("a-1", "b-1"):
        answer = await admin.post("/v1/init-pid", json={"transactional_id": tid})
        ids[tid] = answer.json()["producer_id"]
    return ids


def calls(ids: dict[str, int]) -> list[tuple[str, str, str, dict[str, Any] | None, set[str]]]:
    """(name, method, path, body, the tokens allowed) for every endpoint."""
    a = {"producer_id": ids["a-1"], "producer_epoch": 0}
    b = {"producer_id": ids["b-1"], "producer_epoch": 0}
    record = {"records": [{"value": "v"}]}
    offsets = {"offsets": [{"topic": "payments", "partition": 0, "offset": 1}]}
    admin = {"admin"}
    return [
        ("create topic", "POST", "/v1/topics", {"name": "new"}, admin),
        ("describe topic", "GET", "/v1/topics/payments", None, admin | {"producer", "consumer"}),
        ("describe other topic", "GET", "/v1/topics/other", None, admin),
        ("init idempotent", "POST", "/v1/init-pid", {}, admin | {"producer", "nothing"}),
        ("init a-", "POST", "/v1/init-pid", {"transactional_id": "a-2"}, admin | {"producer"}),
        ("init b-", "POST", "/v1/init-pid", {"transactional_id": "b-2"}, admin),
        (
            "add partitions a-",
            "POST",
            "/v1/transactions/a-1/partitions",
            {**a, "partitions": [{"topic": "payments", "partition": 0}]},
            admin | {"producer"},
        ),
        (
            "add other topic to a-",
            "POST",
            "/v1/transactions/a-1/partitions",
            {**a, "partitions": [{"topic": "other", "partition": 0}]},
            admin,
        ),
        (
            "add partitions b-",
            "POST",
            "/v1/transactions/b-1/partitions",
            {**b, "partitions": [{"topic": "payments", "partition": 0}]},
            admin,
        ),
        (
            "offsets a- g-",
            "POST",
            "/v1/transactions/a-1/offsets",
            {**a, "group_id": "g-1", **offsets},
            admin | {"producer"},
        ),
        (
            "offsets a- h-",
            "POST",
            "/v1/transactions/a-1/offsets",
            {**a, "group_id": "h-1", **offsets},
            admin,
        ),
        ("prepare b-", "POST", "/v1/transactions/b-1/prepare", b, admin),
        ("end b-", "POST", "/v1/transactions/b-1/end", {**b, "commit": True}, admin),
        ("describe a-", "GET", "/v1/transactions/a-1", None, admin | {"producer"}),
        ("describe b-", "GET", "/v1/transactions/b-1", None, admin),
        (
            "commit-group b-",
            "POST",
            "/v1/transactions/commit-group",
            {"transactions": [{"transactional_id": "b-1", **b}]},
            admin,
        ),
        (
            "commit-group a- aborting everything",
            "POST",
            "/v1/transactions/commit-group",
            {"transactions": [{"transactional_id": "a-1", **a}], "abort_others_with_prefix": "b"},
            admin,
        ),
        (
            "produce payments",
            "POST",
            "/v1/topics/payments/partitions/0/records",
            record,
            admin | {"producer"},
        ),
        ("produce other", "POST", "/v1/topics/other/partitions/0/records", record, admin),
        (
            "produce under b-",
            "POST",
            "/v1/topics/payments/partitions/0/records",
            {**b, "base_sequence": 0, "transactional_id": "b-1", **record},
            admin,
        ),
        (
            "fetch payments",
            "GET",
            "/v1/topics/payments/partitions/0/records",
            None,
            admin | {"consumer"},
        ),
        ("fetch other", "GET", "/v1/topics/other/partitions/0/records", None, admin),
        ("commit g-", "POST", "/v1/groups/g-1/offsets", offsets, admin | {"consumer"}),
        ("commit h-", "POST", "/v1/groups/h-1/offsets", offsets, admin),
        ("read g-", "GET", "/v1/groups/g-1/offsets", None, admin | {"consumer"}),
        (
            "heartbeat g-",
            "POST",
            "/v1/groups/g-1/heartbeat",
            {"member_id": "m", "member_epoch": 0, "subscribed_topics": ["payments"]},
            admin | {"consumer"},
        ),
        (
            "heartbeat g- subscribing to other",
            "POST",
            "/v1/groups/g-1/heartbeat",
            {"member_id": "m", "member_epoch": 0, "subscribed_topics": ["other"]},
            admin,
        ),
        (
            "heartbeat h-",
            "POST",
            "/v1/groups/h-1/heartbeat",
            {"member_id": "m", "member_epoch": 0, "subscribed_topics": ["payments"]},
            admin,
        ),
        ("describe g-", "GET", "/v1/groups/g-1", None, admin | {"consumer"}),
        ("describe h-", "GET", "/v1/groups/h-1", None, admin),
        ("delete g-", "DELETE", "/v1/groups/g-1", None, admin),
        ("admin list", "GET", "/v1/admin/transactions", None, admin),
        (
            "admin producers",
            "GET",
            "/v1/admin/producers?topic=payments&partition=0",
            None,
            admin,
        ),
        ("admin hanging", "GET", "/v1/admin/hanging", None, admin),
        ("admin abort", "POST", "/v1/admin/transactions/b-1/abort", None, admin),
        ("metrics", "GET", "/metrics", None, admin),
        (
            "claim effect a-",
            "POST",
            "/v1/effects/a-pay/claim",
            {"owner": "o", "lease_ms": 1000},
            admin | {"producer"},
        ),
        (
            "claim effect b-",
            "POST",
            "/v1/effects/b-pay/claim",
            {"owner": "o", "lease_ms": 1000},
            admin,
        ),
        (
            "complete effect b-",
            "POST",
            "/v1/effects/b-pay/complete",
            {"fencing_token": 1, "result": 1},
            admin,
        ),
        ("release effect b-", "POST", "/v1/effects/b-pay/release", {"fencing_token": 1}, admin),
        ("describe effect a-", "GET", "/v1/effects/a-pay", None, admin | {"producer"}),
        ("describe effect b-", "GET", "/v1/effects/b-pay", None, admin),
        (
            "delete records",
            "POST",
            "/v1/topics/payments/delete-records",
            {"partitions": [{"partition": 0, "offset": 0}]},
            admin,
        ),
        ("delete topic", "DELETE", "/v1/topics/new", None, admin),
    ]


FORBIDDEN_CODES = {
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
}


async def test_role_and_prefix_matrix_every_refusal_changes_nothing(
    clients: dict[str, httpx.AsyncClient], app: Any
) -> None:
    ids = await setup_world(clients["admin"])
    for name, method, path, body, allowed in calls(ids):
        for token in ("producer", "consumer", "nothing", "anonymous"):
            before = await store_rows(app.state.db)
            response = await clients[token].request(method, path, json=body)
            if token in allowed:
                assert response.status_code not in (401, 403), (name, token, response.text)
                continue
            after = await store_rows(app.state.db)
            assert after == before, (name, token, "a refused call changed the store")
            if token == "anonymous":
                assert_problem(response, 401, "UNAUTHENTICATED")
            else:
                assert response.status_code == 403, (name, token, response.text)
                assert response.json()["code"] in FORBIDDEN_CODES, (name, token)
        # The admin may do everything (the call may still fail on state, never on rights).
        response = await clients["admin"].request(method, path, json=body)
        assert response.status_code not in (401, 403), (name, response.text)


async def test_producer_for_prefix_a_cannot_init_add_produce_end_or_abort_under_b(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    ids = await setup_world(clients["admin"])
    producer = clients["producer"]
    b = {"producer_id": ids["b-1"], "producer_epoch": 0}
    tid_refused = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    answers = {
        "init": await producer.post("/v1/init-pid", json={"transactional_id": "b-1"}),
        "add": await producer.post(
            "/v1/transactions/b-1/partitions",
            json={**b, "partitions": [{"topic": "payments", "partition": 0}]},
        ),
        "produce": await producer.post(
            "/v1/topics/payments/partitions/0/records",
            json={**b, "base_sequence": 0, "transactional_id": "b-1", "records": [{"value": "x"}]},
        ),
        "end": await producer.post("/v1/transactions/b-1/end", json={**b, "commit": False}),
        "abort via commit-group": await producer.post(
            "/v1/transactions/commit-group",
            json={
                "transactions": [
                    {"transactional_id": "a-1", "producer_id": ids["a-1"], "producer_epoch": 0}
                ],
                "abort_others_with_prefix": "b-",
            },
        ),
    }
    for call, response in answers.items():
        assert response.status_code == 403, call
        assert_problem(response, 403, tid_refused)
    assert_problem(
        await producer.post("/v1/admin/transactions/b-1/abort"), 403, "CLUSTER_AUTHORIZATION_FAILED"
    )
    # Its own prefix works.
    assert (
        await producer.post("/v1/init-pid", json={"transactional_id": "a-9"})
    ).status_code == 200
    described = await clients["admin"].get("/v1/transactions/b-1")
    assert described.json()["producer_epoch"] == 0  # never bumped by the refused calls


async def test_missing_unknown_or_malformed_token_is_401(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    anonymous = clients["anonymous"]
    for headers in ({}, {"Authorization": "Bearer nope-nope"}, {"Authorization": "Basic abc"}):
        response = await anonymous.get("/v1/topics", headers=headers)
        assert_problem(response, 401, "UNAUTHENTICATED")
        assert response.headers["www-authenticate"] == "Bearer"
    # Health needs no token.
    assert (await anonymous.get("/healthz")).status_code == 200


async def test_topic_list_shows_only_topics_under_the_principals_prefixes(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    await setup_world(clients["admin"])
    names = lambda r: [t["name"] for t in r.json()["topics"]]  # noqa: E731
    assert names(await clients["admin"].get("/v1/topics")) == ["other", "payments"]
    assert names(await clients["consumer"].get("/v1/topics")) == ["payments"]
    assert names(await clients["nothing"].get("/v1/topics")) == []


async def test_group_list_shows_only_groups_under_the_principals_prefixes(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    await setup_world(clients["admin"])
    for group in ("g-1", "h-1"):
        committed = await clients["admin"].post(
            f"/v1/groups/{group}/offsets",
            json={"offsets": [{"topic": "payments", "partition": 0, "offset": 0}]},
        )
        assert committed.status_code == 200, committed.text
    names = lambda r: [g["group_id"] for g in r.json()["groups"]]  # noqa: E731
    assert names(await clients["admin"].get("/v1/groups")) == ["g-1", "h-1"]
    assert names(await clients["consumer"].get("/v1/groups")) == ["g-1"]
    assert names(await clients["producer"].get("/v1/groups")) == []  # not a consumer
    assert names(await clients["nothing"].get("/v1/groups")) == []


async def test_tokens_never_appear_in_logs(
    clients: dict[str, httpx.AsyncClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await clients["anonymous"].get("/v1/topics", headers={"Authorization": "Bearer secret-guess"})
    await clients["producer"].post("/v1/admin/transactions/x/abort")
    logged = caplog.text
    assert "secret-guess" not in logged
    assert TOKENS["producer"]["token"] not in logged


def test_serve_refuses_a_non_loopback_address_without_auth_unless_insecure(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "COORDINATOR_AUTH_TOKENS_FILE"},
        check=False,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in result.stderr
    assert "--insecure" in result.stderr
    assert not (tmp_path / "coordinator.db").exists()  # refused before touching a store
