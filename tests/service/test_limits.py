"""Limits a running service holds against a hostile peer (issue 21, items 3 and 7), on
`coordinator serve` with its Kafka listener, SQLite and Postgres: the HTTP header block is capped
in the parser, before the headers are held; connections per client address and idle connections
are bounded through both doors; a failed SASL authentication closes the connection; each refusal
is counted in the metrics."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
from collections.abc import Iterator

import httpx
import pytest

from tests.support.services import ServiceProcess, free_port, serve_on_fresh_store

pytestmark = pytest.mark.slow

MAX_HEADER_BYTES = 8192
MAX_CONNECTIONS = 4
IDLE_MS = 1000
ADMIN = {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]}
# How long a test waits for the service to close a connection it should close.
CLOSE_WITHIN_S = 20


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("limits")
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [ADMIN]}))
    running = serve_on_fresh_store(
        request.param,
        root,
        "limits",
        COORDINATOR_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        COORDINATOR_MAX_CONNECTIONS_PER_IP=str(MAX_CONNECTIONS),
        COORDINATOR_CONNECTIONS_MAX_IDLE_MS=str(IDLE_MS),
        COORDINATOR_AUTH_TOKENS_FILE=str(tokens),
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{free_port()}",
    )
    yield from running


def _kafka_port(service: ServiceProcess) -> int:
    return int(service.env["COORDINATOR_KAFKA_LISTENER"].rpartition(":")[2])


def _refusals(service: ServiceProcess, door: str, reason: str) -> float:
    text = httpx.get(
        f"{service.url}/metrics", headers={"Authorization": f"Bearer {ADMIN['token']}"}
    ).text
    line = f'coordinator_connection_refusals_total{{door="{door}",reason="{reason}"}}'
    for row in text.splitlines():
        if row.startswith(line):
            return float(row.split()[-1])
    return 0.0


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the service closes `sock` (reads end), waiting up to CLOSE_WITHIN_S."""
    sock.settimeout(CLOSE_WITHIN_S)
    try:
        while sock.recv(65536):
            pass
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return True


def _api_versions(sock: socket.socket, correlation: int = 1) -> bytes:
    """Send ApiVersions v0; the answer's bytes (empty when the connection closed)."""
    body = struct.pack(">hhih", 18, 0, correlation, 1) + b"t"
    sock.sendall(struct.pack(">i", len(body)) + body)
    sock.settimeout(CLOSE_WITHIN_S)
    try:
        return sock.recv(65536)
    except ConnectionError:
        return b""


def _raw_request(service: ServiceProcess, head: bytes) -> bytes:
    """Send a request head on a plain socket; what the service answered before closing."""
    answer = b""
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(head)
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 50_000 + b"\r\n\r\n",
            id="one-large-header",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"x-h: v\r\n" * 5_000 + b"\r\n",
            id="many-headers",
        ),
        pytest.param(b"GET /healthz?" + b"q" * 50_000 + b" HTTP/1.1\r\n\r\n", id="long-url"),
    ],
)
def test_a_header_block_over_the_cap_is_431_and_the_service_serves_on(
    service: ServiceProcess, head: bytes
) -> None:
    answer = _raw_request(service, head)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
    problem = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert problem["status"] == 431 and problem["code"] == "INVALID_REQUEST"
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_an_endless_header_is_refused_at_the_cap_not_when_the_peer_stops(
    service: ServiceProcess,
) -> None:
    """A peer that keeps sending one header value, never ending it (issue 37, item 3): the
    service answers 431 and closes once about the cap arrived, instead of holding what the peer
    sends until it stops (the parser keeps a header whole before it can be counted)."""
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-endless: ")
        chunk = b"a" * 4096
        with contextlib.suppress(ConnectionError):
            while sent < 32 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
                ready, _, _ = select.select([sock], [], [], 0)
                if ready:
                    break
        with contextlib.suppress(ConnectionError):
            while data := sock.recv(65536):
                answer += data
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:200]
    # The cap, one read of the service and what the sockets' buffers hold, not 32 MiB.
    assert sent < 4 * 1024 * 1024, sent
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_a_header_block_under_the_cap_is_served(service: ServiceProcess) -> None:
    response = httpx.get(f"{service.url}/healthz", headers={"x-fine": "a" * 4000})
    assert response.status_code == 200


def test_http_connections_past_the_per_address_limit_are_429_and_closed(
    service: ServiceProcess,
) -> None:
    before = _refusals(service, "http", "connection_limit")
    held = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        # Each held connection is served (so counted) before the next is opened.
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", service.port)) as extra:
            extra.settimeout(CLOSE_WITHIN_S)
            answer = extra.recv(65536)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:100]
            assert b"COORDINATOR_MAX_CONNECTIONS_PER_IP" in answer
            assert _closed_by_peer(extra)
    finally:
        for sock in held:
            sock.close()
    assert _refusals(service, "http", "connection_limit") == before + 1


def test_an_http_connection_that_never_finishes_its_request_is_closed(
    service: ServiceProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", service.port)) as stalled:
        stalled.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-half: ")
        assert _closed_by_peer(stalled)
    assert _refusals(service, "http", "idle") >= 1


def test_kafka_connections_past_the_per_address_limit_are_closed(service: ServiceProcess) -> None:
    port = _kafka_port(service)
    before = _refusals(service, "kafka", "connection_limit")
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:
            assert _api_versions(sock)  # served, so counted
        with socket.create_connection(("127.0.0.1", port)) as extra:
            assert _api_versions(extra) == b""
    finally:
        for sock in held:
            sock.close()
    assert _refusals(service, "kafka", "connection_limit") == before + 1
    # Once they are gone, the address may connect again.
    with socket.create_connection(("127.0.0.1", port)) as again:
        assert _api_versions(again)


def test_an_idle_kafka_connection_is_closed(service: ServiceProcess) -> None:
    with socket.create_connection(("127.0.0.1", _kafka_port(service))) as idle:
        assert _api_versions(idle)
        assert _closed_by_peer(idle)
    assert _refusals(service, "kafka", "idle") >= 1


def test_a_failed_sasl_authentication_is_answered_then_the_connection_closes(
    service: ServiceProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", _kafka_port(service))) as sock:
        handshake = struct.pack(">hhih", 17, 1, 1, 1) + b"t" + struct.pack(">h", 5) + b"PLAIN"
        sock.sendall(struct.pack(">i", len(handshake)) + handshake)
        assert sock.recv(65536)
        token = b"\0ops\0wrong-token"
        authenticate = struct.pack(">hhih", 36, 1, 2, 1) + b"t" + struct.pack(">i", len(token))
        sock.sendall(struct.pack(">i", len(authenticate + token)) + authenticate + token)
        answer = sock.recv(65536)
        # SaslAuthenticate v1: size, correlation id 2, then error code 58 (authentication failed).
        assert struct.unpack_from(">ih", answer, 4) == (2, 58)
        assert _closed_by_peer(sock)
    assert _refusals(service, "kafka", "authentication_failed") >= 1


def test_log_level_governs_the_service_own_loggers(service: ServiceProcess) -> None:
    # `serve --log-level` defaults to info: the listener's own INFO line is in the log (the
    # root logger alone would have kept only warnings).
    assert "Kafka protocol listener on 127.0.0.1" in service.log.read_text(errors="replace")
