"""Side effects once per key (docs/pages/http-api.md, "Side effects: once per key"): claim with a
lease and a fencing token, complete with a result, release, describe, and the expiry of old keys.

Every call works on the key's row under its lock (`SELECT ... FOR UPDATE`; SQLite's write lock),
and a first claim races on the primary key (`INSERT ... ON CONFLICT DO NOTHING`), so any number
of service processes on one store hand a key to one owner at a time.

Fencing tokens only ever rise for a key, also across its expiry: a new row starts at the
current time in milliseconds, and each later claim takes the larger of the last token + 1 and
the current time. A paused owner whose row expired and came back can therefore never hold the
token of the key's new owner.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import orjson
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.errors import InvalidRequest
from coordinator.core.metrics import record_effect
from coordinator.core.schemas import INT64_MAX
from coordinator.effects.errors import EffectClaimed, EffectNotFound, FencedClaim
from coordinator.effects.models import CLAIMED, DONE, FREE, Effect
from coordinator.effects.schemas import EffectDescription
from coordinator.store import Store, store_of

# Rows removed per unit of work by the expiry sweep.
EXPIRY_BATCH = 1000


def _claimed(effect: Effect) -> dict[str, Any]:
    return {"state": CLAIMED, "fencing_token": effect.fencing_token}


def _done(effect: Effect) -> dict[str, Any]:
    return {"state": DONE, "result": _result(effect)}


def _result(effect: Effect) -> Any:
    return None if effect.result is None else orjson.loads(effect.result)


async def _insert_first_claim(
    session: AsyncSession, key: str, owner: str, lease_ms: int, now: int
) -> bool:
    """The key's first claim, unless a row exists (then nothing happens): True if inserted."""
    claim = {
        "key": key,
        "state": CLAIMED,
        "owner": owner,
        "fencing_token": now,
        "lease_expires_ms": now + lease_ms,
        "updated_ms": now,
    }
    return await store_of(session).insert_ignore(session, Effect, [claim], ["key"]) == 1


async def _lock(session: AsyncSession, key: str) -> Effect | None:
    return (
        await session.execute(select(Effect).where(Effect.key == key).with_for_update())
    ).scalar_one_or_none()


async def claim(db: Store, key: str, owner: str, lease_ms: int) -> dict[str, Any]:
    """Give `key` to `owner` for `lease_ms`: `claimed` with a fencing token when nobody holds
    it (or the last lease ran out, or `owner` itself holds it: its lease is renewed, with the
    same token, so a claim retried after a lost answer is harmless); `done` with the stored
    result once completed; EFFECT_CLAIMED while another owner's lease is live."""
    # A completed key never changes again (until it expires): answered from a plain read, with
    # no write transaction, as every retry, speculative copy and rerun asks for it.
    async with db.read() as session:
        known = (await session.execute(select(Effect).where(Effect.key == key))).scalar()
        if known is not None and known.state == DONE:
            record_effect("done")
            return _done(known)
    # A row removed by the expiry sweep between the insert and the lock: try again.
    for _ in range(3):
        async with db.write() as session:
            now = now_ms()
            if await _insert_first_claim(session, key, owner, lease_ms, now):
                _count(session, "claimed")
                return {"state": CLAIMED, "fencing_token": now}
            effect = await _lock(session, key)
            if effect is None:
                continue
            if effect.state == DONE:
                _count(session, "done")
                return _done(effect)
            live = effect.lease_expires_ms is not None and effect.lease_expires_ms > now
            if effect.state == CLAIMED and live and effect.owner != owner:
                record_effect("busy")  # the refusal rolls the unit back: counted here
                assert effect.lease_expires_ms is not None
                raise EffectClaimed(
                    f"key {key!r} is held by {effect.owner!r} until "
                    f"{rfc3339(effect.lease_expires_ms)}; retry once it completes or its "
                    "lease runs out",
                    {"owner": effect.owner, "lease_expires_at": rfc3339(effect.lease_expires_ms)},
                )
            renewal = effect.state == CLAIMED and live
            if not renewal:
                effect.fencing_token = max(effect.fencing_token + 1, now)
            effect.state = CLAIMED
            effect.owner = owner
            effect.lease_expires_ms = now + lease_ms
            effect.updated_ms = now
            _count(session, "renewed" if renewal else "claimed")
            return _claimed(effect)
    raise AssertionError(f"key {key!r}: the claim kept racing the expiry sweep")


def _check_token(key: str, effect: Effect, token: int, what: str) -> None:
    if token != effect.fencing_token:
        raise FencedClaim(
            f"key {key!r}: fencing token {token} is not the current one "
            f"({effect.fencing_token}); another owner has the key now, nothing was {what}"
        )


async def _require(session: AsyncSession, key: str) -> Effect:
    effect = await _lock(session, key)
    if effect is None:
        raise EffectNotFound(f"key {key!r} has no claim and no result")
    return effect


