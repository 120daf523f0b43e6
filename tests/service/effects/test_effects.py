"""Side effects once per key (docs/pages/http-api.md, "Side effects: once per key"): one owner at a
time under a lease, fencing tokens that only rise, a stored result that answers every later claim,
release, expiry of old keys, the counts the dashboard and /metrics show; on SQLite and Postgres."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select, update

from coordinator.core.clock import now_ms
from coordinator.effects import service
from coordinator.effects.models import Effect
from coordinator.store.engines import open_store
from tests.support.api import assert_problem
from tests.support.services import Backend, make_settings


def path(key: str, call: str = "") -> str:
    return f"/v1/effects/{quote(key, safe='')}" + (f"/{call}" if call else "")


async def claim(
    client: httpx.AsyncClient, key: str, owner: str, lease_ms: int = 60_000
) -> httpx.Response:
    return await client.post(path(key, "claim"), json={"owner": owner, "lease_ms": lease_ms})


async def claimed_token(client: httpx.AsyncClient, key: str, owner: str) -> int:
    response = await claim(client, key, owner)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "claimed", body
    token: int = body["fencing_token"]
    return token


async def complete(client: httpx.AsyncClient, key: str, token: int, result: Any) -> httpx.Response:
    return await client.post(path(key, "complete"), json={"fencing_token": token, "result": result})


async def release(client: httpx.AsyncClient, key: str, token: int) -> httpx.Response:
    return await client.post(path(key, "release"), json={"fencing_token": token})


async def describe(client: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await client.get(path(key))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def lapse(app: Any, key: str) -> None:
    """Let the key's lease run out (moved into the past, as a paused owner would find it)."""
    async with app.state.db.write() as session:
        await session.execute(
            update(Effect).where(Effect.key == key).values(lease_expires_ms=now_ms() - 1)
        )


async def test_a_claim_gives_the_key_to_one_owner_and_refuses_others_while_the_lease_lives(
    client: httpx.AsyncClient,
) -> None:
    token = await claimed_token(client, "pay-1", "task-a")
    refused = await claim(client, "pay-1", "task-b")
    body = assert_problem(refused, 409, "EFFECT_CLAIMED")
    assert body["retriable"] is True
    assert body["owner"] == "task-a"
    described = await describe(client, "pay-1")
    assert body["lease_expires_at"] == described["lease_expires_at"]
    assert described == {
        "key": "pay-1",
        "state": "claimed",
        "owner": "task-a",
        "fencing_token": token,
        "lease_expires_at": described["lease_expires_at"],
        "result": None,
        "completed_at": None,
    }
    # The owner's own claim again (an answer it lost, retried) renews its lease, same token.
    assert await claimed_token(client, "pay-1", "task-a") == token


async def test_a_completed_key_answers_every_later_claim_with_its_result(
    client: httpx.AsyncClient,
) -> None:
    token = await claimed_token(client, "pay-2", "task-a")
    result = {"transfer": "tx-991", "amount": "12.50", "ok": True}
    done = await complete(client, "pay-2", token, result)
    assert done.status_code == 200, done.text
    assert done.json() == {"state": "done", "result": result}
    # The same completion again is harmless and keeps the first result.
    again = await complete(client, "pay-2", token, {"other": 1})
    assert again.json() == {"state": "done", "result": result}
    for owner in ("task-a", "task-b", "rerun-c"):
        answer = await claim(client, "pay-2", owner)
        assert answer.status_code == 200
        assert answer.json() == {"state": "done", "result": result}
    described = await describe(client, "pay-2")
    assert (described["state"], described["result"], described["fencing_token"]) == (
        "done",
        result,
        token,
    )
    assert described["completed_at"] is not None and described["lease_expires_at"] is None


async def test_a_lapsed_lease_passes_the_key_on_with_a_higher_token_and_fences_the_old_owner(
    client: httpx.AsyncClient, app: Any
) -> None:
    old = await claimed_token(client, "pay-3", "paused")
    await lapse(app, "pay-3")
    new = await claimed_token(client, "pay-3", "successor")
    assert new > old
    # The paused owner wakes up: nothing it does with its token changes the key.
    before = await describe(client, "pay-3")
    assert_problem(await complete(client, "pay-3", old, "late"), 409, "FENCED_CLAIM")
    assert_problem(await release(client, "pay-3", old), 409, "FENCED_CLAIM")
    assert await describe(client, "pay-3") == before
    assert (await complete(client, "pay-3", new, "paid")).json()["result"] == "paid"
    assert_problem(await complete(client, "pay-3", old, "late"), 409, "FENCED_CLAIM")


