"""The SDK's EffectsClient and `once(key, fn)` against the live service, on SQLite and Postgres:
a completed key answers every later caller with its result, a failed effect is released and
tried anew, two processes racing for one key call the outside world once, and an owner paused
past its lease is fenced by the token the outside system checks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import (
    EffectClaimed,
    EffectNotFound,
    EffectsClient,
    FencedClaim,
)
from tests.support.sdk_support import Coordinator, Faults, FaultyTransport, once, wait_for
from tests.support.spark_support import PROJECT_ROOT


class Bank:
    """A stand-in outside system that checks fencing tokens: a payment for a key carrying a
    lower token than one it has already seen for that key is refused."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []  # every call that reached it, refused or not
        self.highest: dict[str, int] = {}

    def pay(self, key: str, token: int) -> str:
        with self.lock:
            self.calls.append((key, token))
            if token < self.highest.get(key, -1):
                raise PermissionError(f"{key}: token {token} is stale")
            self.highest[key] = token
            return f"transfer-{key}-{token}"


def client(service: Coordinator, **options: Any) -> EffectsClient:
    return EffectsClient({"coordinator.url": service.url, "retry.backoff.ms": 10}, **options)


def test_once_calls_fn_once_and_every_later_caller_gets_the_stored_result(
    service: Coordinator,
) -> None:
    bank = Bank()
    with client(service) as effects:
        first = effects.once("pay-1", lambda token: bank.pay("pay-1", token))
        for _ in range(3):
            again = effects.once("pay-1", lambda token: bank.pay("pay-1", token))
            assert again == first
        described = effects.describe("pay-1")
    assert len(bank.calls) == 1
    assert first == f"transfer-pay-1-{bank.calls[0][1]}"
    assert (described.state, described.result, described.fencing_token) == (
        "done",
        first,
        bank.calls[0][1],
    )
    assert described.completed_at is not None and described.lease_expires_at is None


def test_a_failing_effect_is_released_and_tried_anew(service: Coordinator) -> None:
    tokens: list[int] = []

    def refused(token: int) -> str:
        tokens.append(token)
        raise ConnectionError("the bank is down")

    with client(service) as effects:
        with pytest.raises(ConnectionError):
            effects.once("pay-2", refused)
        with pytest.raises(EffectNotFound):
            effects.describe("pay-2")  # released: free again
        result = effects.once("pay-2", lambda token: tokens.append(token) or "paid")
    assert result == "paid"
    assert len(tokens) == 2 and tokens[1] > tokens[0]


def test_the_raw_calls_raise_typed_errors(service: Coordinator) -> None:
    with client(service) as effects:
        claim = effects.claim("pay-3", "a", 60_000)
        assert claim.state == "claimed" and not claim.done and claim.fencing_token
        with pytest.raises(EffectClaimed) as busy:
            effects.claim("pay-3", "b", 60_000)
        assert busy.value.retriable and "'a'" in busy.value.detail
        with pytest.raises(FencedClaim):
            effects.complete("pay-3", claim.fencing_token - 1, "x")
        assert effects.complete("pay-3", claim.fencing_token, {"ok": 1}) == {"ok": 1}
        done = effects.claim("pay-3", "b", 60_000)
        assert done.done and done.result == {"ok": 1}
        with pytest.raises(EffectNotFound):
            effects.release("nothing", 1)


def test_lost_answers_are_retried_harmlessly(service: Coordinator) -> None:
    """Every claim's and complete's first answer is lost after the service handled it: the
    retried claim renews the same claim, the retried complete answers the stored result."""
    effects_calls = lambda request: "/v1/effects/" in request.url.path  # noqa: E731
    transport = FaultyTransport(Faults(drop_response=1.0, only=once(effects_calls)), seed=1)
    calls: list[int] = []
    with client(service, transport=transport) as effects:
        result = effects.once("pay-4", lambda token: calls.append(token) or "paid")
    assert transport.injected["drop_response"] == 1
    assert result == "paid" and len(calls) == 1


def test_an_owner_paused_past_its_lease_is_fenced_by_the_token_the_outside_system_checks(
    service: Coordinator,
) -> None:
    bank = Bank()
    claimed, resume = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def paused(token: int) -> str:
        claimed.set()
        resume.wait(60)  # a long GC pause, between the claim and the outside call
        return bank.pay("pay-5", token)

    def first_owner() -> None:
        with client(service) as effects:
            try:
                outcome["first"] = effects.once("pay-5", paused, lease_ms=200)
            except Exception as error:
                outcome["first"] = error

    thread = threading.Thread(target=first_owner)
    thread.start()
    try:
        assert claimed.wait(30)
        with client(service) as effects:
            # Waits while the paused owner's lease lives, then takes the key over.
            second = effects.once("pay-5", lambda token: bank.pay("pay-5", token), timeout=30)
    finally:
        resume.set()
        thread.join(60)

    assert isinstance(outcome["first"], PermissionError), outcome  # the bank refused it
    (old, new) = sorted(token for _, token in bank.calls)
    assert bank.calls == [("pay-5", new), ("pay-5", old)]  # the successor paid first
    assert second == f"transfer-pay-5-{new}"
    with client(service) as effects:
        assert effects.describe("pay-5").result == second
        # And had the paused owner not called out at all, its result is refused too.
        with pytest.raises(FencedClaim):
            effects.complete("pay-5", old, "late")


RACER = """
import json, sys, time, urllib.request
from sdk import EffectsClient
url, key, calls, ready = sys.argv[1:5]

def metric(name):
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))

BUSY = 'coordinator_effect_calls_total{outcome="busy"}'
busy_before = float(open(ready).read())

def call(token):
    with open(calls, "a") as out:
        out.write(json.dumps({"token": token}) + "\\n")
    # Hold the key until the other process has been refused it at least once.
    deadline = time.monotonic() + 60
    while metric(BUSY) <= busy_before:
        assert time.monotonic() < deadline, "the other process never asked"
        time.sleep(0.01)
    return {"paid_with": token}

with EffectsClient({"coordinator.url": url, "retry.backoff.ms": 10}) as effects:
    print(json.dumps(effects.once(key, call, timeout=60)))
"""


def busy_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    name = 'coordinator_effect_calls_total{outcome="busy"}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_two_processes_racing_for_one_key_call_the_outside_world_once(
    service: Coordinator, tmp_path: Path
) -> None:
    calls, ready = tmp_path / "calls.jsonl", tmp_path / "busy-before"
    calls.touch()
    ready.write_text(str(busy_count(service.url)))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, service.url, "pay-6", str(calls), str(ready)],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    answers = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        answers.append(json.loads(out.strip().splitlines()[-1]))

    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(made) == 1  # one call to the outside world
    assert answers == [{"paid_with": made[0]["token"]}] * 2  # both got its result
    wait_for(lambda: busy_count(service.url) > float(ready.read_text()), what="a refusal")