async def complete(db: Store, key: str, token: int, result: Any) -> dict[str, Any]:
    """Store the result under the current claim; the key is done. Repeating it with the same
    token answers the stored result again (the first result stays)."""
    text = _encode(result)
    async with db.write() as session:
        now = now_ms()
        effect = await _require(session, key)
        _check_token(key, effect, token, "stored")
        if effect.state == DONE:
            return _done(effect)
        if effect.state == FREE:
            raise FencedClaim(f"key {key!r}: the claim of token {token} was released")
        effect.state = DONE
        effect.result = text
        effect.completed_ms = now
        effect.lease_expires_ms = None
        effect.updated_ms = now
        _count(session, "completed")
        return _done(effect)


async def release(db: Store, key: str, token: int) -> dict[str, Any]:
    """Free the key held under `token` (the effect failed; it may be tried anew). A completed
    key cannot be released; releasing again is harmless."""
    async with db.write() as session:
        now = now_ms()
        effect = await _require(session, key)
        _check_token(key, effect, token, "released")
        if effect.state == DONE:
            raise FencedClaim(f"key {key!r} is done: its result stays; nothing was released")
        if effect.state == CLAIMED:
            effect.state = FREE
            effect.owner = None
            effect.lease_expires_ms = None
            effect.updated_ms = now
            _count(session, "released")
    return {"key": key, "state": FREE}


async def describe(db: Store, key: str) -> EffectDescription:
    async with db.read() as session:
        effect = (await session.execute(select(Effect).where(Effect.key == key))).scalar()
    if effect is None or effect.state == FREE:
        raise EffectNotFound(f"key {key!r} has no claim and no result")
    return EffectDescription(
        key=effect.key,
        state=effect.state,
        owner=effect.owner,
        fencing_token=effect.fencing_token,
        lease_expires_at=rfc3339(effect.lease_expires_ms),
        result=_result(effect),
        completed_at=rfc3339(effect.completed_ms),
    )


async def expire(db: Store, retention_ms: int, now: int | None = None) -> int:
    """Remove keys completed more than `retention_ms` ago, and released or abandoned ones (a
    lease that ran out) untouched for as long. Claims rows with SKIP LOCKED, a batch per unit
    of work, so several processes share the sweep and never wait on a key in use."""
    moment = now_ms() if now is None else now
    cutoff = moment - retention_ms
    removed = 0
    while True:
        async with db.write() as session:
            keys = (
                await session.scalars(
                    select(Effect.key)
                    .where(
                        ((Effect.state == DONE) & (Effect.completed_ms < cutoff))
                        | ((Effect.state == FREE) & (Effect.updated_ms < cutoff))
                        | (
                            (Effect.state == CLAIMED)
                            & (Effect.lease_expires_ms < moment)
                            & (Effect.updated_ms < cutoff)
                        )
                    )
                    .limit(EXPIRY_BATCH)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if keys:
                await session.execute(delete(Effect).where(Effect.key.in_(keys)))
        removed += len(keys)
        if len(keys) < EXPIRY_BATCH:
            return removed


async def counts(session: AsyncSession, now: int) -> dict[str, int]:
    """Keys held under a live lease (`claimed`), completed (`done`), and held under a lease
    that ran out (`lapsed`: the owner died or stalled; the next claim takes the key over)."""
    live = (Effect.state == CLAIMED) & (Effect.lease_expires_ms > now)
    lapsed = (Effect.state == CLAIMED) & (Effect.lease_expires_ms <= now)
    row = (
        await session.execute(
            select(
                func.count().filter(live),
                func.count().filter(Effect.state == DONE),
                func.count().filter(lapsed),
            )
        )
    ).one()
    return {"claimed": row[0], "done": row[1], "lapsed": row[2]}


async def lapsed_claims(session: AsyncSession, now: int, limit: int) -> list[Effect]:
    """Claims whose lease ran out, the longest lapsed first."""
    return list(
        (
            await session.scalars(
                select(Effect)
                .where(Effect.state == CLAIMED, Effect.lease_expires_ms <= now)
                .order_by(Effect.lease_expires_ms)
                .limit(limit)
            )
        ).all()
    )


def _count(session: AsyncSession, outcome: str) -> None:
    session.info.setdefault("after_commit", []).append(partial(record_effect, outcome))


def _encode(result: Any) -> str:
    """The result as JSON text; numbers JSON carries but no reader agrees on are refused."""
    _check_numbers(result)
    return orjson.dumps(result).decode()


def _check_numbers(value: Any) -> None:
    pending = [value]  # a loop, not recursion: as deep as the JSON parser let the body be
    while pending:
        item = pending.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            raise InvalidRequest("result: integers must fit in 64 bits")
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequest("result: NaN and infinities are not JSON")
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
