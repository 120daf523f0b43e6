"""Limits a running service holds against a hostile peer (issue 21): the HTTP header block is
capped in the parser, before the headers are held; on `coordinator serve`, SQLite and Postgres."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.support import ServiceProcess, serve_on_fresh_store

pytestmark = pytest.mark.slow

MAX_HEADER_BYTES = 8192


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    yield from serve_on_fresh_store(
        request.param,
        tmp_path_factory.mktemp("limits"),
        "limits",
        COORDINATOR_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
    )


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


def test_a_header_block_under_the_cap_is_served(service: ServiceProcess) -> None:
    response = httpx.get(f"{service.url}/healthz", headers={"x-fine": "a" * 4000})
    assert response.status_code == 200
