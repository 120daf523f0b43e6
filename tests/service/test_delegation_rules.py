"""Delegation tokens' rules (KIP-48) without I/O, as Kafka's DelegationTokenControlManager
decides: lifetimes, renewals and expiry within the maximum, who may renew and who may see a
token, and the HMAC a client logs in with."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from coordinator.core import delegation
from coordinator.core.delegation import Policy, Token

POLICY = Policy("secret", max_lifetime_ms=7_000, expiry_time_ms=1_000)


def _token(**changes: object) -> Token:
    fields: dict[str, object] = {
        "token_id": "t1",
        "owner": "alice",
        "requester": "alice",
        "renewers": ("bob",),
        "issued_ms": 0,
        "expiry_ms": 1_000,
        "max_ms": 7_000,
        "hmac": b"h",
    }
    fields.update(changes)
    return Token(**fields)  # type: ignore[arg-type]


def test_a_new_token_lives_one_expiry_time_within_its_maximum() -> None:
    assert delegation.lifetime(POLICY, 100, -1) == (7_100, 1_100)
    assert delegation.lifetime(POLICY, 100, 500) == (600, 600)  # asked less: taken
    assert delegation.lifetime(POLICY, 100, 99_000) == (7_100, 1_100)  # asked more: the policy's


def test_a_renewal_moves_the_expiry_by_at_most_the_expiry_time_never_past_the_maximum() -> None:
    token = _token()
    assert delegation.renewed(POLICY, token, "alice", 500, -1) == 1_500
    assert delegation.renewed(POLICY, token, "bob", 500, 200) == 700
    assert delegation.renewed(POLICY, token, "alice", 500, 5_000) == 1_500
    late = _token(expiry_ms=7_000)
    assert delegation.renewed(POLICY, late, "alice", 6_900, -1) == 7_000
    with pytest.raises(delegation.DelegationTokenOwnerMismatch):
        delegation.renewed(POLICY, token, "carol", 500, -1)
    with pytest.raises(delegation.DelegationTokenExpired):
        delegation.renewed(POLICY, token, "alice", 1_001, -1)


def test_expiring_now_removes_and_later_moves_the_expiry() -> None:
    token = _token()
    assert delegation.expired_at(token, "alice", 500, -1) is None
    assert delegation.expired_at(token, "bob", 500, 100) == 600
    assert delegation.expired_at(token, "alice", 500, 99_000) == 7_000
    with pytest.raises(delegation.DelegationTokenOwnerMismatch):
        delegation.expired_at(token, "carol", 500, -1)
    with pytest.raises(delegation.DelegationTokenExpired):
        delegation.expired_at(token, "alice", 1_001, 10)
    assert delegation.expired_at(token, "alice", 1_001, -1) is None  # gone, expired or not


def test_who_sees_a_token() -> None:
    token = _token()
    assert token.visible_to("alice", None, admin=False)
    assert token.visible_to("bob", None, admin=False)
    assert not token.visible_to("carol", None, admin=False)
    assert token.visible_to("carol", None, admin=True)
    assert token.visible_to("carol", ["bob"], admin=True)  # a renewer is an owner asked for
    assert not token.visible_to("alice", ["dave"], admin=True)


def test_the_login_password_is_the_hmac_of_the_id_in_base64() -> None:
    expected = hmac.new(b"secret", b"t1", hashlib.sha512).digest()
    assert delegation.hmac_of(POLICY, "t1") == expected
    assert delegation.password_of(expected) == base64.b64encode(expected).decode()


def test_without_a_secret_tokens_are_disabled() -> None:
    with pytest.raises(delegation.DelegationTokenAuthDisabled):
        Policy(None, 1, 1).enabled()
