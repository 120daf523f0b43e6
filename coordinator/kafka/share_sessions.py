"""Kafka's share sessions (KIP-932's ShareFetch sessions, as Kafka's ShareSessionCache keeps
them): the partitions a member fetches from this broker, and the epoch its next ShareFetch or
ShareAcknowledge must carry. Epoch 0 opens a session (replacing the member's old one), -1 closes
it, and each request in between carries the next epoch.

A session is the protocol's, kept in the process that serves the connection, as Kafka's broker
keeps its own: what it fetches and acknowledges lives in the store (`coordinator.shares`), so a
member whose process goes away only opens a new session elsewhere (SHARE_SESSION_NOT_FOUND
tells it to).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from coordinator.shares.errors import (
    InvalidShareSessionEpoch,
    ShareSessionLimitReached,
    ShareSessionNotFound,
)

TP = tuple[str, int]

OPEN = 0
CLOSE = -1
_EPOCH_MAX = 2**31 - 1


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    epoch: int  # what the next request must carry
    partitions: set[TP] = field(default_factory=set)


class ShareSessions:
    """The sessions of one process, by (group, member), at most `limit` of them."""

    def __init__(self, limit: int = 2000) -> None:
        self.limit = limit
        self._sessions: dict[tuple[str, str], ShareSession] = {}
        self._lock = threading.Lock()

    def open(self, group_id: str, member_id: str) -> tuple[ShareSession, ShareSession | None]:
        """A new session (epoch 0), and the member's old one it replaced, if any."""
        key = (group_id, member_id)
        with self._lock:
            old = self._sessions.pop(key, None)
            if len(self._sessions) >= self.limit:
                if old is not None:
                    self._sessions[key] = old
                raise ShareSessionLimitReached(
                    f"this broker keeps {self.limit} share sessions, its most "
                    "(COORDINATOR_SHARE_MAX_SESSIONS)"
                )
            session = ShareSession(group_id, member_id, 1)
            self._sessions[key] = session
            return session, old

    def advance(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """The member's session, for a request at `epoch` (its next), moved to the one after."""
        with self._lock:
            session = self._sessions.get((group_id, member_id))
            if session is None:
                raise ShareSessionNotFound(
                    f"no share session of member {member_id!r} of group {group_id!r} here: "
                    "open one with epoch 0"
                )
            if epoch != session.epoch:
                raise InvalidShareSessionEpoch(
                    f"the share session of member {member_id!r} expects epoch {session.epoch}, "
                    f"not {epoch}"
                )
            session.epoch = 1 if session.epoch == _EPOCH_MAX else session.epoch + 1
            return session

    def close(self, group_id: str, member_id: str) -> ShareSession | None:
        with self._lock:
            return self._sessions.pop((group_id, member_id), None)

    def __len__(self) -> int:
        return len(self._sessions)
