"""Bodies of the consumer group offset calls (API.md, Consumer group offsets)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from coordinator.core.schemas import RequestModel
from coordinator.transactions.schemas import OffsetIn


class CommitOffsetsRequest(RequestModel):
    offsets: Annotated[list[OffsetIn], Field(min_length=1, max_length=100_000)]


class OffsetOut(BaseModel):
    topic: str
    partition: int
    offset: int
    metadata: str | None


class OffsetsResponse(BaseModel):
    offsets: list[OffsetOut]
