"""Side effects once per key: the EffectsClient (claim, complete, release, describe) and its
`once(key, fn)`, for calls to the outside world (a bank, a mail service) from code that Spark
retries, speculates and reruns (docs/pages/http-api.md, "Side effects: once per key").
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Unpack

import orjson

from sdk._config import EffectsConfig, EffectsOptions, build_config
from sdk._errors import (
    EffectClaimed,
    KafkaException,
)
from sdk._http import HttpClient, api_path
from sdk._lifecycle import Closeable

__all__ = ["Claim", "Effect", "EffectsClient"]


@dataclass(frozen=True)
class Claim:
    """A claim's answer: `state` "claimed" with the `fencing_token` to act under, or "done"
    with the `result` stored by whoever completed the key."""

    key: str
    state: str
    fencing_token: int | None = None
    result: Any = None

    @property
    def done(self) -> bool:
        return self.state == "done"


@dataclass(frozen=True)
class Effect:
    """A key as `describe()` shows it: "claimed" (owner, token, lease end) or "done" (result)."""

    key: str
    state: str
    owner: str | None
    fencing_token: int
    lease_expires_at: datetime | None
    result: Any
    completed_at: datetime | None


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def default_owner() -> str:
    """A name no other caller uses: host, process and a random part."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"


class EffectsClient(Closeable):
    """Claims side-effect keys at the coordinator. `EffectsClient({"coordinator.url": ...})`.

    Where auth is on, the token needs the `producer` role and a transactional-id prefix that
    covers the keys. Calls retry transport failures and retriable answers (but not
    `EffectClaimed`, which each method reports or waits out as it says) until their timeout
    (`default.api.timeout.ms` when none is given), then raise `KafkaTimeoutError`. Raises
    `IllegalStateError` once closed.
    """

    _what = "the effects client"

    def __init__(
        self,
        config: Mapping[str, object] | EffectsConfig | None = None,
        /,
        **options: Unpack[EffectsOptions],
    ) -> None:
        self.config: EffectsConfig = build_config(EffectsConfig, config, options)
        self._http = HttpClient(self.config)

    # -- the four calls ---------------------------------------------------------------------------

    def claim(self, key: str, owner: str, lease_ms: int, *, timeout: float | None = None) -> Claim:
        """Claim `key` for `owner` for `lease_ms`. Returns the claim ("claimed", with the fencing
        token to pass on to the outside system) or, once someone completed the key, "done" with
        its result. The same owner claiming again renews its lease with the same token.

        Raises `EffectClaimed` (retriable) at once while another owner's lease is live."""
        answer = self._post(key, "claim", {"owner": owner, "lease_ms": lease_ms}, timeout)
        return Claim(key, answer["state"], answer.get("fencing_token"), answer.get("result"))

    def complete(
        self, key: str, fencing_token: int, result: Any, *, timeout: float | None = None
    ) -> Any:
        """Store `result` (any JSON value) under the claim of `fencing_token`; the key is done.
        Returns the stored result (the first one, if this is a repeat).

        Raises `FencedClaim` when the token is no longer the key's current one (another owner
        claimed it after the lease ran out): nothing was stored."""
        body = {"fencing_token": fencing_token, "result": result}
        return self._post(key, "complete", body, timeout)["result"]

    def release(self, key: str, fencing_token: int, *, timeout: float | None = None) -> None:
        """Free the key held under `fencing_token`, so it may be tried anew (the effect failed).

        Raises `FencedClaim` when another owner holds the key now, or it is done."""
        self._post(key, "release", {"fencing_token": fencing_token}, timeout)

    def describe(self, key: str, *, timeout: float | None = None) -> Effect:
        """The key's state. Raises `EffectNotFound` for a key with no claim and no result."""
        self._check_open()
        doc = self._http.call("GET", self._path(key), deadline=self._http.deadline(timeout))
        return Effect(
            key=doc["key"],
            state=doc["state"],
            owner=doc["owner"],
            fencing_token=doc["fencing_token"],
            lease_expires_at=_instant(doc["lease_expires_at"]),
            result=doc["result"],
            completed_at=_instant(doc["completed_at"]),
        )

    # -- once -------------------------------------------------------------------------------------

    def once(
        self,
        key: str,
        fn: Callable[[int], Any],
        *,
        lease_ms: int = 60_000,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run `fn(fencing_token)` only if `key` is not done yet, store what it returns (any JSON
        value) as the key's result and return it; if the key is done, return the stored result
        without calling `fn`. Every later caller (a retried task, a speculative copy, a rerun)
        gets that result. When `fn` raises, the key is released (another caller may try the
        effect anew) and the exception propagates.

        While another owner holds the key, waits (polling) until it completes (its result is
        returned) or its lease runs out (then this caller claims it), for at most `timeout`
        seconds (`default.api.timeout.ms` when None; give more than `lease_ms` to outwait an
        owner that died), then raises `EffectClaimed`. `owner` defaults to a unique name per
        call; `lease_ms` should exceed the time `fn` needs.

        What no helper can promise: if this process dies, or stalls past `lease_ms`, after `fn`
        made the outside call but before its result was stored, nothing here can know whether
        the call happened. Once the lease runs out the next caller claims the key, with a
        higher fencing token, and calls again. Only the outside system can close that gap:
        pass it `key` as its idempotency key (it recognises the second call), and the fencing
        token where it can check one (it refuses a call whose token is lower than the highest
        it has seen for the key: a stalled owner that wakes up after losing the key cannot act
        twice). The key is then effected once even across that gap.

        Raises `FencedClaim` when `fn` finished after another owner took the key over (the lease
        ran out first; see above); `KafkaTimeoutError` or `TransportError` when the service
        could not be reached (if that happens after `fn` ran, the key stays claimed until its
        lease runs out, and the next caller calls again: the gap above). A result `fn` returns
        that is not JSON is stored as null and raises `TypeError` (the effect is not repeated).
        """
        owner = owner or default_owner()
        deadline = self._http.deadline(timeout)
        claim = self._claim_waiting(key, owner, lease_ms, deadline)
        if claim.done:
            return claim.result
        token = claim.fencing_token
        assert token is not None
        try:
            result = fn(token)
        except BaseException:
            # If the release fails the lease runs out on its own; fn's error is the one to see.
            with contextlib.suppress(KafkaException):
                self.release(key, token)
            raise
        try:
            orjson.dumps(result)
        except TypeError as exc:
            self.complete(key, token, None)
            raise TypeError(f"once({key!r}): fn returned {result!r}, not JSON") from exc
        return self.complete(key, token, result)

    def _claim_waiting(self, key: str, owner: str, lease_ms: int, deadline: float) -> Claim:
        attempt = 0
        while True:
            try:
                return self.claim(key, owner, lease_ms, timeout=deadline - time.monotonic())
            except EffectClaimed:
                pause = self._http.backoff(attempt)
                attempt += 1
                if time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)

    # -- plumbing ---------------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return api_path("effects", key)

    def _post(self, key: str, call: str, body: dict[str, Any], timeout: float | None) -> Any:
        """POST, retrying transport failures and retriable answers other than EFFECT_CLAIMED
        until the deadline (the calls are idempotent: a repeat after a lost answer is
        harmless)."""
        self._check_open()
        return self._http.call(
            "POST",
            f"{self._path(key)}/{call}",
            body=body,
            deadline=self._http.deadline(timeout),
            retry_if=_retried,
        )

    def close(self) -> None:
        self._close_once(self._http.close)


def _retried(error: KafkaException) -> bool:
    """What `_post` repeats: a retriable answer, but not EFFECT_CLAIMED (each call reports it,
    or waits it out, as it says)."""
    return error.retriable and not isinstance(error, EffectClaimed)
