"""Bodies of the side-effect calls (docs/pages/http-api.md, Side effects: once per key)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import AfterValidator, BaseModel, Field, JsonValue

from coordinator.core.schemas import INT32_MAX, INT64_MAX, RequestModel, transactional_id_path

# The same rule as transactional ids: 1..255 printable characters ("/" allowed, percent-encoded).
EffectKeyPath = Annotated[
    str,
    Path(description="a side-effect key: 1 to 255 printable characters"),
    AfterValidator(transactional_id_path),
]
Owner = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(transactional_id_path)]
FencingToken = Annotated[int, Field(ge=0, le=INT64_MAX)]


class ClaimRequest(RequestModel):
    owner: Owner
    lease_ms: Annotated[int, Field(ge=1, le=INT32_MAX)]


class CompleteRequest(RequestModel):
    fencing_token: FencingToken
    result: JsonValue


class ReleaseRequest(RequestModel):
    fencing_token: FencingToken


class ClaimResponse(BaseModel):
    """`claimed` with the token to act under, or `done` with the stored result."""

    state: str
    fencing_token: int | None = None
    result: Any = None


class DoneResponse(BaseModel):
    state: str
    result: Any


class ReleaseResponse(BaseModel):
    key: str
    state: str


class EffectDescription(BaseModel):
    key: str
    state: str
    owner: str | None
    fencing_token: int
    lease_expires_at: str | None
    result: Any
    completed_at: str | None
