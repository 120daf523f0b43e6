"""The dashboard's API side: `GET /v1/admin/stats` (transactions by state, ends per minute counted
once per transaction, LSO lag) and the page's sign-in flow (401 form, admin-only cookie, a cookie
alone cannot change state). The page itself runs in a browser in test_dashboard_browser.py."""

from __future__ import annotations

import json
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text, update

from coordinator.admin.service import MINUTE_MS, transaction_ends_query
from coordinator.core.auth import SESSION_COOKIE
from coordinator.core.clock import now_ms, rfc3339
from coordinator.log.models import Batch
from tests.support.api import assert_problem, create_topic
from tests.support.txn import started


async def get_stats(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await client.get("/v1/admin/stats", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def totals(stats: dict[str, Any]) -> tuple[int, int]:
    minutes = stats["per_minute"]
    return sum(m["commits"] for m in minutes), sum(m["aborts"] for m in minutes)


async def test_stats_counts_states_each_end_once_and_the_lso_lag(client: httpx.AsyncClient) -> None:
    await create_topic(client, "pay", partitions=3)
    await create_topic(client, "other")
    committed = await started(client, "committed")
    await committed.add(("pay", 0), ("pay", 1), ("pay", 2))
    for partition in range(3):
        await committed.produce("pay", partition, "x")
    assert (await committed.end(commit=True)).status_code == 200  # three markers, one commit
    aborted = await started(client, "aborted")
    await aborted.add(("pay", 0))
    await aborted.produce("pay", 0, "y")
    assert (await aborted.end(commit=False)).status_code == 200
    offsets_only = await started(client, "offsets-only")
    await offsets_only.offsets("g", ("pay", 0, 1))
    assert (await offsets_only.end(commit=True)).status_code == 200  # no marker: not counted
    still_open = await started(client, "open")
    await still_open.add(("other", 0))
    await still_open.produce("other", 0, "a", "b")
    await started(client, "empty")
    assert (await (await started(client, "prepared")).prepare()).status_code == 200

    stats = await get_stats(client, minutes=5)

    assert stats["states"] == {
        "Empty": 1,
        "Ongoing": 1,
        "Prepared": 1,
        "CompleteCommit": 2,
        "CompleteAbort": 1,
        "Dead": 0,
    }
    assert totals(stats) == (1, 1)
    minutes = [datetime.fromisoformat(m["minute"]) for m in stats["per_minute"]]
    assert len(minutes) == 5
    assert all(m.second == 0 and m.microsecond == 0 for m in minutes)
    assert all((b - a).total_seconds() == 60 for a, b in pairwise(minutes))
    assert abs(datetime.fromisoformat(stats["now"]).timestamp() - minutes[-1].timestamp()) < 60
    lags = {
        (t["name"], p["partition"]): (p["high_watermark"], p["last_stable_offset"], p["lso_lag"])
        for t in stats["topics"]
        for p in t["partitions"]
    }
    assert lags == {
        ("other", 0): (2, 0, 2),  # two records of the open transaction pin the LSO at 0
        ("pay", 0): (4, 4, 0),  # record + commit marker, record + abort marker
        ("pay", 1): (2, 2, 0),
        ("pay", 2): (2, 2, 0),
    }


async def test_stats_show_each_partitions_log_start_and_bytes_and_each_topics_cleanup(
    client: httpx.AsyncClient, app: Any
) -> None:
    created = await client.post(
        "/v1/topics",
        json={"name": "kept", "partitions": 2, "configs": {"retention.bytes": "1000000"}},
    )
    assert created.status_code == 201
    await create_topic(client, "changelog")
    patched = await client.patch(
        "/v1/topics/changelog/configs", json={"set": {"cleanup.policy": "compact"}}
    )
    assert patched.status_code == 200
    for _ in range(3):
        produced = await client.post(
            "/v1/topics/kept/partitions/0/records", json={"records": [{"value": "v" * 100}]}
        )
        assert produced.status_code == 200
    deleted = await client.post(
        "/v1/topics/kept/delete-records", json={"partitions": [{"partition": 0, "offset": 1}]}
    )
    assert deleted.status_code == 200

    topics = {t["name"]: t for t in (await get_stats(client))["topics"]}

    kept = topics["kept"]
    assert (kept["cleanup_policy"], kept["retention_ms"], kept["retention_bytes"]) == (
        "delete",
        app.state.settings.log_retention_ms,
        1_000_000,
    )
    first, second = kept["partitions"]
    assert (first["log_start_offset"], first["high_watermark"]) == (1, 3)
    async with app.state.db.read() as session:
        sizes = (await session.execute(text("SELECT sum(size) FROM batches"))).scalar_one()
    assert first["bytes"] == sizes > 0  # the two batches kept
    assert (second["log_start_offset"], second["bytes"]) == (0, 0)
    assert topics["changelog"]["cleanup_policy"] == "compact"


async def test_stats_buckets_ends_by_minute_and_leaves_older_ones_out(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t", partitions=2)
    for tid, partitions, commit in (
        ("one", [("t", 0), ("t", 1)], True),
        ("two", [("t", 0)], True),
        ("old", [("t", 1)], False),
    ):
        txn = await started(client, tid)
        await txn.add(*partitions)
        for topic, partition in partitions:
            await txn.produce(topic, partition, "v")
        assert (await txn.end(commit=commit)).status_code == 200
    # Move the markers into the past: both commits three minutes back (one minute, two
    # transactions, three markers), the abort two hours back.
    three_back = (now_ms() // MINUTE_MS - 3) * MINUTE_MS + 30_000
    two_hours_back = three_back - 120 * MINUTE_MS
    async with app.state.db.write() as session:
        await session.execute(update(Batch).where(Batch.control == 1).values(timestamp=three_back))
        await session.execute(
            update(Batch).where(Batch.control == 0).values(timestamp=two_hours_back)
        )

    recent = await get_stats(client, minutes=10)
    assert totals(recent) == (2, 0)
    (bucket,) = [m for m in recent["per_minute"] if m["commits"]]
    assert bucket == {
        "minute": rfc3339(three_back // MINUTE_MS * MINUTE_MS),
        "commits": 2,
        "aborts": 0,
    }
    assert totals(await get_stats(client, minutes=180)) == (2, 1)


async def test_stats_reads_markers_through_the_partial_index(app: Any) -> None:
    """The per-minute query must not scan the batches table: it reads marker rows by time."""
    query = transaction_ends_query(now_ms() - 60 * MINUTE_MS)
    async with app.state.db.read() as session:
        sql = str(
            query.compile(dialect=session.bind.dialect, compile_kwargs={"literal_binds": True})
        )
        if session.bind.dialect.name == "sqlite":
            plan = (await session.execute(text(f"EXPLAIN QUERY PLAN {sql}"))).all()
        else:
            # An empty table is cheaper to scan; forbid that to see whether the index applies.
            await session.execute(text("SET LOCAL enable_seqscan = off"))
            plan = (await session.execute(text(f"EXPLAIN {sql}"))).all()
    described = "\n".join(str(row[-1]) for row in plan)
    assert "ix_batches_control_timestamp" in described, described


async def test_stats_window_is_bounded(client: httpx.AsyncClient) -> None:
    for minutes in (0, 1441, -1):
        response = await client.get("/v1/admin/stats", params={"minutes": minutes})
        assert_problem(response, 422, "INVALID_REQUEST")
    assert len((await get_stats(client))["per_minute"]) == 60


async def test_dashboard_is_served_from_the_package_when_auth_is_off(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'data-auth="off"' in page.text
    assert 'data-hanging-ms="900000"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "://" not in page.text  # nothing loaded from elsewhere
    script = await client.get("/dashboard/assets/dashboard.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    for call in ("/v1/admin/stats", "/v1/admin/hanging", "x-coordinator-dashboard"):
        assert call in script.text
    css = await client.get("/dashboard/assets/dashboard.css")
    assert css.headers["content-type"].startswith("text/css")
    assert_problem(await client.get("/dashboard/assets/secrets.json"), 404, "NOT_FOUND")


ADMIN = {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]}
PRODUCER = {
    "token": "producer-token-1",
    "principal": "etl",
    "roles": ["producer", "consumer"],
    "transactional_id_prefixes": [""],
    "topic_prefixes": [""],
    "group_prefixes": [""],
}


def session_cookie(response: httpx.Response) -> tuple[str, list[str]]:
    """The session cookie's value and its attributes, from Set-Cookie."""
    (header,) = [
        h for h in response.headers.get_list("set-cookie") if h.startswith(f"{SESSION_COOKIE}=")
    ]
    pair, *attributes = [part.strip() for part in header.split(";")]
    return pair.partition("=")[2].strip('"'), [a.lower() for a in attributes]


def with_cookie(token: str, **headers: str) -> dict[str, str]:
    return {"cookie": f"{SESSION_COOKIE}={token}", **headers}


class TestSignIn:
    @pytest.fixture
    def settings_overrides(self, tmp_path: Path) -> dict[str, Any]:
        path = tmp_path / "tokens.json"
        path.write_text(json.dumps({"tokens": [ADMIN, PRODUCER]}))
        return {"auth_tokens_file": path}

    async def test_without_a_token_the_dashboard_answers_a_sign_in_form(
        self, client: httpx.AsyncClient
    ) -> None:
        page = await client.get("/dashboard")
        assert page.status_code == 401
        assert page.headers["content-type"].startswith("text/html")
        assert '<form method="post" action="/dashboard/login">' in page.text
        assert 'name="token"' in page.text
        # The sign-in page's stylesheet holds no data and needs no token.
        assert (await client.get("/dashboard/assets/dashboard.css")).status_code == 200
        assert_problem(await client.get("/v1/admin/stats"), 401, "UNAUTHENTICATED")

    async def test_signing_in_with_an_admin_token_sets_a_strict_http_only_cookie(
        self, client: httpx.AsyncClient
    ) -> None:
        answer = await client.post("/dashboard/login", data={"token": ADMIN["token"]})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/dashboard"
        value, attributes = session_cookie(answer)
        assert value == ADMIN["token"]
        assert {"httponly", "samesite=strict", "path=/"} <= set(attributes)
        client.cookies.clear()  # sent by hand below, exactly as a browser would
        page = await client.get("/dashboard", headers=with_cookie(value))
        assert page.status_code == 200
        assert 'data-auth="on"' in page.text
        assert (await client.get("/v1/admin/stats", headers=with_cookie(value))).status_code == 200
        bearer = {"Authorization": f"Bearer {ADMIN['token']}"}
        assert (await client.get("/dashboard", headers=bearer)).status_code == 200

    async def test_an_unknown_or_stale_token_gets_the_form_again(
        self, client: httpx.AsyncClient
    ) -> None:
        answer = await client.post("/dashboard/login", data={"token": "not-a-token-at-all"})
        assert answer.status_code == 401
        assert "That token is not known." in answer.text
        assert not answer.headers.get_list("set-cookie")
        stale = await client.get("/dashboard", headers=with_cookie("revoked-token-1"))
        assert stale.status_code == 401
        assert "no longer accepted" in stale.text

    async def test_a_token_without_the_admin_role_is_refused(
        self, client: httpx.AsyncClient
    ) -> None:
        answer = await client.post("/dashboard/login", data={"token": PRODUCER["token"]})
        assert answer.status_code == 403
        assert answer.headers["content-type"].startswith("text/html")
        assert "admin role" in answer.text
        assert not answer.headers.get_list("set-cookie")
        page = await client.get("/dashboard", headers=with_cookie(PRODUCER["token"]))
        assert page.status_code == 403
        bearer = {"Authorization": f"Bearer {PRODUCER['token']}"}
        assert (await client.get("/dashboard", headers=bearer)).status_code == 403
        refused = await client.get("/v1/admin/stats", headers=with_cookie(PRODUCER["token"]))
        assert_problem(refused, 403, "CLUSTER_AUTHORIZATION_FAILED")

    async def test_a_cookie_alone_cannot_abort_without_the_dashboard_header(
        self, client: httpx.AsyncClient, app: Any
    ) -> None:
        admin = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://coordinator",
            headers={"Authorization": f"Bearer {ADMIN['token']}"},
        )
        async with admin:
            await create_topic(admin, "t")
            txn = await started(admin, "stuck")
            await txn.add(("t", 0))
            await txn.produce("t", 0, "x")
        cookie = with_cookie(ADMIN["token"])
        forged = await client.post("/v1/admin/transactions/stuck/abort", headers=cookie)
        assert_problem(forged, 401, "UNAUTHENTICATED")
        described = await client.get("/v1/transactions/stuck", headers=cookie)
        assert described.json()["state"] == "Ongoing"
        from_page = await client.post(
            "/v1/admin/transactions/stuck/abort",
            headers=with_cookie(ADMIN["token"], **{"x-coordinator-dashboard": "1"}),
        )
        assert from_page.status_code == 200, from_page.text
        assert from_page.json()["state"] == "CompleteAbort"

    async def test_signing_out_clears_the_cookie(self, client: httpx.AsyncClient) -> None:
        answer = await client.post("/dashboard/logout", headers=with_cookie(ADMIN["token"]))
        assert answer.status_code == 303
        assert answer.headers["location"] == "/dashboard"
        value, attributes = session_cookie(answer)
        assert value == ""
        assert "max-age=0" in attributes


async def test_admin_groups_describes_every_group_for_the_panel(client: httpx.AsyncClient) -> None:
    await create_topic(client, "pay", partitions=2)
    joined = await client.post(
        "/v1/groups/settlers/heartbeat",
        json={"member_id": "m-1", "member_epoch": 0, "subscribed_topics": ["pay"]},
    )
    assert joined.status_code == 200, joined.text
    committed = await client.post(
        "/v1/groups/audit/offsets",
        json={"offsets": [{"topic": "pay", "partition": 1, "offset": 0}]},
    )
    assert committed.status_code == 200
    response = await client.get("/v1/admin/groups")
    assert response.status_code == 200, response.text
    audit, settlers = response.json()["groups"]  # by group id
    assert (settlers["group_id"], settlers["state"]) == ("settlers", "Stable")
    assert [m["member_id"] for m in settlers["members"]] == ["m-1"]
    assert len(settlers["members"][0]["assignment"]) == 2
    assert (audit["group_id"], audit["state"], audit["members"]) == ("audit", "Empty", [])
    assert audit["offsets"][0]["lag"] == 0


async def test_ends_of_transaction_version_1_are_each_counted(
    client: httpx.AsyncClient, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's clients keep their epoch from one transaction to the next (transaction version
    1): four commits of one producer at one epoch are four commits, not one."""
    from coordinator.transactions import service
    from coordinator.transactions.inputs import Caller

    # A clock that moves between any two readings, as it does between two database
    # transactions on any real machine.
    ticks = iter(range(now_ms(), now_ms() + 1_000_000))
    monkeypatch.setattr(service, "now_ms", lambda: next(ticks))
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "v1")
    for round_ in range(4):
        await producer.add(("t", 0), ("t", 1))
        for partition in (0, 1):
            assert (await producer.produce("t", partition, f"r{round_}")).status_code == 200
        ended = await service.end(
            app.state.db,
            producer.tid,
            Caller(producer.pid, producer.epoch),
            True,
            version=1,
        )
        assert ended.producer_epoch == producer.epoch
    assert totals(await get_stats(client, minutes=60)) == (4, 0)
