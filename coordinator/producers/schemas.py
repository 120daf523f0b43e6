"""Bodies of `POST /v1/init-pid`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from coordinator.core.schemas import INT64_MAX, RequestModel, TransactionalId


class InitPidRequest(RequestModel):
    transactional_id: TransactionalId | None = None
    # Range-checked by the service, which answers INVALID_TRANSACTION_TIMEOUT rather than 422.
    transaction_timeout_ms: Annotated[int, Field(ge=-INT64_MAX, le=INT64_MAX)] = 60_000
    keep_prepared: bool = False


class InitPidResponse(BaseModel):
    producer_id: int
    producer_epoch: int
