"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
`coordinator serve` on SQLite: the page shows the counts, the open transactions with the hanging
one highlighted, the topics' LSO lag, the ends per minute and a consumer group's members,
assignment and lag; Abort, once confirmed, ends the hanging transaction. Screenshots are kept in
artifacts/. Runs with auth off and on (signing in through the form)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Page,
    Response,
    expect,
    sync_playwright,
)

from tests.support.services import ServiceProcess

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
# No sandbox (CI runs as root in a container); nothing that would reach for the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_TOKEN = "dashboard-admin-1"
WAIT_MS = 15_000
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Fail, never skip: a missing browser must not turn this test into a silent pass.
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium (the README's test command does)"
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Live:
    url: str
    database: Path
    auth: bool

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"} if self.auth else {}


@pytest.fixture(params=["auth off", "auth on"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    env = {}
    auth = request.param == "auth on"
    if auth:
        tokens = tmp_path / "tokens.json"
        entry = {"token": ADMIN_TOKEN, "principal": "ops", "roles": ["admin"]}
        tokens.write_text(json.dumps({"tokens": [entry]}))
        env["COORDINATOR_AUTH_TOKENS_FILE"] = str(tokens)
    database = tmp_path / "dashboard.db"
    with ServiceProcess(f"sqlite:///{database}", tmp_path, **env) as service:
        yield Live(service.url, database, auth)


def transaction(
    http: httpx.Client, tid: str, topic: str, partition: int, values: list[str]
) -> dict[str, int]:
    """Init `tid`, add the partition and produce `values` in one open transaction."""
    answer = http.post(
        "/v1/init-pid", json={"transactional_id": tid, "transaction_timeout_ms": 900_000}
    )
    assert answer.status_code == 200, answer.text
    caller = answer.json()
    partitions = [{"topic": topic, "partition": partition}]
    added = http.post(
        f"/v1/transactions/{tid}/partitions", json={**caller, "partitions": partitions}
    )
    assert added.status_code == 200, added.text
    produced = http.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        json={
            **caller,
            "base_sequence": 0,
            "transactional_id": tid,
            "records": [{"value": v} for v in values],
        },
    )
    assert produced.status_code == 200, produced.text
    return dict(caller)


def build_world(live: Live) -> None:
    """payments-0: a commit (2 records + marker), then `stuck` open for two hours (1 record);
    payments-1: an abort (1 record + marker), then `fresh` open just now (1 record)."""
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=10) as http:
        created = http.post("/v1/topics", json={"name": "payments", "partitions": 2})
        assert created.status_code == 201, created.text
        for tid, partition, values, commit in (
            ("settle-1", 0, ["a", "b"], True),
            ("settle-2", 1, ["c"], False),
        ):
            caller = transaction(http, tid, "payments", partition, values)
            ended = http.post(f"/v1/transactions/{tid}/end", json={**caller, "commit": commit})
            assert ended.status_code == 200, ended.text
        transaction(http, "stuck", "payments", 0, ["d"])
        transaction(http, "fresh", "payments", 1, ["e"])
        # A consumer group with one member owning both partitions, and a commit on payments-0.
        joined = http.post(
            "/v1/groups/settlers/heartbeat",
            json={"member_id": "m-1", "member_epoch": 0, "subscribed_topics": ["payments"]},
        )
        assert joined.status_code == 200, joined.text
        committed = http.post(
            "/v1/groups/settlers/offsets",
            json={
                "member_id": "m-1",
                "member_epoch": joined.json()["member_epoch"],
                "offsets": [{"topic": "payments", "partition": 0, "offset": 2}],
            },
        )
        assert committed.status_code == 200, committed.text
        # Side effects: one done, one held, one whose owner stalled past its lease.
        for key in ("bank/pay-1", "bank/pay-2", "bank/pay-3"):
            body = {"owner": f"task-{key[-1]}", "lease_ms": 900_000}
            claimed = http.post(f"/v1/effects/{key}/claim", json=body)
            assert claimed.status_code == 200, claimed.text
            if key == "bank/pay-1":
                token = claimed.json()["fencing_token"]
                done = http.post(
                    f"/v1/effects/{key}/complete", json={"fencing_token": token, "result": "ok"}
                )
                assert done.status_code == 200, done.text
    # Age `stuck` by two hours, as if its producer had vanished long ago. Its deadline stays, so
    # the sweeper leaves it alone: only an operator's Abort ends it here.
    with sqlite3.connect(live.database, timeout=30) as connection:
        connection.execute(
            "UPDATE transactions SET started_ms = started_ms - ? WHERE transactional_id = 'stuck'",
            (2 * HOUR_MS,),
        )
        connection.execute(
            "UPDATE effects SET lease_expires_ms = ? WHERE key = 'bank/pay-3'",
            (int(time.time() * 1000) - HOUR_MS,),
        )
    connection.close()


def state_of(live: Live, tid: str) -> str:
    answer = httpx.get(f"{live.url}/v1/transactions/{tid}", headers=live.headers, timeout=10)
    assert answer.status_code == 200, answer.text
    state: str = answer.json()["state"]
    return state


def wait_for_state(live: Live, tid: str, expected: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (state := state_of(live, tid)) != expected:
        assert time.monotonic() < deadline, f"{tid} is {state}, expected {expected}"
        time.sleep(0.05)


def open_dashboard(
    page: Page, live: Live, query: str = "", sign_in_screenshot: Path | None = None
) -> None:
    """Open the page, signing in through its form first when auth is on."""
    answer = page.goto(f"{live.url}/dashboard{query}")
    assert answer is not None
    if live.auth:
        assert answer.status == 401
        expect(page.locator("form[action='/dashboard/login']")).to_be_visible()
        if sign_in_screenshot is not None:
            page.screenshot(path=str(sign_in_screenshot))
        page.fill("#token", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live.url}/dashboard")
        if query:
            page.goto(f"{live.url}/dashboard{query}")
        expect(page.locator("#signout")).to_be_visible()
    else:
        assert answer.status == 200
        expect(page.locator("#signout")).to_be_hidden()


def expect_counts(page: Page, **states: int) -> None:
    for state, count in states.items():
        expect(page.locator(f"#state-{state} .count")).to_have_text(str(count), timeout=WAIT_MS)


def expect_partition(page: Page, partition: int, hw: int, lso: int, lag: int) -> None:
    row = page.locator(f"tr[data-topic='payments'][data-partition='{partition}']")
    expect(row.locator(".hw")).to_have_text(str(hw), timeout=WAIT_MS)
    expect(row.locator(".lso")).to_have_text(str(lso))
    expect(row.locator(".lag")).to_have_text(str(lag))
    expect(row.locator(".log-start")).to_have_text("0")
    expect(row.locator(".bytes")).to_have_text(re.compile(r"^\d+(\.\d)? (B|KiB)$"))
    cleanup = page.locator("div.topic[data-topic='payments'] .cleanup")
    expect(cleanup).to_have_text("delete, retention 7d 00h, no size limit")


def watch_for_problems(page: Page) -> list[str]:
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    def on_response(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"{response.status} {response.url}")

    page.on("console", on_console)
    page.on("response", on_response)
    return problems


def test_dashboard_shows_the_hanging_transaction_and_its_abort_ends_it(
    browser: Browser, live: Live
) -> None:
    build_world(live)
    suffix = "-auth" if live.auth else ""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        open_dashboard(page, live, sign_in_screenshot=ARTIFACTS / "dashboard-sign-in.png")
        # Signed in: from here on, every script error, CSP refusal or failed call is a failure.
        problems = watch_for_problems(page)
        page.reload()

        stuck = page.locator("tr[data-tid='stuck']")
        fresh = page.locator("tr[data-tid='fresh']")
        expect(stuck).to_have_class(re.compile(r"\bhanging\b"), timeout=WAIT_MS)
        expect(stuck.locator(".badge")).to_have_text("hanging")
        expect(stuck.locator(".age")).to_have_text(re.compile(r"^2h 0[01]m$"))
        expect(stuck.locator("td.parts")).to_have_text("payments-0")
        expect(fresh).not_to_have_class(re.compile(r"\bhanging\b"))
        expect(fresh.locator("button.abort")).to_have_count(0)
        expect_counts(page, Empty=0, Ongoing=2, Prepared=0, CompleteCommit=1, CompleteAbort=1)
        expect(page.locator("#total-commits")).to_have_text("1")
        expect(page.locator("#total-aborts")).to_have_text("1")
        expect(page.locator("#chart svg rect.commit")).to_have_count(1)
        expect_partition(page, 0, hw=4, lso=3, lag=1)
        expect_partition(page, 1, hw=3, lso=2, lag=1)
        group = page.locator("div.group[data-group='settlers']")
        expect(group.locator(".group-state")).to_have_text("Stable")
        expect(group.locator("tr[data-member='m-1'] .assignment")).to_have_text(
            "payments-0, payments-1"
        )
        expect(group.locator("tr[data-tp='payments-0'] .lag")).to_have_text("2")
        expect(group.locator("tr[data-tp='payments-1'] .owner")).to_have_text("m-1")
        for name, count in (("claimed", 1), ("done", 1), ("lapsed", 1)):
            expect(page.locator(f"#effects-{name} .count")).to_have_text(str(count))
        lapsed = page.locator("#lapsed tr[data-key='bank/pay-3']")
        expect(lapsed).to_be_visible()
        expect(lapsed.locator(".age")).to_have_text(re.compile(r"^1h 0[01]m$"))
        page.screenshot(path=str(ARTIFACTS / f"dashboard{suffix}.png"), full_page=True)

        asked: list[str] = []

        def confirm(dialog: Dialog) -> None:
            asked.append(f"{dialog.type}: {dialog.message}")
            dialog.accept()

        page.once("dialog", confirm)
        stuck.locator("button.abort").click()
        expect(stuck).to_have_count(0, timeout=WAIT_MS)
        assert len(asked) == 1 and asked[0].startswith('confirm: Abort transaction "stuck"?')
        wait_for_state(live, "stuck", "CompleteAbort")
        assert state_of(live, "fresh") == "Ongoing"
        expect(page.locator("#notice")).to_contain_text('Aborted "stuck"')
        expect_counts(page, Ongoing=1, CompleteAbort=2)
        expect(page.locator("#total-aborts")).to_have_text("2")
        expect_partition(page, 0, hw=5, lso=5, lag=0)
        expect(fresh).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / f"dashboard{suffix}-after-abort.png"), full_page=True)
        assert problems == []
    finally:
        context.close()


def test_dashboard_refuses_to_abort_when_the_operator_cancels(browser: Browser, live: Live) -> None:
    build_world(live)
    context = browser.new_context()
    page = context.new_page()
    try:
        open_dashboard(page, live, "?refresh_s=1")
        stuck = page.locator("tr[data-tid='stuck']")
        expect(stuck).to_have_class(re.compile(r"\bhanging\b"), timeout=WAIT_MS)

        def dismiss(dialog: Dialog) -> Any:
            return dialog.dismiss()

        page.once("dialog", dismiss)
        stuck.locator("button.abort").click()
        # Let a refresh pass: the page renders again, still with the row.
        updated = page.locator("body").get_attribute("data-updated") or ""
        expect(page.locator("body")).not_to_have_attribute("data-updated", updated, timeout=WAIT_MS)
        expect(stuck).to_have_count(1)
        assert state_of(live, "stuck") == "Ongoing"
    finally:
        context.close()
