"""A consumer group member's identity on an offset commit (KIP-447), shared by the plain commit's
and the transactional commit's bodies. Imports nothing of the other domains, so both may use it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from coordinator.core.schemas import INT32_MAX, RequestModel, TransactionalId

MemberId = TransactionalId  # 1..255 printable characters; the client makes it up (a UUID)
MemberEpoch = Annotated[int, Field(ge=-1, le=INT32_MAX)]


class MemberIdentity(RequestModel):
    """`member_id` and `member_epoch`: both, or neither (a commit by no member)."""

    member_id: MemberId | None = None
    member_epoch: MemberEpoch | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> MemberIdentity:
        if (self.member_id is None) != (self.member_epoch is None):
            missing = "member_epoch" if self.member_epoch is None else "member_id"
            raise ValueError(f"{missing}: required with the other member field (or send neither)")
        return self
