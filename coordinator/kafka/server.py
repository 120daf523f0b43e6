"""The Kafka protocol listener: an asyncio server beside uvicorn in every service process.

Each connection is answered in order, as Kafka's broker answers it (the broker mutes a connection
until its answer is sent, and idempotent producers rely on that order). Where Kafka takes one
request at a time, a connection's Produce requests may be under way together
(COORDINATOR_KAFKA_PRODUCE_PIPELINE), each read once the one before is queued for appending, so
the group commit sees them in the order they were sent. With a tokens file a connection must
authenticate with SASL/PLAIN first (user = principal, password = token); until then only
ApiVersions and the SASL calls are answered. Handlers live by domain in
`coordinator.kafka.handlers`; they check access, translate and call the domain services.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from collections.abc import Callable

from prometheus_client import Histogram

from coordinator.cluster.brokers import advertised_host
from coordinator.cluster.placement import Broker
from coordinator.cluster.view import Cluster
from coordinator.core.auth import Access, Authenticator
from coordinator.core.errors import StoreUnavailable
from coordinator.core.memory import Overloaded, request_memory
from coordinator.core.metrics import KAFKA_LATENCY, record_refusal
from coordinator.core.quotas import MutationQuota
from coordinator.core.settings import Settings
from coordinator.kafka import versions, wire
from coordinator.kafka.connection import Client
from coordinator.kafka.handlers import HANDLERS
from coordinator.kafka.handlers.cluster import unsupported_api_versions
from coordinator.kafka.handlers.sasl import authenticate_raw
from coordinator.kafka.share_sessions import ShareSessions
from coordinator.kafka.wire import SUPPORTED, BadRequest
from coordinator.store import Store
from coordinator.telemetry.instances import Instances

log = logging.getLogger("coordinator.kafka")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_BEFORE_AUTH = {wire.API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}
# How long a closing listener lets requests under way finish before cancelling them.
_GRACE_S = 5.0
# At most one WARNING per this many seconds for closed connections (the rest are counted).
_WARN_EVERY_S = 1.0


class KafkaListener:
    def __init__(
        self,
        db: Store,
        settings: Settings,
        authenticator: Authenticator | None,
        quota: MutationQuota | None = None,
    ):
        assert settings.kafka_listener is not None
        self.db = db
        self.settings = settings
        self.authenticator = authenticator
        self.quota = quota or MutationQuota(settings.controller_mutation_rate)
        self.telemetry = Instances()
        self.share_sessions = ShareSessions(settings.share_max_sessions)
        host, _, port = settings.kafka_listener.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.port = int(port)
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closing = asyncio.Event()
        self._handlers = HANDLERS
        self._refusals = _Refusals()
        self._per_address: collections.Counter[str] = collections.Counter()
        self.cluster = Cluster.alone(settings.kafka_node_id or 0, self.host, self.port)
        self._heartbeats: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Every worker process binds the same address (SO_REUSEPORT); the kernel spreads
        # connections over them, as uvicorn's shared socket does for HTTP.
        tls = self.settings.server_tls()  # Kafka's SSL and SASL_SSL listeners
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            reuse_port=hasattr(socket, "SO_REUSEPORT"),
            ssl=tls,
        )
        if self.port == 0:  # an ephemeral port: the one the kernel gave
            self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "Kafka protocol listener on %s:%d%s", self.host, self.port, " (TLS)" if tls else ""
        )
        await self._join()

    async def _join(self) -> None:
        """Register as a broker of the store's cluster, and keep its lease (`cluster.view`)."""
        settings = self.settings
        advertised = settings.kafka_advertised_listener
        if advertised is not None:
            host, _, port = advertised.rpartition(":")
            me = Broker(-1, host.strip("[]"), int(port))
        else:
            me = Broker(-1, advertised_host(self.host), self.port)
        self.cluster = Cluster(me, advertised=advertised is not None)
        lease = settings.kafka_broker_session_timeout_ms
        await self.cluster.join(self.db, settings.kafka_node_id, settings.kafka_broker_rack, lease)
        log.info("Kafka broker %d of the store's cluster", self.cluster.me.broker_id)
        self._heartbeats = asyncio.create_task(
            self.cluster.keep(self.db, lease, settings.kafka_broker_heartbeat_interval_ms),
            name="kafka-broker-heartbeat",
        )

    async def close(self) -> None:
        """Stop accepting, end idle connections, and let requests under way finish (a waiting
        Fetch answers at once), so no database work is cancelled halfway; cancel what is still
        running after `_GRACE_S`."""
        if self._server is not None:
            self._server.close()
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
            await self.cluster.leave(self.db)
        self._closing.set()
        for writer in self._connections.values():
            writer.close()  # a connection waiting for its next request reads EOF and ends
        if self._connections:
            _, pending = await asyncio.wait(list(self._connections), timeout=_GRACE_S)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        local = writer.get_extra_info("sockname") or (self.host, self.port)
        peer = writer.get_extra_info("peername") or ("", 0)
        client = Client(
            self.db,
            self.settings,
            self.authenticator,
            host=str(local[0]),
            port=int(local[1]),
            client_host=str(peer[0]),
            client_port=int(peer[1]),
            access=Access(None) if self.authenticator is None else None,
            closing=self._closing,
            quota=self.quota,
            telemetry=self.telemetry,
            share_sessions=self.share_sessions,
            cluster=self.cluster,
        )
        self._per_address[client.client_host] += 1
        idle_s = self.settings.connections_max_idle_ms / 1000
        # Produce requests under way, oldest first: their answers are written in this order.
        pipeline: collections.deque[asyncio.Task[Answer | None]] = collections.deque()
        try:
            if self._per_address[client.client_host] > self.settings.max_connections_per_ip:
                raise BadRequest(
                    f"{self.settings.max_connections_per_ip} connections from this address "
                    "already (COORDINATOR_MAX_CONNECTIONS_PER_IP)",
                    "connection_limit",
                )
            while True:
                # Before authentication a frame is held to SASL's small limit (Kafka's
                # sasl.server.max.receive.size), after it to socket.request.max.bytes.
                limit = (
                    self.settings.kafka_socket_request_max_bytes
                    if client.access is not None
                    else self.settings.kafka_sasl_max_receive_size
                )
                # A connection silent this long, between requests or inside one, is closed
                # (a deadline on the read, not a task per read as wait_for would make).
                async with asyncio.timeout(idle_s):
                    prefix = await self._next_prefix(reader, writer, pipeline)
                size = wire.read_frame_size(prefix, limit)
                # The frame is held until it is answered: reserved from the process's request
                # memory before it is read (Kafka's queued.max.request.bytes), so concurrent
                # large requests are read in turn; its bytes wait in the socket meanwhile.
                release = await request_memory().hold(size)
                try:
                    async with asyncio.timeout(idle_s):
                        frame = await reader.readexactly(size)
                    if self._pipelined(client, frame):
                        queued = self._start(client, frame, release, pipeline)
                        release = _nothing  # the request's task holds the memory now
                        try:
                            await queued
                        finally:
                            client.queued = _nothing
                        while len(pipeline) >= self.settings.kafka_produce_pipeline:
                            await self._write_answers(writer, pipeline)
                        continue
                    while pipeline:  # any other request comes after the answers before it
                        await self._write_answers(writer, pipeline)
                    answer = await self._answer(client, frame)
                finally:
                    release()
                if client.failed_authentication:
                    # Kafka's connection.failed.authentication.delay.ms: the failure is told
                    # late, then the connection closes, so guessing credentials is slow.
                    await asyncio.sleep(
                        self.settings.connection_failed_authentication_delay_ms / 1000
                    )
                if writer.is_closing():
                    break  # the listener closed the connection while the request ran
                if answer is not None:
                    _write(writer, [answer])
                    await writer.drain()
                if client.failed_authentication:
                    raise BadRequest("SASL authentication failed", "authentication_failed")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except TimeoutError:
            record_refusal("kafka", "idle")
            log.info("closing the idle Kafka connection of %s", client.client_host)
        except asyncio.CancelledError:
            # The listener is closing: the connection just ends (not an error to report).
            pass
        except BadRequest as exc:
            record_refusal("kafka", exc.reason)
            self._refusals.warn(client, exc)
            if exc.reason == "authentication_failed" and not client.failed_authentication:
                # A bare SASL frame (handshake v0) that failed: closed after the same delay.
                delay = self.settings.connection_failed_authentication_delay_ms / 1000
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(delay)
        except Overloaded as exc:
            # Waited as long as a request may for the request memory: the client reconnects
            # and sends it again.
            record_refusal("kafka", "overloaded")
            log.info("closing the Kafka connection of %s: %s", client.client_host, exc)
        except StoreUnavailable as exc:
            # A call with no per-item error to carry it (an all-topics Metadata): the client
            # reconnects and retries; the outage itself is logged once by the store.
            record_refusal("kafka", "store_unavailable")
            log.info("closing the Kafka connection of %s: %s", client.client_host, exc)
        except Exception:
            # A bug: nothing is answered for the request (the client sees the connection close
            # and retries); it is logged so it gets fixed.
            log.exception(
                "Kafka request from %s failed (%s)", client.client_host, client.last_request
            )
        finally:
            client.read_ahead.close()
            if pipeline:
                # Requests under way finish unanswered (their appends stand, as those of a
                # request whose answer is lost); cancelled if the listener cancels this.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*pipeline, return_exceptions=True)
            self._per_address[client.client_host] -= 1
            if not self._per_address[client.client_host]:
                del self._per_address[client.client_host]
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _pipelined(self, client: Client, frame: bytes) -> bool:
        """A Produce of an authenticated connection, which may be under way beside the ones
        before it: the group commit keeps the order they were queued in, which is the order
        they were read in (`_start`)."""
        if self.settings.kafka_produce_pipeline == 1 or client.access is None or client.raw_sasl:
            return False
        # A version not served is refused by `_answer`, in the request's task: the connection
        # closes once the answers before it are written, as it would without a pipeline.
        return wire.peek_header(frame)[0] == wire.PRODUCE

    def _start(
        self,
        client: Client,
        frame: bytes,
        release: Callable[[], None],
        pipeline: collections.deque[asyncio.Task[Answer | None]],
    ) -> asyncio.Future[None]:
        """Start answering the Produce in `frame` in a task of its own, which holds the
        request's memory until answered (`release`). The future returned is done once its
        batches are queued for appending, or it is answered: the next request read from the
        connection cannot overtake it then."""
        queued: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def mark(*_: object) -> None:
            if not queued.done():
                queued.set_result(None)

        client.queued = mark
        task = asyncio.create_task(self._answer(client, frame))
        task.add_done_callback(lambda _: release())  # a task cancelled before it ran too
        task.add_done_callback(mark)
        pipeline.append(task)
        return queued

    async def _next_prefix(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pipeline: collections.deque[asyncio.Task[Answer | None]],
    ) -> bytes:
        """The next frame's size prefix, while the answers of the requests under way are
        written as they come, in order (the client may wait for them before it sends more)."""
        if not pipeline:
            return await reader.readexactly(4)
        read = asyncio.ensure_future(reader.readexactly(4))
        try:
            while True:
                if pipeline and pipeline[0].done():
                    await self._write_answers(writer, pipeline)
                if read.done() or not pipeline:
                    return await read
                await asyncio.wait((read, pipeline[0]), return_when=asyncio.FIRST_COMPLETED)
        finally:
            read.cancel()  # only on the way out with an error: a prefix not read stays buffered

    async def _write_answers(
        self, writer: asyncio.StreamWriter, pipeline: collections.deque[asyncio.Task[Answer | None]]
    ) -> None:
        """Write the answers of the oldest requests under way, in order and in one write: the
        oldest's once it has one, and those of the requests after it that have theirs (the
        requests of one group commit are answered together). A request that failed ends the
        connection once the answers before it are written, as it would alone."""
        await asyncio.wait((pipeline[0],))
        answers = []
        while pipeline and pipeline[0].done() and pipeline[0].exception() is None:
            answer = pipeline.popleft().result()
            if answer is not None:
                answers.append(answer)
        if answers:
            if writer.is_closing():
                raise ConnectionResetError("the listener closed the connection")
            _write(writer, answers)
            await writer.drain()
        if pipeline and pipeline[0].done():
            pipeline[0].result()  # raises its error

    async def _answer(self, client: Client, frame: bytes) -> Answer | None:
        if client.raw_sasl:
            return await authenticate_raw(client, frame)
        api_key, version, correlation_id = wire.peek_header(frame)
        client.last_request = f"API key {api_key} version {version}"
        served = SUPPORTED.get(api_key)
        if served is None or not served[0] <= version <= served[1]:
            if api_key == wire.API_VERSIONS:
                # Kafka answers an ApiVersions it does not know in version 0, with the error and
                # its versions, so the client can pick one it shares.
                return wire.encode(correlation_id, unsupported_api_versions())
            raise BadRequest(f"API key {api_key} version {version} is not served", "unsupported")
        if client.access is None and api_key not in _BEFORE_AUTH:
            raise BadRequest(f"API key {api_key} before SASL authentication", "unauthenticated")
        started = time.perf_counter()
        request = wire.decode(frame)
        client.client_id = request.client_id
        response = await self._handlers[api_key](client, request)
        answer: Answer | None
        if response is None:  # Produce with acks=0
            answer = None
        elif isinstance(response, wire.WithRecords):
            adapted = versions.for_version(api_key, version, response.response)
            answer = wire.encode_parts(correlation_id, adapted, response.spliced)
        else:
            answer = wire.encode(correlation_id, versions.for_version(api_key, version, response))
        _latency(api_key, request).observe(time.perf_counter() - started)
        return answer


