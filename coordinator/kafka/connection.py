"""One Kafka connection as the handlers see it: where it came from, who it is, what it shares
with the process (the store, the settings, the quota). Apart from the listener, so handlers and
listener do not import each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.cluster.view import Cluster
from coordinator.core.auth import Access, Authenticator
from coordinator.core.quotas import MutationQuota
from coordinator.core.settings import Settings
from coordinator.kafka.share_sessions import ShareSessions
from coordinator.kafka.wire import Request
from coordinator.log.read_ahead import ReadAhead
from coordinator.store import Store
from coordinator.telemetry.instances import Instances

# KIP-430: the authorized operations' value when the client did not ask for them.
NOT_ASKED = -(2**31)


@dataclass
class Client:
    """One connection: where it came from, who it is, and what the handlers need."""

    db: Store
    settings: Settings
    authenticator: Authenticator | None
    host: str  # the address the client reached (Metadata names it as the broker)
    port: int
    client_host: str
    client_port: int = 0
    access: Access | None = None  # None until authenticated
    client_id: str = ""
    # What the client said it is in ApiVersions (3+): KIP-511's software name and version.
    software_name: str = ""
    software_version: str = ""
    last_request: str = ""  # "API key K version V" of the request being read or answered
    sasl: Any = None  # the SASL exchange under way (handlers.sasl.Exchange)
    raw_sasl: bool = False  # SaslHandshake v0: the next frame is a bare SASL token
    failed_authentication: bool = False  # answered, then the connection closes after a delay
    # Who the connection's SASL login proved (None: no SASL login), and whether by a delegation
    # token, which may not ask for tokens itself (Kafka's allowTokenRequests).
    sasl_principal: str | None = None
    token_authenticated: bool = False
    # Set when the listener closes: a waiting Fetch answers at once.
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    # The process's controller mutation quota, shared with the HTTP door.
    quota: MutationQuota = field(default_factory=lambda: MutationQuota(1e9))
    # The process's client-telemetry instances (KIP-714), shared by its connections.
    telemetry: Instances = field(default_factory=Instances)
    # The process's share sessions (KIP-932's ShareFetch sessions), shared by its connections.
    share_sessions: ShareSessions = field(default_factory=ShareSessions)
    # The cluster as this process sees it (`coordinator.cluster.view`): the brokers, who leads
    # each partition, who coordinates each group and transactional id.
    cluster: Cluster = field(default_factory=Cluster.alone)
    # The connection's next fetch, read while its last answer is on the way (`ReadAhead`).
    read_ahead: ReadAhead = field(default_factory=ReadAhead)
    # Called by a Produce handler once its batches are queued for appending: what the listener
    # reads of the connection next can no longer overtake them (see KafkaListener).
    queued: Callable[[], None] = lambda: None

    @property
    def as_member(self) -> tuple[str, str]:
        """The client id and host a group member of this connection is recorded with: at most
        the store's 255 characters each, and Kafka's "kafka" for a client that sent no id."""
        return self.client_id[:255] or "kafka", self.client_host[:255]

    def group_operations(self, group_id: str, asked: bool) -> int:
        """A described group's `authorized_operations`: what this client may do with it, when
        the request asked (Kafka's INT32_MIN when it did not)."""
        assert self.access is not None
        return self.access.group_operations(group_id) if asked else NOT_ASKED


Handler = Callable[[Client, Request], Awaitable[Any]]


def kafka_host(host: str) -> str:
    """A client's address as Kafka's broker shows it in group descriptions (Java's
    `InetAddress.toString()`: "/127.0.0.1"); the HTTP API shows the address alone."""
    return f"/{host}" if host and not host.startswith("/") else host