async def test_an_owner_may_still_complete_after_its_lease_ran_out_if_nobody_took_over(
    client: httpx.AsyncClient, app: Any
) -> None:
    """Fencing is by token, not by clock: a lapsed claim nobody took over is still current."""
    token = await claimed_token(client, "pay-4", "slow")
    await lapse(app, "pay-4")
    assert (await complete(client, "pay-4", token, 1)).json() == {"state": "done", "result": 1}


async def test_release_frees_the_key_and_the_next_claim_gets_a_higher_token(
    client: httpx.AsyncClient,
) -> None:
    first = await claimed_token(client, "pay-5", "failing")
    released = await release(client, "pay-5", first)
    assert released.status_code == 200, released.text
    assert released.json() == {"key": "pay-5", "state": "free"}
    assert (await release(client, "pay-5", first)).status_code == 200  # harmless again
    assert_problem(await client.get(path("pay-5")), 404, "EFFECT_NOT_FOUND")
    assert_problem(await complete(client, "pay-5", first, "x"), 409, "FENCED_CLAIM")
    second = await claimed_token(client, "pay-5", "retry")
    assert second > first
    assert (await complete(client, "pay-5", second, "ok")).status_code == 200
    assert_problem(await release(client, "pay-5", second), 409, "FENCED_CLAIM")  # done stays
    assert (await describe(client, "pay-5"))["state"] == "done"


async def test_unknown_keys_are_effect_not_found(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get(path("nobody")), 404, "EFFECT_NOT_FOUND")
    assert_problem(await complete(client, "nobody", 1, None), 404, "EFFECT_NOT_FOUND")
    assert_problem(await release(client, "nobody", 1), 404, "EFFECT_NOT_FOUND")


async def test_keys_hold_any_printable_character_slashes_included(
    client: httpx.AsyncClient,
) -> None:
    key = "bank/pay ?#%/ü-1"
    token = await claimed_token(client, key, "o")
    assert (await complete(client, key, token, [1, 2])).status_code == 200
    assert (await describe(client, key))["key"] == key


@pytest.mark.parametrize(
    ("call", "body", "field"),
    [
        ("claim", {"owner": "o", "lease_ms": 0}, "lease_ms"),
        ("claim", {"owner": "o", "lease_ms": "1000"}, "lease_ms"),
        ("claim", {"owner": "", "lease_ms": 1000}, "owner"),
        ("claim", {"owner": "o\n", "lease_ms": 1000}, "owner"),
        ("claim", {"lease_ms": 1000}, "owner"),
        ("complete", {"fencing_token": -1, "result": 1}, "fencing_token"),
        ("complete", {"fencing_token": 1}, "result"),
        ("complete", {"fencing_token": 1, "result": 1, "extra": 2}, "extra"),
        ("release", {"fencing_token": 1.0}, "fencing_token"),
    ],
)
async def test_bad_bodies_are_invalid_request_naming_the_field_and_change_nothing(
    client: httpx.AsyncClient, call: str, body: dict[str, Any], field: str
) -> None:
    token = await claimed_token(client, "k", "o")
    before = await describe(client, "k")
    response = await client.post(path("k", call), json=body)
    problem = assert_problem(response, 422, "INVALID_REQUEST")
    assert field in problem["detail"]
    assert await describe(client, "k") == before
    assert before["fencing_token"] == token