def _nothing() -> None:
    pass


_LATENCIES: dict[int, Histogram] = {}


def _latency(api_key: int, request: wire.Request) -> Histogram:
    """The API's child of `coordinator_kafka_request_duration_seconds`, labelled with Kafka's
    name for it (ProduceRequest: Produce)."""
    child = _LATENCIES.get(api_key)
    if child is None:
        api = type(request.body).__name__.removesuffix("Request")
        child = _LATENCIES[api_key] = KAFKA_LATENCY.labels(api=api)
    return child


# A request's answer: its frame, or its frame's pieces (a Fetch's batches, as they are stored).
Answer = bytes | list[bytes | memoryview]


def _write(writer: asyncio.StreamWriter, answers: list[Answer]) -> None:
    """The answers in one write, their pieces as they are (never joined here)."""
    pieces: list[bytes | memoryview] = []
    for answer in answers:
        if isinstance(answer, bytes):
            pieces.append(answer)
        else:
            pieces += answer
    writer.writelines(pieces)


class _Refusals:
    """A closed connection is logged at WARNING with the peer, what it asked and why, at most
    once per `_WARN_EVERY_S` (a client in a reconnect loop, or a scanner, would flood the log);
    the ones left out are counted in the next line. Every one is counted in the metrics."""

    def __init__(self) -> None:
        self._last = -_WARN_EVERY_S
        self._untold = 0

    def warn(self, client: Client, refusal: BadRequest) -> None:
        now = time.monotonic()
        if now - self._last < _WARN_EVERY_S:
            self._untold += 1
            return
        untold, self._untold, self._last = self._untold, 0, now
        log.warning(
            "closed the Kafka connection of %s (client id %r, last request %s): %s%s",
            client.client_host,
            client.client_id,
            client.last_request or "none",
            refusal,
            f" ({untold} more closed since the last report)" if untold else "",
        )
