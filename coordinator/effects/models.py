"""One row per side-effect key: who holds it (owner, fencing token, lease) or its stored result."""

from __future__ import annotations

from sqlalchemy import BigInteger, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base

# `Effect.state`: held by an owner until its lease ends; completed with a result; or released
# (free: kept only so the key's fencing tokens keep rising, answered as unknown).
CLAIMED = "claimed"
DONE = "done"
FREE = "free"


class Effect(Base):
    __tablename__ = "effects"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str | None] = mapped_column(String(255), nullable=True)
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    # Milliseconds since the epoch; null once done or free.
    lease_expires_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The result as JSON text; null until done.
    result: Mapped[str | None] = mapped_column(Text, nullable=True)
    completed_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Last change: free and abandoned keys expire from here, completed ones from completed_ms.
    updated_ms: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_effects_state_completed_ms", "state", "completed_ms"),
        Index("ix_effects_state_lease_expires_ms", "state", "lease_expires_ms"),
    )
