"""Bugs the fault workload (tests/fault) found, each reduced to a minimal reproduction.

The long profile restarts Postgres under the services. While the server was refusing
connections, shutting down or starting up, requests were answered 500 `INTERNAL_ERROR` (which
docs/pages/http-api.md reserves for bugs) with a traceback in the log, instead of 503
`COORDINATOR_NOT_AVAILABLE`, the code for a store that is unreachable.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import httpx
import pytest

from coordinator.app import create_app
from coordinator.core.settings import Settings
from tests.support.services import free_port


async def get_topics(database_url: str) -> httpx.Response:
    app = create_app(Settings(database_url=database_url))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
            return await client.get("/v1/topics")
    finally:
        await app.state.db.dispose()


def assert_coordinator_not_available(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    problem = response.json()
    assert problem["code"] == "COORDINATOR_NOT_AVAILABLE", problem
    assert problem["retriable"] is True


def _pg_error(sqlstate: str, message: str) -> bytes:
    """A Postgres protocol ErrorResponse, as a server sends it instead of accepting a login."""
    fields = b"".join(
        kind + text.encode() + b"\0"
        for kind, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message))
    )
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


@pytest.fixture
async def postgres_refusing_logins() -> AsyncIterator[str]:
    """A server on a local port that speaks just enough of the Postgres protocol to say 57P03
    `cannot_connect_now`, what a real server says while it shuts down or starts up."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                length = struct.unpack("!I", await reader.readexactly(4))[0]
                payload = await reader.readexactly(length - 4)
                code = struct.unpack("!I", payload[:4])[0]
                if code == 80877103:  # SSLRequest: no TLS here; the client goes on in plain text
                    writer.write(b"N")
                    await writer.drain()
                    continue
                writer.write(_pg_error("57P03", "the database system is shutting down"))
                await writer.drain()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/coordinator"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_store_refusing_connections_is_coordinator_not_available() -> None:
    response = await get_topics(f"postgresql://postgres@127.0.0.1:{free_port()}/absent")
    assert_coordinator_not_available(response)


async def test_a_store_shutting_down_is_coordinator_not_available(
    postgres_refusing_logins: str,
) -> None:
    response = await get_topics(postgres_refusing_logins)
    assert_coordinator_not_available(response)
