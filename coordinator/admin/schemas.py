"""Answers of the admin calls (docs/pages/http-api.md, Admin)."""

from __future__ import annotations

from pydantic import BaseModel


class MinuteCount(BaseModel):
    minute: str
    commits: int
    aborts: int


class PartitionLag(BaseModel):
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    lso_lag: int
    # Bytes of the record batches the partition keeps (markers included).
    bytes: int


class TopicLag(BaseModel):
    name: str
    # The topic's `retention.ms`, `retention.bytes` and `cleanup.policy`, defaults applied.
    retention_ms: int
    retention_bytes: int
    cleanup_policy: str
    partitions: list[PartitionLag]


class LapsedClaim(BaseModel):
    key: str
    owner: str | None
    fencing_token: int
    lease_expires_at: str | None


class EffectStats(BaseModel):
    """Side-effect keys: held under a live lease, done, and held under a lease that ran out
    (the owner died or stalled), with the longest-lapsed of those."""

    claimed: int
    done: int
    lapsed: int
    lapsed_claims: list[LapsedClaim]


class Stats(BaseModel):
    """What the dashboard shows besides the lists: `now` is the server's clock, so ages are not
    skewed by the browser's."""

    now: str
    states: dict[str, int]
    per_minute: list[MinuteCount]
    topics: list[TopicLag]
    effects: EffectStats