async def test_results_no_json_reader_agrees_on_and_bad_keys_are_refused(
    client: httpx.AsyncClient,
) -> None:
    token = await claimed_token(client, "k", "o")
    for raw in (
        b'{"fencing_token": %d, "result": NaN}' % token,
        b'{"fencing_token": %d, "result": [1e999]}' % token,
        b'{"fencing_token": %d, "result": {"a": 123456789012345678901234567890}}' % token,
    ):
        response = await client.post(
            path("k", "complete"), content=raw, headers={"content-type": "application/json"}
        )
        assert 400 <= response.status_code < 500, response.text
        assert response.json()["code"] == "INVALID_REQUEST"
    assert (await describe(client, "k"))["state"] == "claimed"
    too_long = "k" * 256
    response = await client.post(path(too_long, "claim"), json={"owner": "o", "lease_ms": 1})
    assert_problem(response, 422, "INVALID_REQUEST")
    response = await client.get(path("bad\x01key"))
    assert_problem(response, 422, "INVALID_REQUEST")


async def test_owners_racing_for_a_key_from_several_processes_get_one_claim(
    client: httpx.AsyncClient, store: Backend, app: Any
) -> None:
    """Three stores' worth of connections (as three service processes), twelve owners at once:
    one claim, every other owner EFFECT_CLAIMED; the same after the lease ran out."""
    others = [open_store(make_settings(store)) for _ in range(2)]
    databases = [app.state.db, *others]

    async def attempt(owner: int) -> dict[str, Any] | str:
        try:
            return await service.claim(databases[owner % 3], "race", f"owner-{owner}", 60_000)
        except Exception as error:  # the refusal is the point
            return getattr(error, "code", repr(error))

    try:
        for _round in range(2):
            answers = await asyncio.gather(*(attempt(n) for n in range(12)))
            granted = [a for a in answers if isinstance(a, dict)]
            assert len(granted) == 1, answers
            assert sorted(a for a in answers if isinstance(a, str)) == ["EFFECT_CLAIMED"] * 11
            await lapse(app, "race")
    finally:
        for db in others:
            await db.dispose()


async def test_expiry_removes_old_completed_released_and_abandoned_keys_only(
    client: httpx.AsyncClient, app: Any
) -> None:
    for key in ("done-old", "done-new", "free-old", "held", "abandoned"):
        token = await claimed_token(client, key, "o")
        if key.startswith("done"):
            await complete(client, key, token, key)
        elif key == "free-old":
            await release(client, key, token)
    await lapse(app, "abandoned")
    hour = 3_600_000
    async with app.state.db.write() as session:
        old = now_ms() - 2 * hour
        await session.execute(
            update(Effect)
            .where(Effect.key.in_(["done-old", "free-old", "abandoned"]))
            .values(completed_ms=old, updated_ms=old)
        )
        await session.execute(
            update(Effect).where(Effect.key == "done-old").values(completed_ms=old)
        )
    old_token = (await describe(client, "done-old"))["fencing_token"]

    assert await service.expire(app.state.db, retention_ms=hour) == 3

    async with app.state.db.read() as session:
        left = sorted((await session.scalars(select(Effect.key))).all())
    assert left == ["done-new", "held"]
    # A key that expired and comes back still gets a higher token than any it had.
    assert await claimed_token(client, "done-old", "late") > old_token


async def test_stats_and_metrics_count_claimed_done_and_lapsed_keys(
    client: httpx.AsyncClient, app: Any
) -> None:
    for key in ("a", "b", "c", "d"):
        token = await claimed_token(client, key, f"owner-{key}")
        if key == "a":
            await complete(client, key, token, None)
    await lapse(app, "d")
    await claim(client, "b", "intruder")  # refused: counted as busy

    stats = (await client.get("/v1/admin/stats", params={"minutes": 1})).json()["effects"]
    assert {k: stats[k] for k in ("claimed", "done", "lapsed")} == {
        "claimed": 2,
        "done": 1,
        "lapsed": 1,
    }
    assert [(c["key"], c["owner"]) for c in stats["lapsed_claims"]] == [("d", "owner-d")]

    scraped = (await client.get("/metrics")).text
    gauges = {
        s.labels["state"]: s.value
        for family in text_string_to_metric_families(scraped)
        if family.name == "coordinator_effects"
        for s in family.samples
    }
    assert gauges == {"claimed": 2, "done": 1, "lapsed": 1}
    calls = {
        s.labels["outcome"]
        for family in text_string_to_metric_families(scraped)
        if family.name == "coordinator_effect_calls"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert {"claimed", "completed", "busy"} <= calls
